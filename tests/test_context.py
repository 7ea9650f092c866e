"""Self-summarization: a long episode crosses the trigger, summarises into the current segment, continues in a
new one from system prompt + task + summary, and every segment carries the episode's reward."""

from __future__ import annotations

import re
from typing import Any

import pytest

from taskrl.chat import ChatFormat
from taskrl.context import (
    DEFAULT_SUMMARY_PROMPT,
    SummaryConfig,
    compacted_view,
    is_summary_request,
    summary_metrics,
    summary_text,
)
from taskrl.env import make
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.types import Message, Task, Trajectory

WANTED = 12


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return ChatFormat(smollm2_tokenizer())


def noop_worker(messages: list[Message], tools: Any) -> str:
    """Calls noop until WANTED calls are done, counting the calls a summary reports as done."""
    summarised = [
        int(m) for msg in messages if msg.role == "user" for m in re.findall(r"Done: (\d+) calls", msg.content)
    ]
    in_view = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
    done = (summarised[-1] if summarised else 0) + in_view
    if is_summary_request(messages):
        return f"Goal: call noop {WANTED} times.\nDone: {done} calls.\nOpen items: {WANTED - done} calls.\nPlan: go on."
    return ScriptedPolicy.call("noop") if done < WANTED else "done"


async def long_episode(policy: ScriptedPolicy, summary: SummaryConfig, max_context_tokens: int = 2048) -> Trajectory:
    config = RolloutConfig(max_turns=40, max_context_tokens=max_context_tokens, summary=summary)
    task = Task("long", f"Call noop {WANTED} times.", answer="done")
    return await run_episode(make("noop"), policy, task, config, seed=3)


async def test_long_episode_compacts_and_continues_in_a_new_segment(fmt: ChatFormat) -> None:
    opening = make("noop").reset(Task("long", f"Call noop {WANTED} times."))[0]
    trigger = len(fmt.prompt_ids(opening, make("noop").tools.schemas())) + 150
    traj = await long_episode(ScriptedPolicy(noop_worker, chat_format=fmt), SummaryConfig(trigger_tokens=trigger))
    assert traj.error is None and traj.terminated and traj.rewards == {"done": 1.0}
    calls = sum(len(m.tool_calls) for m in traj.messages if m.role == "assistant")
    assert calls == WANTED  # the summaries carried the count across compactions

    records = traj.info["summaries"]
    compactions = len(records)
    assert compactions >= 2 and traj.metrics["compactions"] == compactions
    assert len(traj.segments) == compactions + 1  # every compaction opens a new segment
    assert all(r["tokens_before"] >= trigger > r["tokens_after"] for r in records)
    assert traj.metrics["tokens_before_compaction"] == sum(r["tokens_before"] for r in records) / compactions
    for record in records:
        continuation = traj.messages[record["message_index"]]
        assert continuation.role == "user" and record["text"] in continuation.content
        assert traj.messages[record["message_index"] - 1] == Message("assistant", record["text"])
        assert traj.messages[record["message_index"] - 2].content == DEFAULT_SUMMARY_PROMPT

    # The request is forced (mask 0) and the summary sampled (mask 1) at the end of the segment it closes.
    first, second = traj.segments[0], traj.segments[1]
    summary_ids = fmt.encode(records[0]["text"])
    sampled_tail = first.token_ids[len(first) - first.loss_mask[::-1].index(0) :]
    assert sampled_tail[: len(summary_ids)] == summary_ids and all(first.loss_mask[-len(sampled_tail) :])
    forced = fmt.decode(first.token_ids[: len(first) - len(sampled_tail)][-200:])
    assert DEFAULT_SUMMARY_PROMPT.split("\n")[0] in forced
    # The next segment starts from system prompt + task + summary, nothing else of the old history.
    view = compacted_view(opening, records[0]["text"], SummaryConfig(trigger_tokens=trigger))
    prompt = fmt.prompt_ids(view, make("noop").tools.schemas())
    assert second.token_ids[: len(prompt)] == prompt and not any(second.loss_mask[: len(prompt)])
    # Summary tokens are trainable and belong to the trajectory whose reward every segment shares.
    assert traj.trainable and traj.num_sampled_tokens == sum(sum(s.loss_mask) for s in traj.segments)


async def test_message_mode_compacts_on_an_estimate() -> None:
    traj = await long_episode(ScriptedPolicy(noop_worker), SummaryConfig(trigger_tokens=80))
    assert traj.rewards == {"done": 1.0} and traj.metrics["compactions"] >= 1
    assert traj.info["summaries"][0]["text"].startswith(f"Goal: call noop {WANTED} times.")


async def test_compactions_are_capped(fmt: ChatFormat) -> None:
    traj = await long_episode(
        ScriptedPolicy(noop_worker, chat_format=fmt), SummaryConfig(trigger_tokens=300, max_compactions=1)
    )
    assert traj.metrics["compactions"] == 1 and len(traj.segments) == 2


async def test_no_room_for_the_summary_truncates(fmt: ChatFormat) -> None:
    opening = make("noop").reset(Task("long", "x"))[0]
    size = len(fmt.prompt_ids(opening, make("noop").tools.schemas()))
    traj = await long_episode(
        ScriptedPolicy(noop_worker, chat_format=fmt),
        SummaryConfig(trigger_tokens=size + 60),
        max_context_tokens=size + 90,
    )
    assert traj.truncated and traj.info["truncation"] == "max_context_tokens"
    assert "summaries" not in traj.info and traj.metrics["compactions"] == 0


def test_summary_helpers() -> None:
    assert summary_text('Goal: x\n<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>\n') == "Goal: x"
    assert is_summary_request([Message("user", DEFAULT_SUMMARY_PROMPT)])
    assert not is_summary_request([Message("tool", DEFAULT_SUMMARY_PROMPT)])
    assert summary_metrics([]) == {"compactions": 0.0, "summary_tokens_total": 0.0}
    records = [{"tokens_before": 100, "tokens_after": 40, "summary_tokens": 10},
               {"tokens_before": 120, "tokens_after": 60, "summary_tokens": 30}]  # fmt: skip
    assert summary_metrics(records) == {
        "compactions": 2.0,
        "summary_tokens_total": 40.0,
        "tokens_before_compaction": 110.0,
        "tokens_after_compaction": 50.0,
        "summary_tokens": 20.0,
    }


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"trigger_tokens": 0}, "trigger_tokens"),
        ({"trigger_tokens": 10, "max_summary_tokens": 0}, "max_summary_tokens"),
        ({"trigger_tokens": 10, "continuation": "no placeholder"}, "continuation"),
        ({"trigger_tokens": 10, "prompt": " "}, "prompt"),
        ({"trigger_tokens": 10, "max_compactions": 0}, "max_compactions"),
        ({"trigger_tokens": 10, "mode": "magic"}, "mode"),
        ({"trigger_tokens": 10, "harness_prompt": "no placeholder"}, "harness_prompt"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"SummaryConfig.{field}"):
        SummaryConfig(**kwargs)


def test_trigger_must_leave_room() -> None:
    with pytest.raises(ValueError, match="RolloutConfig.summary.trigger_tokens"):
        RolloutConfig(max_context_tokens=100, summary=SummaryConfig(trigger_tokens=100))
