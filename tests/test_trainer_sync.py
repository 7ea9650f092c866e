"""Weight sync into a separate rollout model (CopySync) and into a real taskrl server (ServerLoRASync), on a tiny
model: bit-identical copies, untouched until synced; adapters pushed over HTTP, versions on later samples."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from taskrl.deploy.config import ServeConfig
from taskrl.deploy.server import ServerThread, create_app
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.policies.openai import OpenAIPolicy
from taskrl.runlog import read_metrics, read_trajectories
from taskrl.training.config import ConfigError, TrainConfig, config_from_dict
from taskrl.training.model import is_peft
from taskrl.training.sync import CopySync, ServerLoRASync, connect_server
from taskrl.training.trainer import InProcessSync, Trainer
from taskrl.types import Message, Trajectory

ADMIN_KEY = "admin-secret"


def _config(tmp_path: Path, **changes: Any) -> TrainConfig:
    base = {"run_dir": str(tmp_path / "run"), "env": "price", "lora.rank": 4, "lr": 1e-2, "steps": 2,
            "rollout.tasks_per_step": 2, "rollout.group_size": 2, "rollout.max_turns": 1, "rollout.max_new_tokens": 8,
            "checkpoint_every": 1,
            "progress": False}  # fmt: skip
    return config_from_dict({**{**base, **changes}})


def spread(step: int, trajectories: list[Trajectory]) -> None:
    """A reward that differs inside every group, so every GRPO step updates (and makes a new version)."""
    for i, t in enumerate(trajectories):
        t.terms["spread"] = 0.25 * (i % 2)


def _ids(trainer: Trainer) -> torch.Tensor:
    prompt = trainer.learner_policy.chat_format.prompt_ids([Message("user", "What does the lamp cost?")])
    return torch.tensor([prompt])


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_copy_sync_is_bit_identical_and_only_moves_on_sync(tmp_path: Path, finetune: str) -> None:
    model, tokenizer = tiny_model(seed=0)
    trainer = Trainer(
        _config(tmp_path, **{"placement.rollout_policy": "copy"}, finetune=finetune, freeze=["embed"]),
        policy=HFPolicy(model, tokenizer, device="cpu"),
        score_fn=spread,
    )
    try:
        rollout, learner = trainer.policy, trainer.learner
        assert rollout is not trainer.learner_policy and rollout.model is not learner.model
        assert isinstance(trainer.weight_sync, CopySync) and is_peft(rollout.model) == (finetune == "lora")
        ids = _ids(trainer)
        before = _logits(rollout.model, ids)
        assert torch.equal(before, _logits(learner.model, ids))

        trajectories = trainer.collect(0)
        trainer.score(0, trajectories)
        learner.update(trajectories, step=0)
        assert learner.version == 1
        assert torch.equal(_logits(rollout.model, ids), before), "a learner update leaked into the rollout copy"
        assert not torch.equal(_logits(learner.model, ids), before)
        assert rollout.version == 0

        trainer.weight_sync(learner.version)
        assert rollout.version == 1
        assert torch.equal(_logits(rollout.model, ids), _logits(learner.model, ids))
        sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7)

        async def both() -> list[Any]:
            prompt = ids[0].tolist()
            return [await p.generate(token_ids=prompt, sampling=sampling) for p in (rollout, trainer.learner_policy)]

        copied, original = asyncio.run(both())
        assert copied.token_ids == original.token_ids and copied.logprobs == original.logprobs
        assert copied.policy_version == 1
    finally:
        trainer.close()


def test_in_process_sync_is_reexported_from_the_trainer() -> None:
    from taskrl.training.sync import InProcessSync as Moved

    assert InProcessSync is Moved


# -- a real taskrl server on loopback ------------------------------------------------------------
@pytest.fixture
def served_model(tmp_path: Path) -> Iterator[tuple[ServerThread, Path]]:
    """A tiny model saved to disk, and `taskrl serve`'s app serving it as "tiny" (admin key set, chat open)."""
    model_dir = tmp_path / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    served = HFPolicy.from_pretrained(model_dir, device="cpu")
    app = create_app({"tiny": served}, config=ServeConfig(admin_keys=(ADMIN_KEY,)))
    server = ServerThread(app)
    server.start()
    try:
        yield server, model_dir
    finally:
        server.stop()
        served.close()


def _server_config(tmp_path: Path, server: ServerThread, model_dir: Path, **changes: Any) -> TrainConfig:
    served = {"model": str(model_dir), "device": "cpu", "placement.rollout_policy": "server",
              "placement.rollout_url": server.base_url,
              "placement.rollout_model": "tiny"}  # fmt: skip
    return _config(tmp_path, **{**served, **changes})


