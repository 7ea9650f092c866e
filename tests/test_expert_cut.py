"""Issue 38 item 6: an expert's tool call cut by max_new_tokens ends the episode as truncated
(``info.truncation``), shows in ``charts/cut_by_max_new_tokens`` and, in SFT warm-up, raises an alert that says
to raise max_new_tokens (it used to train on '...</tool_call' without a word)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from taskrl.chat import ChatFormat
from taskrl.env import make
from taskrl.policies.base import SamplingParams
from taskrl.policies.models import smollm2_tokenizer, tiny_model
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.scoring import batch_metrics
from taskrl.training.config import load_config
from taskrl.training.trainer import train


def test_a_cut_tool_call_truncates_the_episode() -> None:
    env = make("price")
    expert = ScriptedPolicy(env.scripted_rule, chat_format=ChatFormat(smollm2_tokenizer()))
    config = RolloutConfig(sampling=SamplingParams(max_new_tokens=10))
    [traj] = asyncio.run(run_episodes(lambda: make("price"), expert, env.tasks()[:1], config))
    assert traj.truncated and not traj.terminated and traj.info["truncation"] == "max_new_tokens"
    assert traj.metrics["turns"] == 1 and traj.metrics["invalid_tool_calls"] == 1 and traj.reward == 0.0
    assert batch_metrics([traj])["charts/cut_by_max_new_tokens"] == 1.0
    config = RolloutConfig(sampling=SamplingParams(max_new_tokens=64))
    [whole] = asyncio.run(run_episodes(lambda: make("price"), expert, env.tasks()[:1], config))
    assert whole.info.get("truncation") is None and whole.reward == 1.0


def test_sft_on_cut_expert_calls_warns(tmp_path: Path, capsys) -> None:
    base = tmp_path / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(base))
    tokenizer.save_pretrained(str(base))
    run = tmp_path / "run"
    train(load_config(None, ['env="price"', 'algo.name="sft"', "steps=1", "rollout.tasks_per_step=2",
                             "rollout.max_new_tokens=10",
                             "progress=false", f'model="{base}"', f'run_dir="{run}"']))  # fmt: skip
    alerts = [json.loads(line) for line in (run / "alerts.jsonl").read_text().splitlines()]
    [cut] = [a for a in alerts if a["monitor"] == "expert_cut"]
    assert cut["value"] == 2.0 and "raise max_new_tokens" in cut["message"]
    assert "the expert's turn was cut by max_new_tokens=10" in " ".join(capsys.readouterr().out.split())
