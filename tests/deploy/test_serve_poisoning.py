"""Issue 16, High: one tenant can neither poison training nor fail other tenants' requests.

A real ``HFPolicy`` (tiny random model) behind a real server on loopback, spoken to with the openai client.
The attacks are the ones reported: ``temperature=1e-40`` (logits/T overflow -> NaN logprobs -> a NaN adapter
that hot-loads), ``seed=2**64`` raised inside the shared decode batch, and the rest of the poisoning chain.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from typer.testing import CliRunner

from taskrl.cli import app as cli_app
from taskrl.deploy.config import ServeConfig
from taskrl.deploy.dataset import trajectories_from_store
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import Feedback, Interaction, InteractionStore, StoreError
from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.types import Message

KEYS = {"key-good": "good", "key-evil": "evil"}


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_model(seed=0)


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **fields}


def test_tiny_temperature_is_greedy_and_never_stores_nan(tiny: tuple[Any, Any], store_url: str) -> None:
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, device="cpu")
    with InteractionStore(store_url) as store:  # SQLite and PostgreSQL
        with running_server(create_app({"tiny": policy}, store=store, config=ServeConfig(api_keys=KEYS))) as url:
            oa = openai.OpenAI(base_url=url, api_key="key-evil", max_retries=0, timeout=60)
            tiny_t = oa.chat.completions.create(**chat_body(temperature=1e-40, logprobs=True))
            greedy = oa.chat.completions.create(**chat_body(temperature=0, logprobs=True))
            for field, value in (("temperature", 2.5), ("temperature", -0.1), ("seed", 2**64), ("seed", -(2**63) - 1)):
                with pytest.raises(openai.BadRequestError) as refused:
                    oa.chat.completions.create(**chat_body(**{field: value}))
                assert refused.value.status_code == 400 and refused.value.body["param"] == field
            widest = oa.chat.completions.create(**chat_body(seed=2**64 - 1, temperature=1.0))
            # JSON's non-standard NaN literal is refused too (Python's json module would accept it)
            headers = {"Authorization": "Bearer key-evil", "Content-Type": "application/json"}
            raw = httpx.post(url + "/chat/completions", content=json.dumps(chat_body(temperature=math.nan)),
                             headers=headers)  # fmt: skip
            assert raw.status_code == 400 and raw.json()["error"]["param"] == "temperature"
        rows = store.interactions()
    assert tiny_t.choices[0].message.content == greedy.choices[0].message.content  # served greedy
    assert all(math.isfinite(e.logprob) for e in tiny_t.choices[0].logprobs.content)
    assert widest.choices[0].finish_reason in ("stop", "length")
    assert len(rows) == 3 and all(math.isfinite(x) for r in rows for x in r.logprobs)
    assert rows[0].sampling["temperature"] == 0.0 and rows[2].sampling["seed"] == (2**64 - 1) % 2**63


async def test_a_poisoned_request_cannot_fail_another_tenants_batch(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, device="cpu",
                      engine_config=EngineConfig(batch_wait_s=0.05))  # wide window: all join one batch
    poisons = [
        {"seed": 2**64}, {"seed": 2**70}, {"temperature": 1e-40}, {"temperature": 1e30}, {"top_p": 0.0},
        {"top_k": -5}, {"max_tokens": 0}, {"max_tokens": 10**9}, {"logit_bias": {"1": 100}},
        {"messages": [{"role": "user", "content": "x " * 3000}]},  # longer than the 2048-token context
    ]  # fmt: skip
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}", sqlite_synchronous="NORMAL") as store:
        app = create_app({"tiny": policy}, store=store, config=ServeConfig(api_keys=KEYS))
        with running_server(app) as url:
            good = openai.AsyncOpenAI(base_url=url, api_key="key-good", max_retries=0, timeout=120)
            evil = openai.AsyncOpenAI(base_url=url, api_key="key-evil", max_retries=0, timeout=120)
            good_calls = [good.chat.completions.create(**chat_body(seed=i, temperature=1.0)) for i in range(18)]
            evil_calls = [evil.chat.completions.create(**chat_body(), extra_body=p) for p in poisons]
            results = await asyncio.gather(*good_calls, *evil_calls, return_exceptions=True)
        rows = store.interactions()
    good_results, evil_results = results[:18], results[18:]
    assert all(isinstance(r, openai.types.chat.ChatCompletion) for r in good_results), good_results
    for poison, result in zip(poisons, evil_results, strict=True):
        if poison == {"temperature": 1e-40}:
            assert isinstance(result, openai.types.chat.ChatCompletion)  # served, greedily
            continue
        assert isinstance(result, openai.BadRequestError), (poison, result)
        assert result.body["param"] is not None
    assert {r.tenant for r in rows} == {"good", "evil"} and sum(r.tenant == "good" for r in rows) == 18
    assert all(math.isfinite(x) for r in rows for x in r.logprobs)


def nan_logprob_row(prompt: list[int], i: int) -> Interaction:
    return Interaction(
        "evil", f"s{i}", "m", 0, {"messages": [{"role": "user", "content": "hi"}], "temperature": 1.0},
        {"message": {"content": "x"}}, [5, 6], [float("nan"), -1.0], prompt, id=f"int_nan_{i}",
    )  # fmt: skip


def test_a_non_finite_row_never_reaches_training_on_either_store(store_url: str) -> None:
    """SQLite stores a NaN row written behind the server's back and the dataset skips it; PostgreSQL's JSON type
    refuses it at write (that row alone fails, named); on both only the finite row becomes a trajectory."""
    finite = Interaction("good", "g", "m", 0, {"messages": [{"role": "user", "content": "hi"}]},
                         {"message": {"content": "x"}}, [5, 6], [-1.0, -1.0], [1, 2], id="int_finite")  # fmt: skip
    with InteractionStore(store_url) as store:
        try:
            store.add_sync("interactions", nan_logprob_row([1, 2], 0))
        except StoreError as exc:
            assert store_url.startswith("postgresql") and "int_nan_0" in str(exc)
        else:
            assert store_url.startswith("sqlite")
        store.add_sync("interactions", finite)
        for row in store.interactions():
            store.add_sync("feedback", Feedback(row.id, row.tenant, "accepted"))
        trajectories, stats = trajectories_from_store(store, group_by="none")
    assert [t.id for t in trajectories] == ["int_finite"] and stats.used == 1
    assert stats.non_finite == (1 if store_url.startswith("sqlite") else 0)


def test_poisoned_rows_are_skipped_and_training_writes_metrics(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    model, tokenizer = tiny
    model.save_pretrained(str(tmp_path / "base"))
    tokenizer.save_pretrained(str(tmp_path / "base"))
    policy = HFPolicy(model, tokenizer, device="cpu")
    prompt = policy.chat_format.prompt_ids([Message("user", "hi")], None)
    completion_ids = [7, 8, 9]
    good_logprobs = policy.logprobs_of(prompt + completion_ids)[len(prompt) :]
    policy.close()
    url = f"sqlite:///{tmp_path / 's.db'}"
    with InteractionStore(url) as store:
        rows = [nan_logprob_row(prompt, i) for i in range(2)]
        rows.append(Interaction("evil", "s9", "m", 0, {"messages": "not a list of messages"}, {"message": {}},
                                [1, 2], [-0.5, -0.5], prompt, id="int_malformed"))  # fmt: skip
        rows.append(Interaction("evil", "s8", "m", 0, {"messages": []}, {"message": {}}, [1, -2], [-0.5, 3.0],
                                prompt, id="int_bad_ids"))  # fmt: skip
        for i in range(4):
            rows.append(Interaction("good", f"g{i}", "m", 0, {"messages": [{"role": "user", "content": "hi"}]},
                                    {"message": {"content": "ok"}}, completion_ids, good_logprobs, prompt,
                                    id=f"int_good_{i}"))  # fmt: skip
        for row in rows:
            store.add_sync("interactions", row)
            store.add_sync("feedback", Feedback(row.id, row.tenant, "accepted" if "good_0" in row.id else "rejected"))
        trajectories, stats = trajectories_from_store(store, group_by="none")
    assert (stats.non_finite, stats.malformed, stats.used) == (2, 2, 4)
    assert all(math.isfinite(x) for t in trajectories for s in t.segments for x in s.logprobs)
    run = tmp_path / "run"
    args = ["train-from-store", url, "--set", f"model='{tmp_path / 'base'}'", "--set", "steps=2", "--set",
            "lora.rank=4", "--set", f"run_dir='{run}'", "--set", "device='cpu'", "--set",
            "rollout.group_size=4"]  # fmt: skip
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and metrics[0]["data/non_finite"] == 2.0
    assert "store_rows" in (run / "alerts.jsonl").read_text()
    from safetensors.torch import load_file

    tensors = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    assert tensors and all(bool(torch.isfinite(t).all()) for t in tensors.values())


def test_a_nan_adapter_is_refused_and_a_nan_model_answers_500_unlogged(
    tiny: tuple[Any, Any], tmp_path: Path, store_url: str
) -> None:
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.fill_(float("nan"))
    peft_model.save_pretrained(str(tmp_path / "nan-adapter"))
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.get_output_embeddings().weight.fill_(float("nan"))  # every logit NaN: token 0, NaN logprob
    served = {"tiny": HFPolicy(model, tokenizer, device="cpu"), "broken": HFPolicy(broken, tokenizer, device="cpu")}
    config = ServeConfig(api_keys=KEYS, admin_keys=("admin",), adapter_root=str(tmp_path))
    with InteractionStore(store_url) as store:  # SQLite and PostgreSQL
        with running_server(create_app(served, store=store, config=config)) as url:
            load = {"lora_name": "poisoned", "lora_path": str(tmp_path / "nan-adapter"), "base_model": "tiny"}
            reply = httpx.post(url + "/load_lora_adapter", json=load, headers={"Authorization": "Bearer admin"},
                               timeout=60)  # fmt: skip
            assert reply.status_code == 400 and "non-finite" in reply.json()["error"]["message"]
            outside = {**load, "lora_path": "/etc"}
            reply = httpx.post(url + "/load_lora_adapter", json=outside, headers={"Authorization": "Bearer admin"})
            assert reply.status_code == 403 and reply.json()["error"]["code"] == "path_not_allowed"
            oa = openai.OpenAI(base_url=url, api_key="key-evil", max_retries=0, timeout=60)
            with pytest.raises(openai.InternalServerError) as failed:
                oa.chat.completions.create(**{**chat_body(logprobs=True), "model": "broken"})
            assert "non-finite" in failed.value.body["message"]
            assert "poisoned" not in [m.id for m in oa.models.list().data]
        assert store.count() == 0  # the garbage turn was never logged, so it can never be trained on


async def test_the_cycle_gate_refuses_a_poisoned_candidate(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    from taskrl.deploy.cycle import CycleConfig, ProductionCycle
    from taskrl.deploy.gate import GateConfig, gate_decision
    from taskrl.deploy.router import Router
    from taskrl.policies.base import SamplingParams
    from taskrl.training.config import config_from_dict
    from taskrl.training.learner import Learner
    from taskrl.training.model import prepare_model

    model, tokenizer = tiny
    served = HFPolicy(copy.deepcopy(model), tokenizer, device="cpu")
    train_config = config_from_dict({"run_dir": str(tmp_path / "run"), "algo.name": "grpo", "finetune": "full",
                                     "rollout.group_size": 2, "rollout.max_new_tokens": 4,
                                     "progress": False})  # fmt: skip
    learner = Learner(prepare_model(copy.deepcopy(model), train_config), train_config, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():  # what a poisoned update leaves behind
        next(learner.model.parameters()).fill_(float("nan"))

    async def suite(policy: Any) -> dict[str, list[float]]:
        ids = policy.chat_format.prompt_ids([Message("user", "hi")], None)
        outs = [await policy.generate(token_ids=ids, sampling=SamplingParams(max_new_tokens=3, seed=s)) for s in (1, 2)]
        return {"mean_logprob": [sum(c.logprobs) / len(c.logprobs) for c in outs]}

    prompt = served.chat_format.prompt_ids([Message("user", "hi")], None)
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}", sqlite_synchronous="NORMAL") as store:
        for i in range(2):
            completion = await served.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=3, seed=i))
            row = Interaction("good", f"s{i}", "agent", 0, {"messages": [{"role": "user", "content": "hi"}]},
                              {"message": {"content": completion.text}}, completion.token_ids, completion.logprobs,
                              prompt, id=f"int_{i}")  # fmt: skip
            store.add_sync("interactions", row)
            store.add_sync("feedback", Feedback(row.id, "good", "accepted" if i else "rejected"))
        router = Router("agent", served)
        config = CycleConfig(min_trajectories=2, max_staleness=0, rollout="activate", gate=GateConfig(n_boot=200))
        report = await ProductionCycle(learner, tokenizer, router, store, config, {"s": suite}).run_once()
        blocks = [d for d in store.decisions() if d.kind == "block"]
    assert report["outcome"] == "blocked" and "non-finite" in report["gate"]["reason"], report
    assert router.stable == 0 and len(router.versions) == 1 and blocks
    nan_scores = gate_decision({"reward": [1.0, 0.5, 0.7]}, {"reward": [float("nan"), 1.0, 1.0]})
    assert not nan_scores.promote and "non-finite" in nan_scores.reason
