"""Each monitor on hand-made batches that should and should not alert; mitigations; one real rollout batch."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.env import ToolEnv, make
from taskrl.monitor import (
    MONITORS,
    THRESHOLDS,
    FirstToolHint,
    MitigationConfig,
    MonitorConfig,
    Monitors,
    least_used_first_tool,
    max_concurrency,
    sampling_temperature,
    shape_rewards,
    with_first_tool_hints,
)
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.scoring import Clock, Rubric, score
from taskrl.types import Message, Task, ToolCall, Trajectory


def traj(
    calls: list[str | tuple[str, dict]] | None = None,
    *,
    reward: float = 0.0,
    answer: str | None = "42",
    task: str = "t",
    group: str | None = None,
    invalid: int = 0,
    turns: int | None = None,
    terminated: bool = True,
    per_turn: int = 1,
    **info: Any,
) -> Trajectory:
    """A trajectory whose assistant turns make ``calls`` (``per_turn`` calls a turn) and then answer."""
    calls = calls or []
    messages = [Message("system", "s"), Message("user", "u")]
    parsed = [(c, {}) if isinstance(c, str) else c for c in calls]
    for i in range(0, len(parsed), per_turn):
        turn = [ToolCall(f"call_{i + j}", n, a) for j, (n, a) in enumerate(parsed[i : i + per_turn])]
        messages.append(Message("assistant", "", tool_calls=turn))
        messages += [Message("tool", "ok", tool_call_id=c.id, name=c.name) for c in turn]
    if answer is not None:
        messages.append(Message("assistant", answer))
    n_turns = turns if turns is not None else -(-len(calls) // per_turn) + (answer is not None)
    t = Trajectory(task_id=task, group_id=group, messages=messages, rewards={"r": reward}, terminated=terminated)
    t.metrics = {"turns": float(n_turns), "tool_calls": float(len(calls)), "invalid_tool_calls": float(invalid)}
    t.info.update(info)
    if answer is not None:
        t.info["final_answer"] = answer
    return t


def check(batch: list[Trajectory], **config: Any) -> tuple[dict[str, float], set[str]]:
    metrics, alerts = Monitors(MonitorConfig(**config)).check(7, batch)
    assert all(a.step == 7 and a.message for a in alerts)
    return metrics, {a.monitor for a in alerts}


def test_reward_hacking_alerts_on_high_reward_with_a_failed_check() -> None:
    honest = [traj(["a"], reward=1.0, tampering=False), traj(["a"], reward=0.0, tampering=False)]
    metrics, alerts = check(honest)
    assert metrics["monitor/reward_hacking"] == 0.0 and "reward_hacking" not in alerts
    hacked = [traj(["a"], reward=1.0, tampering=True), traj(["a"], reward=1.0, tampering=False)]
    metrics, alerts = check(hacked)
    assert metrics["monitor/reward_hacking"] == 0.5 and "reward_hacking" in alerts
    # "answer not found" is a required check: present and false fails it; a failed episode is not hacking
    not_found = [traj(reward=1.0, final_answer_found=0.0), traj(reward=0.0, final_answer_found=0.0)]
    assert check(not_found)[0]["monitor/reward_hacking"] == 1.0
    unchecked = [traj(reward=1.0), traj(reward=1.0)]
    assert "monitor/reward_hacking" not in check(unchecked)[0], "no check recorded: not applicable"


def test_exploration_collapse_entropy_and_duplicates() -> None:
    varied = [traj(["search", "read"], task="a", group="g"), traj(["grep", "read", "read"], task="a", group="g"),
              traj(["read"], task="a", group="g", answer="7"), traj([], task="a", group="g", answer="9")]  # fmt: skip
    metrics, alerts = check(varied)
    assert metrics["monitor/tool_ngram_entropy"] > 2.0 and metrics["monitor/duplicate_rate"] == 0.0
    assert not alerts & {"tool_ngram_entropy", "duplicate_rate"}
    collapsed = [traj([], task="a", group="g") for _ in range(4)]
    metrics, alerts = check(collapsed)
    assert metrics["monitor/tool_ngram_entropy"] == 0.0 and metrics["monitor/duplicate_rate"] == 0.75
    assert {"tool_ngram_entropy", "duplicate_rate"} <= alerts
    # the same behaviour on different tasks is not duplication
    assert check([traj(["a"], task=str(i)) for i in range(4)])[0].get("monitor/duplicate_rate") is None


def test_context_pollution_counts_irrelevant_unpruned_chunks() -> None:
    chunks = [{"id": "c1", "tokens": 100, "relevant": True}, {"id": "c2", "tokens": 300, "relevant": False}]
    polluted = [traj(chunks=chunks), traj(chunks=chunks)]
    metrics, alerts = check(polluted)
    assert metrics["monitor/context_pollution"] == pytest.approx(0.75) and "context_pollution" in alerts
    pruned = [traj(chunks=chunks, pruned_chunk_ids=["c2"]), traj(chunks=chunks, pruned_chunk_ids=["c2"])]
    metrics, alerts = check(pruned)
    assert metrics["monitor/context_pollution"] == 0.0 and "context_pollution" not in alerts
    # the whole context counts when the env records it: 300 irrelevant of 1000 tokens
    assert check([traj(chunks=chunks, context_tokens=1000)] * 2)[0]["monitor/context_pollution"] == pytest.approx(0.3)
    assert "monitor/context_pollution" not in check([traj(), traj()])[0]


def test_tool_over_use_concentration_and_calls_per_success() -> None:
    over = [traj(["search"] * 9 + ["read"], reward=1.0), traj(["search"] * 10, reward=0.0)]
    metrics, alerts = check(over)
    assert metrics["monitor/tool_concentration"] == 0.95 and "tool_concentration" in alerts
    assert metrics["monitor/calls_per_success"] == 20.0 and "calls_per_success" in alerts
    balanced = [traj(["search", "read"] * 3, reward=1.0), traj(["grep", "read"] * 3, reward=1.0)]
    metrics, alerts = check(balanced)
    assert metrics["monitor/tool_concentration"] == 0.5 and metrics["monitor/calls_per_success"] == 6.0
    assert not alerts & {"tool_concentration", "calls_per_success"}
    # a one-tool env cannot concentrate; nothing solved -> calls per success not applicable
    metrics, _ = Monitors(tool_names=["noop"]).check(0, [traj(["noop"] * 12), traj(["noop"] * 12)])
    assert "monitor/tool_concentration" not in metrics and "monitor/calls_per_success" not in metrics


def test_tool_call_loops() -> None:
    looping = [traj([("search", {"q": "x"})] * 3), traj([("search", {"q": "x"})] * 4)]
    assert check(looping)[0]["monitor/loop_rate"] == 1.0 and "loop_rate" in check(looping)[1]
    fine = [traj([("search", {"q": str(i)}) for i in range(4)]), traj([("search", {"q": "x"})] * 2)]
    assert check(fine)[0]["monitor/loop_rate"] == 0.0


def child(start: float, end: float, answer: str | None = "found") -> Trajectory:
    c = Trajectory(task_id="sub", terminated=answer is not None, trainable=False)
    c.info.update({"started_at": start, "ended_at": end})
    if answer is not None:
        c.info["final_answer"] = answer
    return c


def test_swarm_serial_collapse_and_spurious_parallelism() -> None:
    # without the env's judgement, a sub-task is genuine when it adds a distinct non-trivial answer
    serial = traj(["assign_task"] * 3)
    serial.children = [child(0, 1, "a"), child(1, 2, "b"), child(2, 3, "c")]  # one per turn
    parallel = traj(["assign_task"] * 3, per_turn=3)
    parallel.children = [child(0, 2, "a"), child(0.5, 2.5, "b"), child(1, 3, "c")]
    assert max_concurrency(serial) == 1 and max_concurrency(parallel) == 3
    metrics, alerts = check([serial, serial])
    assert metrics["monitor/serial_collapse"] == 1.0 and "serial_collapse" in alerts
    metrics, alerts = check([parallel, parallel])
    assert metrics["monitor/serial_collapse"] == 0.0 and metrics["monitor/spurious_parallelism"] == 0.0
    assert not alerts & {"serial_collapse", "spurious_parallelism"}
    # concurrency is counted in steps, not seconds: helpers that answered instantly (zero-length wall-clock
    # spans) launched in one turn still ran together
    instant = traj(["assign_task"] * 3, per_turn=3)
    instant.children = [child(5, 5, "a"), child(5, 5, "b"), child(5, 5, "c")]
    assert max_concurrency(instant) == 3 and check([instant, instant])[0]["monitor/serial_collapse"] == 0.0
    spurious = traj(["assign_task"] * 4, per_turn=4)
    spurious.children = [child(0, 1), child(0, 1, answer=""), child(0, 1, answer=None), child(0, 1, answer=None)]
    metrics, alerts = check([spurious, parallel])
    assert metrics["monitor/spurious_parallelism"] == 0.5 and "spurious_parallelism" in alerts
    # one part assigned four times alongside the real work: 3 repeats of 6 launched together > 20% wasted
    repeated = traj(["assign_task"] * 6, per_turn=6)
    repeated.children = [child(0, 1, a) for a in ("a", "b", "c", "a", "a", "ANSWER: a")]
    assert check([repeated, repeated])[0]["monitor/spurious_parallelism"] == 1.0
    # the env's own verdict wins: an honest attempt that failed is not a decoy, padding is
    attempt = traj(["assign_task"] * 2, per_turn=2)
    attempt.children = [child(0, 1, "a"), child(0, 1, "unknown")]
    attempt.children[1].info.update(useful=False, decoy=False)
    assert check([attempt, attempt])[0]["monitor/spurious_parallelism"] == 0.0
    attempt.children[1].info["decoy"] = True
    assert check([attempt, attempt])[0]["monitor/spurious_parallelism"] == 1.0
    # without recorded children, assignments in one turn are what ran concurrently
    assert max_concurrency(traj(["assign_task"] * 4, per_turn=2)) == 2
    assert "monitor/serial_collapse" not in check([traj(["search"]), traj([])])[0], "not a swarm batch"
    # a task of one item cannot be parallelised: not judged for collapse
    single = traj(["assign_task"], task_size=1)
    single.children = [child(0, 1, "a")]
    assert "monitor/serial_collapse" not in check([single, single])[0]


def test_failed_checks_from_any_env_and_calls_per_item() -> None:
    flagged = [traj(["a"], reward=1.0, failed_checks=["decoy_subtasks"]), traj(["a"], reward=1.0, failed_checks=[])]
    metrics, alerts = check(flagged)
    assert metrics["monitor/reward_hacking"] == 0.5 and "reward_hacking" in alerts
    assert check([traj(["a"], reward=1.0, failed_checks=[])] * 2)[0]["monitor/reward_hacking"] == 0.0
    # 18 calls for a solved 9-row table is 2 calls per item, not 18 per success
    wide = traj(["create_subagent"] * 9 + ["assign_task"] * 9, reward=1.0, task_size=9)
    assert check([wide, wide])[0]["monitor/calls_per_success"] == 2.0


def test_invalid_calls_early_termination_clarifying_and_no_edit() -> None:
    bad = [traj(["a", "b"], invalid=1), traj(["a", "b"], invalid=0)]
    assert check(bad)[0]["monitor/invalid_call_rate"] == 0.25 and "invalid_call_rate" in check(bad)[1]
    assert check([traj(["a"] * 10, invalid=0)] * 2)[0]["monitor/invalid_call_rate"] == 0.0

    quitters = [traj([], reward=0.0), traj([], reward=0.0), traj(["a", "b"], reward=0.0)]
    metrics, alerts = check(quitters)
    assert metrics["monitor/early_termination"] == pytest.approx(2 / 3) and "early_termination" in alerts
    solvers = [traj([], reward=1.0), traj(["a"], reward=0.0)]  # answering at once and right is not giving up
    assert check(solvers)[0]["monitor/early_termination"] == 0.0

    asking = [traj(answer="Could you clarify which file you mean?"), traj(answer="Do you want me to fix it?"),
              traj(answer="Done: fixed the bug.")]  # fmt: skip
    metrics, alerts = check(asking)
    assert metrics["monitor/clarifying_rate"] == pytest.approx(2 / 3) and "clarifying_rate" in alerts
    assert check([traj(answer="The total is 12."), traj(answer="42")])[0]["monitor/clarifying_rate"] == 0.0

    lazy = [traj(["read_file", "run_tests"]), traj(["read_file", "edit_file"]), traj(["read_file"])]
    metrics, alerts = check(lazy)
    assert metrics["monitor/no_edit_rate"] == pytest.approx(2 / 3) and "no_edit_rate" in alerts
    metrics, _ = Monitors(tool_names=["read_file", "edit_file"]).check(0, [traj(["read_file"]), traj([])])
    assert metrics["monitor/no_edit_rate"] == 1.0, "known edit tools make the monitor apply even if none is used"
    assert "monitor/no_edit_rate" not in check([traj(["lookup_price"]), traj([])])[0]


def test_every_monitor_has_a_threshold_field_and_no_threshold_is_orphaned() -> None:
    assert list(THRESHOLDS) == list(MONITORS)  # config validates ``disabled`` against THRESHOLDS alone
    config = MonitorConfig(max_loop_rate=0.25)
    assert config.threshold("loop_rate") == 0.25
    assert all(math.isfinite(config.threshold(name)) for name in MONITORS)  # each names a real field


def test_config_validation_small_batches_disabled_and_log_warning(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="MonitorConfig.max_loop_rate"):
        MonitorConfig(max_loop_rate=-1)
    with pytest.raises(ValueError, match="MonitorConfig.disabled"):
        MonitorConfig(disabled=("nope",))
    with pytest.raises(ValueError, match="MitigationConfig.temperature_floor"):
        MitigationConfig(temperature_floor=-0.1)
    assert Monitors().check(0, [traj()]) == ({}, [])
    metrics, alerts = check([traj([])] * 4, disabled=("duplicate_rate",))
    assert "monitor/duplicate_rate" not in metrics and "duplicate_rate" not in alerts
    with caplog.at_level(logging.WARNING, logger="taskrl.monitor"):
        _, alerts = Monitors().check(3, [traj([]), traj([])])
    assert alerts and "tool_ngram_entropy" in caplog.text and "step 3" in caplog.text
    assert set(alerts[0].to_dict()) == {"step", "monitor", "value", "threshold", "message"}
    assert len(MONITORS) == 16


def test_shape_rewards_penalties_are_capped_and_idempotent() -> None:
    t = traj(["a"] * 30, reward=1.0, invalid=2)
    t.metrics["tool_cost"] = 3.0
    config = MitigationConfig(tool_call_penalty=0.01, tool_cost_weight=0.1, invalid_call_penalty=0.2)
    t.terms = dict(t.rewards)
    shape_rewards([t], config)
    shape_rewards([t], config)
    assert t.terms["tool_cost_penalty"] == pytest.approx(-0.5)  # 0.3 + 0.3 capped at 0.5
    assert t.terms["invalid_call_penalty"] == pytest.approx(-0.4)
    assert sum(t.terms.values()) == pytest.approx(1.0 - 0.5 - 0.4)  # weight 1 each, unless a rubric lists them
    score([t], Rubric(), Clock())
    assert t.reward == 0.0  # and the episode's invalid calls cap it at a failure
    untouched = traj(["a"], reward=1.0)
    shape_rewards([untouched], MitigationConfig())
    assert untouched.terms == {} and untouched.rewards == {"r": 1.0}


def test_exploration_mitigations_temperature_and_first_tool_hint() -> None:
    monitors = Monitors()
    floor = MitigationConfig(temperature_floor=0.8)
    assert sampling_temperature(0.3, floor) == 0.8 and sampling_temperature(1.0, floor) == 1.0
    on_alert = MitigationConfig(temperature_floor=0.8, only_on_alert=True)
    assert sampling_temperature(0.3, on_alert, monitors) == 0.3
    monitors.check(0, [traj([], task="a"), traj([], task="a")])  # collapsed: entropy 0, all duplicates
    assert sampling_temperature(0.3, on_alert, monitors) == 0.8

    batch = [traj(["lookup_price", "calculator"]), traj(["lookup_price"])]
    assert least_used_first_tool(batch, ["lookup_price", "calculator"]) == "calculator"
    factory = with_first_tool_hints(lambda: make("shop"), MitigationConfig(first_tool_hint_every=2), batch,
                                    ["lookup_price", "calculator"])  # fmt: skip
    envs = [factory() for _ in range(4)]
    assert [isinstance(e, FirstToolHint) for e in envs] == [False, True, False, True]
    assert with_first_tool_hints(make, MitigationConfig(), batch, ["x"]) is make


async def test_hinted_env_plays_a_real_episode_and_real_batches_are_judged() -> None:
    env = make("shop")
    tasks = list(env.tasks())[:4]
    config = RolloutConfig(group_size=2, max_turns=6)
    hinted = lambda: FirstToolHint(make("shop"), "calculator")  # noqa: E731
    played = await run_episodes(hinted, ScriptedPolicy(env.scripted_rule), tasks[:1], config)
    assert played[0].messages[2].content == "Start by calling the `calculator` tool." and played[0].reward == 1.0
    assert played[0].info["first_tool_hint"]
    wrapped = hinted()
    wrapped.training = False  # attribute writes (the loop sets ``training``) must reach the inner env
    assert wrapped.env.training is False and wrapped.tools is wrapped.env.tools

    config = RolloutConfig(group_size=4, max_turns=6)
    expert = await run_episodes(lambda: make("shop"), ScriptedPolicy(env.scripted_rule), tasks, config)
    metrics, alerts = Monitors(tool_names=env.tools.names).check(1, expert)
    assert metrics["monitor/invalid_call_rate"] == 0.0 and metrics["monitor/early_termination"] == 0.0
    assert metrics["monitor/duplicate_rate"] == 0.75, "a deterministic rule repeats itself within each group"
    assert {a.monitor for a in alerts} == {"duplicate_rate"}

    noop = make("noop")
    looped = await run_episodes(lambda: make("noop"), ScriptedPolicy(noop.scripted_rule), list(noop.tasks()),
                                RolloutConfig(max_turns=20))  # fmt: skip
    metrics, alerts = Monitors(tool_names=noop.tools.names).check(2, looped)
    assert metrics["monitor/loop_rate"] == pytest.approx(2 / 3) and "loop_rate" in {a.monitor for a in alerts}


class Recall(ToolEnv):
    """An env without tools: the answer is in the prompt (Composer-style chat tasks have no tool calls)."""

    name = "recall"

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(f"r{i}", f"Repeat the number {i}.", answer=str(i)) for i in range(3)]

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None
        return {"correct": float(trajectory.final_answer == self.task.answer)}


async def test_monitors_that_need_tools_say_so_once_on_an_env_without_tools(caplog: pytest.LogCaptureFixture) -> None:
    env = Recall()
    assert not env.tools.names
    rule = lambda messages, tools: messages[-1].content.split()[-1].rstrip(".")  # noqa: E731
    batch = await run_episodes(Recall, ScriptedPolicy(rule), list(env.tasks()), RolloutConfig(max_turns=2))
    assert [t.reward for t in batch] == [1.0, 1.0, 1.0]
    monitors = Monitors(tool_names=env.tools.names)
    assert set(monitors.not_applicable) == {"tool_ngram_entropy", "tool_concentration", "calls_per_success",
                                            "loop_rate", "tool_calls_per_episode", "unparsed_tool_calls",
                                            "early_termination"}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="taskrl.monitor"):
        for step in range(3):
            metrics, alerts = monitors.check(step, batch)
            assert not alerts, [a.message for a in alerts]
            assert not any(k.removeprefix("monitor/") in monitors.not_applicable for k in metrics)
    said = [r.getMessage() for r in caplog.records if "do not apply" in r.getMessage()]
    assert len(said) == 2 and "no tools" in said[0] and "tool_ngram_entropy" in said[0]  # once, not every step
    assert "early_termination" in said[1] and "every episode ends at its first answer" in said[1]  # issue 38 item 12
    assert "monitor/clarifying_rate" in metrics  # the monitors that do apply still run
    # the same batch judged without knowing the env's tools is judged as before (entropy 0 alerts)
    assert "tool_ngram_entropy" in {a.monitor for a in Monitors(log_alerts=False).check(0, batch)[1]}


RATES = set(MONITORS) - {"tool_ngram_entropy", "calls_per_success", "tool_calls_per_episode"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(
    st.lists(st.sampled_from(["search", "read", "assign_task", "edit_file"]), max_size=6),
    st.floats(-1, 2), st.sampled_from(["42", "Can you clarify?", ""]), st.integers(0, 3), st.booleans(),
    st.lists(st.tuples(st.floats(0, 5), st.floats(0, 5), st.booleans()), max_size=4),
), min_size=2, max_size=8))  # fmt: skip
def test_every_monitor_stays_in_range_and_never_raises(episodes: list) -> None:
    batch = []
    for calls, reward, answer, invalid, tampered, kids in episodes:
        t = traj(calls, reward=reward, answer=answer or None, invalid=min(invalid, len(calls)), tampering=tampered,
                 chunks=[{"id": "c", "tokens": len(calls), "relevant": tampered}])  # fmt: skip
        t.children = [child(a, b, "x" if done else None) for a, b, done in kids]
        batch.append(t)
    metrics, alerts = Monitors().check(0, batch)
    for name, value in metrics.items():
        assert math.isfinite(value) and value >= 0, name
        if name.removeprefix("monitor/") in RATES:
            assert value <= 1, name
    assert {a.monitor for a in alerts} <= {k.removeprefix("monitor/") for k in metrics}


SHOP_TOOLS = ["lookup_price", "calculator"]


def test_silent_tool_call_collapse_alarms_while_the_reward_looks_fine() -> None:
    monitors = Monitors(tool_names=SHOP_TOOLS, log_alerts=False)
    healthy = [traj(["lookup_price", "lookup_price", "calculator"], reward=1.0, group="g") for _ in range(4)]
    metrics, alerts = monitors.check(1, healthy)
    assert metrics["monitor/tool_calls_per_episode"] == 3.0 and metrics["monitor/unparsed_tool_calls"] == 0.0
    assert not {a.monitor for a in alerts} & {"tool_calls_per_episode", "unparsed_tool_calls"}
    # a parser mismatch: the model writes Llama-style calls the Hermes parser does not see; each turn is taken for
    # the final answer, and the (lenient, hackable) reward still says 1.0
    mismatch = '<function=lookup_price>{"item": "apple"}</function> The total is 6.'
    collapsed = [traj([], reward=1.0, answer=mismatch, group="g") for _ in range(4)]
    metrics, alerts = monitors.check(2, collapsed)
    fired = {a.monitor: a for a in alerts}
    assert metrics["monitor/tool_calls_per_episode"] == 0.0 and "tool_calls_per_episode" in fired
    assert metrics["monitor/unparsed_tool_calls"] == 1.0 and "unparsed_tool_calls" in fired
    # falling to a fifth of the run's peak alerts too, though still above the absolute floor
    metrics, alerts = monitors.check(3, [traj(["lookup_price"], reward=1.0)] + [traj([], reward=1.0)] * 4)
    assert metrics["monitor/tool_calls_per_episode"] == pytest.approx(0.2)
    assert "tool_calls_per_episode" in {a.monitor for a in alerts}
    assert [a.threshold for a in alerts if a.monitor == "tool_calls_per_episode"] == [pytest.approx(0.6)]
    # JSON naming one of the env's tools in a plain answer is a call-like turn; a JSON answer about a person is not
    json_call = traj([], answer='{"name": "calculator", "arguments": {"expression": "2*3"}}')
    person = traj([], answer='{"name": "Ada", "born": 1815}')
    fresh = Monitors(tool_names=SHOP_TOOLS, log_alerts=False)
    assert fresh.check(0, [json_call, person])[0]["monitor/unparsed_tool_calls"] == 0.5
    # parse failures that were counted as invalid calls spike the invalid-call rate, also with no valid call left
    broken = [traj(["lookup_price"], invalid=1, reward=1.0) for _ in range(3)]
    _, alerts = Monitors(tool_names=SHOP_TOOLS, log_alerts=False).check(0, broken)
    assert {"invalid_call_rate", "tool_calls_per_episode"} <= {a.monitor for a in alerts}


async def test_a_real_rollout_with_a_mismatched_call_format_raises_the_collapse_alarms() -> None:
    env = make("shop")
    tasks = list(env.tasks())[:3]
    llama_style = ScriptedPolicy.from_turns(['<function=lookup_price>{"item": "apple"}</function>'])
    batch = await run_episodes(lambda: make("shop"), llama_style, tasks, RolloutConfig(group_size=2))
    assert all(t.metrics["tool_calls"] == 0 and t.terminated for t in batch)  # parsed as final answers
    metrics, alerts = Monitors(tool_names=env.tools.names, log_alerts=False).check(0, batch)
    assert {"tool_calls_per_episode", "unparsed_tool_calls"} <= {a.monitor for a in alerts}
    honest = await run_episodes(lambda: make("shop"), ScriptedPolicy(env.scripted_rule), tasks, RolloutConfig())
    _, alerts = Monitors(tool_names=env.tools.names, log_alerts=False).check(0, honest)
    assert not {a.monitor for a in alerts} & {"tool_calls_per_episode", "unparsed_tool_calls"}


def test_early_termination_is_silent_when_episodes_cannot_last_longer(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 38 item 12: with max_turns=1 every failed answer 'gave up within the first turns'; said once, silent."""
    failed = [traj([], turns=1, task=f"t{i}") for i in range(4)]
    assert "early_termination" in {a.monitor for a in Monitors(tool_names=["lookup"]).check(0, failed)[1]}
    monitors = Monitors(tool_names=["lookup"], max_turns=1)
    with caplog.at_level(logging.WARNING, logger="taskrl.monitor"):
        for step in range(3):
            metrics, alerts = monitors.check(step, failed)
            assert "early_termination" not in {a.monitor for a in alerts} and "monitor/early_termination" not in metrics
    said = [r.getMessage() for r in caplog.records if "do not apply" in r.getMessage()]
    assert len(said) == 1 and "early_termination" in said[0] and "at most 1 turn(s)" in said[0]


def test_capped_success_alerts_when_successes_need_the_token_cap_to_end_their_turns() -> None:
    def capped(reward: float, turns: float) -> Trajectory:
        t = traj(["lookup_price"], reward=reward)
        t.metrics["capped_turns"] = turns
        return t

    metrics, alerts = check([capped(1.0, 1), capped(1.0, 1), capped(1.0, 0), capped(0.0, 2)])
    assert metrics["monitor/capped_success"] == pytest.approx(2 / 3) and "capped_success" in alerts
    metrics, alerts = check([capped(1.0, 0), capped(0.0, 3)])  # failures that hit the cap are not judged here
    assert metrics["monitor/capped_success"] == 0.0 and "capped_success" not in alerts
    assert "monitor/capped_success" not in check([capped(0.0, 1), capped(0.0, 1)])[0]  # nothing solved: no value
