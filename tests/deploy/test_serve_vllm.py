"""``taskrl serve --backend vllm``: the gateway (store, keys, router) in front of the session's real vLLM server
(tests/conftest.py). vLLM samples; the stored tokens are exactly vLLM's; a canary version is a LoRA adapter loaded
into vLLM, and a rollback sends sessions back to the base model."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from typer.testing import CliRunner

from taskrl.deploy.config import ServeConfig
from taskrl.deploy.router import RouterConfig
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.base import SamplingParams
from taskrl.policies.vllm_server import VLLMServer
from taskrl.training.vllm_rollout import chat_format_of, vllm_policy
from taskrl.types import Message

ADMIN = {"Authorization": "Bearer admin"}
BODY = {"model": "smol", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8,
        "temperature": 0}  # fmt: skip


def save_random_adapter(path: Path) -> None:
    """A LoRA adapter on SmolLM2 whose B matrices are random, so it visibly changes greedy outputs."""
    from peft import LoraConfig, get_peft_model

    from taskrl.policies.models import load_smollm2

    model, _ = load_smollm2()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(copy.deepcopy(model), lora)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(str(path))


def _chat(base_url: str, session: str) -> dict[str, Any]:
    response = httpx.post(f"{base_url}/chat/completions", json=BODY, timeout=300,
                          headers={"Authorization": "Bearer k", "x-session-id": session})  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


async def test_gateway_serves_vllm_with_exact_tokens_canary_and_rollback(
    tmp_path: Path, vllm_server: VLLMServer
) -> None:
    save_random_adapter(tmp_path / "adapter")
    policy = vllm_policy(vllm_server.base_url, vllm_server.served_model, chat_format_of("smollm2"),
                         max_positions=vllm_server.max_model_len, max_staleness=0)  # fmt: skip
    config = ServeConfig(api_keys={"k": "t"}, admin_keys=("admin",), adapter_root=str(tmp_path),
                         router=RouterConfig(holdout=0.0, stages=(1.0,)))  # fmt: skip
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        app = create_app({"smol": policy}, store=store, config=config)
        with running_server(app) as base_url:
            assert httpx.post(f"{base_url}/chat/completions", json=BODY, timeout=60).status_code == 401
            base_reply = _chat(base_url, "s1")
            load = {"lora_name": "smol-canary", "lora_path": str(tmp_path / "adapter"), "model": "smol",
                    "rollout": "canary"}  # fmt: skip
            loaded = httpx.post(f"{base_url}/load_lora_adapter", json=load, headers=ADMIN, timeout=300)
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["version"] == 1 and loaded.json()["router"]["candidate"] == 1
            served = {m["id"] for m in httpx.get(f"{vllm_server.base_url}/models", timeout=30).json()["data"]}
            assert "smol-canary" in served  # the canary is an adapter inside vLLM
            canary_reply = _chat(base_url, "s2")
            rolled = httpx.post(f"{base_url}/router/smol", json={"action": "rollback"}, headers=ADMIN, timeout=30)
            assert rolled.status_code == 200 and rolled.json()["candidate"] is None
            after_reply = _chat(base_url, "s3")
            missing = {**load, "lora_name": "smol-bad", "lora_path": str(tmp_path / "missing")}
            refused = httpx.post(f"{base_url}/load_lora_adapter", json=missing, headers=ADMIN, timeout=300)
            assert refused.status_code == 502 and "smol-bad" in refused.text  # refused by name; the base serves
            assert _chat(base_url, "s4")["choices"][0]["message"] == base_reply["choices"][0]["message"]
        rows = {row.id: row for row in store.interactions()}
    base, canary, after = rows[base_reply["id"]], rows[canary_reply["id"]], rows[after_reply["id"]]
    assert (base.policy_version, canary.policy_version, after.policy_version) == (0, 1, 0)
    # The stored tokens are exactly what vLLM samples for the gateway's own rendering of the chat.
    prompt = policy.chat_format.prompt_ids([Message("user", "Name a colour.")], None)
    direct = await policy.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=8, temperature=0))
    await policy.aclose()
    assert base.prompt_token_ids == prompt and base.completion_token_ids == direct.token_ids
    assert after.completion_token_ids == base.completion_token_ids
    assert canary.completion_token_ids != base.completion_token_ids or pytest.fail("the adapter changed nothing")


def test_serve_backend_vllm_refuses_bad_settings_by_flag() -> None:
    from taskrl.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--backend", "vllm", "--vllm", "threads=all", "--store", "sqlite:///:memory:"])
    assert result.exit_code != 0 and "threads must name CPU cores" in result.output
    result = runner.invoke(app, ["serve", "--backend", "vllm", "--policy", "openai"])
    assert result.exit_code != 0 and "cannot go with --backend vllm" in result.output
    result = runner.invoke(app, ["serve", "--backend", "sglang"])
    assert result.exit_code != 0 and "--backend must be taskrl or vllm" in result.output
