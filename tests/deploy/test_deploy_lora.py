"""Adapter hot-load on a real HFPolicy (tiny random model): a new version mid-traffic, no request dropped."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from taskrl.deploy.config import ServeConfig
from taskrl.deploy.router import RouterConfig
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.types import Message


def save_adapter(model: Any, path: Path) -> Any:
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero (a no-op adapter); make it change the outputs
                param.normal_(0, 0.5)
    peft_model.save_pretrained(str(path))
    return peft_model.merge_and_unload()


async def test_hot_load_switches_versions_without_dropping_requests(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0)
    merged = save_adapter(model, tmp_path / "adapter")
    served = HFPolicy(model, tokenizer, device="cpu")
    # No holdout: with the default 5% share and a random salt, the "after" session would stay on version 0
    # in one run of twenty.
    config = ServeConfig(api_keys={"k": "t"}, admin_keys=("admin",), router=RouterConfig(holdout=0.0))
    errors: list[BaseException] = []
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0}
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}", sqlite_synchronous="NORMAL") as store:
        app = create_app({"tiny": served}, store=store, config=config)
        with running_server(app) as base_url:
            oa = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=60)
            stop = threading.Event()

            def traffic(worker: int) -> None:
                i = 0
                while not stop.is_set():
                    try:
                        oa.chat.completions.create(**body, extra_headers={"x-session-id": f"w{worker}-{i}"})
                    except BaseException as exc:  # noqa: BLE001 - any failure is what this test looks for
                        errors.append(exc)
                    i += 1

            threads = [threading.Thread(target=traffic, args=(w,)) for w in range(4)]
            for t in threads:
                t.start()
            load = {
                "lora_name": "tiny-v1",
                "lora_path": str(tmp_path / "adapter"),
                "model": "tiny",
                "rollout": "activate",
            }
            assert httpx.post(base_url + "/load_lora_adapter", json=load, timeout=60).status_code == 401
            response = httpx.post(
                base_url + "/load_lora_adapter", json=load, headers={"Authorization": "Bearer admin"}, timeout=60
            )
            assert response.status_code == 200, response.text
            assert response.json()["version"] == 1
            after = oa.chat.completions.create(**body, extra_headers={"x-session-id": "after"})
            stop.set()
            for t in threads:
                t.join(60)
            bad = httpx.post(
                base_url + "/load_lora_adapter",
                json={**load, "lora_name": "tiny-v2", "lora_path": str(tmp_path / "missing")},  # a used name is 409
                headers={"Authorization": "Bearer admin"},
                timeout=60,
            )
            assert bad.status_code == 400 and "cannot load LoRA adapter" in bad.json()["error"]["message"]
        rows = store.interactions()
    served.close()
    assert not errors
    assert {r.policy_version for r in rows} == {0, 1}
    new_row = next(r for r in rows if r.id == after.id)
    assert new_row.policy_version == 1
    # The new version is exactly base + adapter: the same greedy tokens as the merged model run directly.
    direct = HFPolicy(merged, tokenizer, device="cpu")
    prompt = direct.chat_format.prompt_ids([Message("user", "hello")], None)
    expected = await direct.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=6, temperature=0))
    direct.close()
    assert new_row.prompt_token_ids == prompt and new_row.completion_token_ids == expected.token_ids
    old_row = next(r for r in rows if r.policy_version == 0)
    assert old_row.completion_token_ids != new_row.completion_token_ids or pytest.fail("adapter changed nothing")
