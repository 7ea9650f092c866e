"""`taskrl train-from-store`: real samples of a tiny model, logged with feedback, train a LoRA adapter."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from taskrl.cli import app
from taskrl.deploy.store import Feedback, Interaction, InteractionStore
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.types import Message


@pytest.mark.parametrize("command", [["train-from-store", "{url}"], ["train", "--from-store", "{url}"]])
def test_train_from_store_writes_an_adapter(tmp_path: Path, command: list[str]) -> None:
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(tmp_path / "base"))
    tokenizer.save_pretrained(str(tmp_path / "base"))
    policy = HFPolicy(model, tokenizer, device="cpu")
    prompt = policy.chat_format.prompt_ids([Message("user", "hi")], None)

    async def sample() -> list:
        params = [SamplingParams(max_new_tokens=4, seed=i) for i in range(8)]
        return await asyncio.gather(*(policy.generate(token_ids=prompt, sampling=p) for p in params))

    completions = asyncio.run(sample())
    policy.close()
    url = f"sqlite:///{tmp_path / 's.db'}"
    with InteractionStore(url) as store:
        for i, completion in enumerate(completions):
            row = Interaction(
                "t", f"s{i}", "m", 0, {"messages": [{"role": "user", "content": "hi"}]}, {"message": {}},
                completion.token_ids, completion.logprobs, prompt, id=f"int_{i}",
            )  # fmt: skip
            store.add_sync("interactions", row)
            store.add_sync("feedback", Feedback(row.id, "t", "accepted" if i % 2 else "rejected"))
    overrides = [f"model='{tmp_path / 'base'}'", "steps=1", "lora.rank=4", f"run_dir='{tmp_path / 'run'}'"]
    overrides += ["device='cpu'", "rollout.group_size=8"]
    args = [part.format(url=url) for part in command]
    for item in overrides:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "8 interactions" in result.output or "updates from" in result.output
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").is_file()


def test_cycle_command_serves_and_runs_its_cycles(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(tmp_path / "base"))
    tokenizer.save_pretrained(str(tmp_path / "base"))
    args = ["cycle", "--set", f"model='{tmp_path / 'base'}'", "--set", "device='cpu'", "--set", "env='shop'"]
    args += ["--store", f"sqlite:///{tmp_path / 's.db'}", "--cycles", "1", "--cycle-s", "0.1", "--port", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "cycle 0: waiting" in result.output  # no traffic yet: nothing to train on, nothing deployed