def test_server_lora_sync_end_to_end(
    tmp_path: Path, served_model: tuple[ServerThread, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, model_dir = served_model
    monkeypatch.setenv("TASKRL_ROLLOUT_API_KEY", ADMIN_KEY)
    trainer = Trainer(_server_config(tmp_path, server, model_dir), score_fn=spread)
    try:
        assert isinstance(trainer.policy, OpenAIPolicy) and isinstance(trainer.weight_sync, ServerLoRASync)
        rows = trainer.train()
        assert [r["charts/sync_failed"] for r in rows] == [0.0, 0.0]
        assert [r["charts/policy_version"] for r in rows] == [1.0, 2.0]
        run = Path(trainer.config.run_dir)
        assert sorted(p.name for p in (run / "adapters").iterdir()) == ["v1", "v2"]
        assert (run / "adapters" / "v1" / "adapter_config.json").exists()
        served = httpx.get(server.base_url + "/models", trust_env=False).json()["data"]
        sync = trainer.weight_sync
        assert {m["id"] for m in served} == {"tiny", sync.adapter_name(1), sync.adapter_name(2)}
        assert trainer.policy.model == sync.adapter_name(2) and trainer.policy.version == 2

        # Samples drawn after the first sync carry version 1 (step 1 was sampled from the base, version 0).
        trajectories = read_trajectories(run)
        versions = {step: {s.policy_version for t in ts for s in t.segments} for step, ts in trajectories.items()}
        assert versions == {1: {0}, 2: {1}}
        assert all(s.num_sampled and len(s.logprobs) == len(s.token_ids) for t in trajectories[2] for s in t.segments)

        # The server's adapter v2 scores its own samples as the learner does.
        body = {"model": sync.adapter_name(2), "messages": [{"role": "user", "content": "What does the lamp cost?"}],
                "max_tokens": 8, "temperature": 1.0, "seed": 3, "logprobs": True,
                "return_token_ids": True}  # fmt: skip
        reply = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60, trust_env=False).json()
        sampled = reply["choices"][0]["token_ids"]
        served_logprobs = [entry["logprob"] for entry in reply["choices"][0]["logprobs"]["content"]]
        full = reply["prompt_token_ids"] + sampled
        learner_logprobs = trainer.learner_policy.logprobs_of(full)[-len(sampled) :]
        assert served_logprobs == pytest.approx(learner_logprobs, abs=1e-4)

        # Only the newest `keep` adapters stay loaded: the server does not grow by one model per update.
        sync.keep = 1
        sync(3)
        served = httpx.get(server.base_url + "/models", trust_env=False).json()["data"]
        assert {m["id"] for m in served} == {"tiny", sync.adapter_name(3)} and sync.loaded == [sync.adapter_name(3)]
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        for name in ("tiny", sync.adapter_name(1)):  # a base model is never unloaded; an unloaded adapter is gone
            reply = httpx.post(server.base_url + "/unload_lora_adapter", json={"lora_name": name}, headers=admin,
                               trust_env=False)  # fmt: skip
            assert reply.status_code == 404, reply.text
    finally:
        trainer.close()


def test_failed_push_keeps_the_step_and_retries(
    tmp_path: Path, served_model: tuple[ServerThread, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, model_dir = served_model
    monkeypatch.setenv("TASKRL_ROLLOUT_API_KEY", "not-the-admin-key")
    trainer = Trainer(_server_config(tmp_path, server, model_dir), score_fn=spread)
    try:
        (first,) = trainer.train(until=1)
        assert first["charts/sync_failed"] == 1.0 and first["charts/policy_version"] == 1.0
        assert trainer.policy.version == 0 and trainer.policy.model == "tiny"  # still the base, tagged 0
        run = Path(trainer.config.run_dir)
        assert (run / "checkpoints" / "latest").read_text() == "step_000001"  # the step is not lost
        (alert,) = [json.loads(line) for line in (run / "alerts.jsonl").read_text().splitlines()
                    if json.loads(line)["monitor"] == "weight_sync"]  # fmt: skip
        assert f"{server.base_url}/load_lora_adapter" in alert["message"] and "HTTP 401" in alert["message"]
        assert "\n" not in alert["message"]

        trainer.policy.api_key = trainer.weight_sync.api_key = ADMIN_KEY  # the operator fixes the key
        (second,) = trainer.train()
        assert second["charts/sync_failed"] == 0.0 and trainer.policy.version == 2
        assert second["charts/staleness_max"] == 1.0  # step 2 was still sampled from the base (version 0)
        assert [r["step"] for r in read_metrics(run)] == [1, 2]
    finally:
        trainer.close()


def test_resume_pushes_the_restored_adapter(
    tmp_path: Path, served_model: tuple[ServerThread, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, model_dir = served_model
    monkeypatch.setenv("TASKRL_ROLLOUT_API_KEY", ADMIN_KEY)
    config = _server_config(tmp_path, server, model_dir, steps=1)
    first = Trainer(config, score_fn=spread)
    first.train()
    first.close()
    resumed = Trainer(_server_config(tmp_path, server, model_dir, steps=2), score_fn=spread)
    try:
        assert resumed.policy.version == 0
        rows = resumed.train()
        assert len(rows) == 1 and rows[0]["charts/staleness_max"] == 0.0  # sampled from the restored version 1
        assert resumed.policy.version == 2
    finally:
        resumed.close()


def test_server_config_errors_name_the_field(tmp_path: Path, served_model: tuple[ServerThread, Path]) -> None:
    server, model_dir = served_model
    with pytest.raises(ConfigError, match="placement.rollout_policy must not be 'server' with finetune='full'"):
        _server_config(tmp_path, server, model_dir, finetune="full")
    with pytest.raises(ConfigError, match="placement.rollout_url must be the server's http"):
        _config(tmp_path, **{"placement.rollout_policy": "server"}, **{"placement.rollout_model": "tiny"})
    with pytest.raises(ConfigError, match="placement.rollout_model must name the served base model"):
        _config(tmp_path, **{"placement.rollout_policy": "server"}, **{"placement.rollout_url": server.base_url})
    with pytest.raises(ConfigError, match="placement.rollout_model: 'other' is not served at .* \\(served: tiny\\)"):
        connect_server(_server_config(tmp_path, server, model_dir, **{"placement.rollout_model": "other"}))
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with pytest.raises(ConfigError, match=f"placement.rollout_url: cannot reach {closed}/models"):
        Trainer(_config(tmp_path, model=str(model_dir), **{"placement.rollout_policy": "server"},
                        **{"placement.rollout_url": closed},
                        **{"placement.rollout_model": "tiny"}))  # fmt: skip
    assert not (tmp_path / "run" / "checkpoints").exists()
