"""Compaction strategies on one loop (``SummaryConfig.mode``): the agent's own summary (trainable), the harness's
prompted summary (a separate request to the same policy, outside the episode) and the harness's state dump; the
``prices`` env's one-lookup-per-turn setting they are compared on; and the ``summary`` option of the train and
eval configs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskrl.chat import ChatFormat
from taskrl.context import (
    HARNESS_SYSTEM,
    SummaryConfig,
    from_value,
    is_harness_request,
    is_summary_request,
    state_dump,
)
from taskrl.envs.prices import ONE_CALL_ERROR, PricesEnv, relookups
from taskrl.eval import EvalConfig, evaluate
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.training.config import ConfigError, config_from_dict
from taskrl.types import Message, Task, ToolCall, Trajectory

ITEMS = ["pear", "tea", "apple", "milk", "honey", "bread"]


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return ChatFormat(smollm2_tokenizer())


def task() -> Task:
    from taskrl.envs.builtin import PRICES

    return Task("six", f"List the prices of: {', '.join(ITEMS)}.",
                info={"items": ITEMS, "listing": ", ".join(f"{i}: {PRICES[i]}" for i in ITEMS)})  # fmt: skip


def opening_tokens(fmt: ChatFormat, env: PricesEnv) -> int:
    return len(fmt.prompt_ids(env.reset(task())[0], env.tools.schemas()))


async def play(fmt: ChatFormat, mode: str, extra: int = 60, **summary: Any) -> Trajectory:
    env = PricesEnv(one_call_per_turn=True)
    policy = ScriptedPolicy(env.scripted_rule, chat_format=fmt)
    config = SummaryConfig(trigger_tokens=opening_tokens(fmt, env) + extra, mode=mode, **summary)
    rollout = RolloutConfig(max_turns=16, max_context_tokens=2048, summary=config)
    return await run_episode(env, policy, task(), rollout, seed=1)


@pytest.mark.parametrize("mode", ["self", "prompted", "state_dump"])
async def test_every_mode_compacts_and_carries_the_early_prices(fmt: ChatFormat, mode: str) -> None:
    traj = await play(fmt, mode)
    records = traj.info["summaries"]
    assert traj.error is None and traj.rewards == {"items_right": 1.0} and traj.terminated
    assert len(records) >= 2 and all(r["mode"] == mode and r["summary_tokens"] > 0 for r in records)
    assert relookups(traj.messages) == 0  # the summaries carried every price: nothing was looked up twice
    assert traj.metrics["summary_tokens"] == sum(r["summary_tokens"] for r in records) / len(records)
    continuation = traj.messages[records[0]["message_index"]].content
    assert "pear: 4" in continuation.replace("$", "")  # the first lookup's price, in the first summary
    sampled = [sum(s.loss_mask) for s in traj.segments]
    requests = [m for m in traj.messages if is_summary_request([m])]
    if mode == "self":  # the agent's summaries are its own trainable tokens, after a forced request
        assert len(requests) == len(records)
        summary_ids = fmt.encode(records[0]["text"])
        first = traj.segments[0]
        assert first.token_ids[-records[0]["summary_tokens"] :][: len(summary_ids)] == summary_ids
    else:  # the harness's summaries are no part of the episode's tokens, and no request enters its messages
        assert not requests and not any(m.role == "system" and m.content == HARNESS_SYSTEM for m in traj.messages)
        turns = int(traj.metrics["turns"])
        assert sum(sampled) == traj.num_sampled_tokens and len(traj.segments) == len(records) + 1
        assert traj.num_sampled_tokens < sum(r["summary_tokens"] for r in records) + turns * 40


async def test_a_summary_that_drops_the_prices_shows_as_relookups(fmt: ChatFormat) -> None:
    # A request the expert does not recognise: it answers with a tool call, which the summary strips (empty).
    traj = await play(fmt, "self", prompt="Summarise.")
    assert traj.info["summaries"] and traj.info["summaries"][0]["text"] == ""
    assert relookups(traj.messages) >= 2  # the reward still pays (the lookups happened): re-lookups must be reported


async def test_one_call_per_turn_refuses_the_extra_calls() -> None:
    env = PricesEnv(one_call_per_turn=True)
    env.reset(task())
    results, *_ = await env.step([ToolCall("a", "lookup_price", {"item": "pear"}),
                                  ToolCall("b", "lookup_price", {"item": "tea"})])  # fmt: skip
    assert results[0].content == "pear: $4" and not results[0].is_error
    assert results[1].is_error and results[1].content == ONE_CALL_ERROR
    free = PricesEnv()
    free.reset(task())
    both, *_ = await free.step([ToolCall("a", "lookup_price", {"item": "pear"}),
                                ToolCall("b", "lookup_price", {"item": "tea"})])  # fmt: skip
    assert [r.content for r in both] == ["pear: $4", "tea: $6"]


def test_relookups_count_only_repeats_of_successful_lookups() -> None:
    def call(i: str, item: str) -> Message:
        return Message("assistant", "", tool_calls=[ToolCall(i, "lookup_price", {"item": item})])

    messages = [call("1", "pear"), Message("tool", "pear: $4", tool_call_id="1"),
                call("2", "kiwi"), Message("tool", "Unknown item 'kiwi'.", tool_call_id="2", is_error=True),
                call("3", "kiwi"), Message("tool", "Unknown item 'kiwi'.", tool_call_id="3", is_error=True),
                call("4", "pear"), Message("tool", "pear: $4", tool_call_id="4")]  # fmt: skip
    assert relookups(messages) == 1
    dump = state_dump(messages)
    assert "1. lookup_price(item='pear') -> pear: $4" in dump and "2. lookup_price(item='kiwi') -> error:" in dump


def test_the_expert_answers_the_harness_request() -> None:
    env = PricesEnv(one_call_per_turn=True)
    request = [Message("system", HARNESS_SYSTEM), Message("user", "TOOL lookup_price: pear: $4\nTOOL x: tea: $6")]
    assert is_harness_request(request) and env.scripted_rule(request, None) == "pear: 4, tea: 6"


def test_summary_option_of_the_eval_and_train_configs() -> None:
    config = EvalConfig(summary={"trigger_tokens": 300, "mode": "prompted"}, max_context_tokens=1024)
    assert config.rollout_config().summary == SummaryConfig(trigger_tokens=300, mode="prompted")
    assert EvalConfig().rollout_config().summary is None and from_value({}, "x") is None
    for bad, match in (({"trigger_tokens": 300, "mode": "x"}, "EvalConfig.summary: SummaryConfig.mode"),
                       ({"trigger": 300}, "EvalConfig.summary: unknown key"),
                       ({"mode": "self"}, "EvalConfig.summary needs trigger_tokens"),
                       ({"trigger_tokens": 5000}, "EvalConfig.summary.trigger_tokens")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            EvalConfig(summary=bad)
    assert config_from_dict({"rollout.summary": {"trigger_tokens": 300}}).rollout.summary == {"trigger_tokens": 300}
    for bad, match in (({"trigger_tokens": 300, "mode": "x"}, "rollout.summary: SummaryConfig.mode"),
                       ({"trigger_tokens": 4096}, "rollout.summary .*max_context_tokens"),
                       ("self", "rollout.summary must be a")):  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            config_from_dict({"rollout.summary": bad})


def test_evaluate_runs_with_a_summary(fmt: ChatFormat) -> None:
    env = PricesEnv(one_call_per_turn=True)
    policy = ScriptedPolicy(env.scripted_rule, chat_format=fmt)
    trigger = opening_tokens(fmt, env) + 60
    played: list[Trajectory] = []
    config = EvalConfig(samples_per_task=1, temperature=0.0, max_turns=16, max_context_tokens=2048,
                        summary={"trigger_tokens": trigger, "mode": "state_dump"})  # fmt: skip
    result = asyncio.run(evaluate(lambda: PricesEnv(one_call_per_turn=True), {"p": policy}, [task()], config,
                                  on_trajectory=lambda _, t: played.append(t)))  # fmt: skip
    assert result["policies"]["p"]["success_rate"]["value"] == 1.0 and played[0].metrics["compactions"] >= 2


def test_the_trainer_plays_its_episodes_with_the_configured_summary(tmp_path: Any) -> None:
    from taskrl.policies.hf import HFPolicy
    from taskrl.policies.models import tiny_model
    from taskrl.runlog import read_trajectories
    from taskrl.training.trainer import Trainer

    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu")
    kwargs = {"min_items": 5, "max_items": 6, "one_call_per_turn": True}
    config = config_from_dict({"run_dir": str(tmp_path / "run"), "env": "prices", "env_kwargs": kwargs,
                               "finetune": "lora", "lora.rank": 4, "algo.name": "sft", "steps": 1,
                               "rollout.tasks_per_step": 1, "rollout.group_size": 1, "rollout.max_turns": 8,
                               "rollout.max_new_tokens": 32, "rollout.max_context_tokens": 1024,
                               "log_trajectories": True, "progress": False, "checkpoint_every": 0,
                               "rollout.summary": {"trigger_tokens": 330, "mode": "state_dump"}})  # fmt: skip
    trainer = Trainer(config, policy=policy)
    try:
        trainer.train()
    finally:
        trainer.close()
    (traj,) = read_trajectories(tmp_path / "run")[1]  # the expert's demonstration, compacted by the harness
    assert traj.metrics["compactions"] >= 2 and traj.rewards == {"items_right": 1.0}
    assert all(r["mode"] == "state_dump" for r in traj.info["summaries"]) and relookups(traj.messages) == 0
