"""The agent loop: token-exact segments, invalid calls, budgets, context resets, groups, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskrl.chat import ChatFormat
from taskrl.env import ToolEnv, make
from taskrl.policies.base import Completion, PolicyError, SamplingParams
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, _SegmentBuilder, run_episode, run_episodes
from taskrl.tools import tool
from taskrl.types import Message, Task, Trajectory

call = ScriptedPolicy.call


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return ChatFormat(smollm2_tokenizer())


class Recording(ScriptedPolicy):
    """A scripted policy that remembers every prompt and completion (to rebuild the expected tokens)."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.turns: list[tuple[list[int] | None, Completion]] = []

    async def generate(self, **kwargs: Any) -> Completion:
        completion = await super().generate(**kwargs)
        self.turns.append((kwargs.get("token_ids"), completion))
        return completion


def shop_task() -> Task:
    return make("shop").tasks()[0]


async def test_token_mode_segment_is_prompt_plus_samples_plus_observations(fmt: ChatFormat) -> None:
    env = make("shop")
    policy = Recording(env.scripted_rule, chat_format=fmt)
    traj = await run_episode(env, policy, shop_task(), RolloutConfig(), seed=1)
    assert traj.terminated and not traj.truncated and traj.reward == 1.0
    assert len(traj.segments) == 1
    seg = traj.segments[0]

    messages, _ = make("shop").reset(shop_task())
    expected = fmt.prompt_ids(messages, env.tools.schemas())
    mask = [0] * len(expected)
    history = traj.messages[len(messages) :]
    assistant_at = [j for j, m in enumerate(history) if m.role == "assistant"]
    for i, (prompt, completion) in enumerate(policy.turns):
        assert prompt == expected, f"turn {i} was prompted with something other than the running context"
        expected = expected + completion.token_ids
        mask += [1] * len(completion.token_ids)
        if i + 1 < len(policy.turns):
            obs = history[assistant_at[i] + 1 : assistant_at[i + 1]]
            forced = fmt.close_turn_ids(completion.token_ids) + fmt.observation_ids(obs)
            expected = expected + forced
            mask += [0] * len(forced)
    assert seg.token_ids == expected
    assert seg.loss_mask == mask
    assert all(lp == 0.0 for lp in seg.logprobs)
    assert traj.metrics["sampled_tokens"] == sum(len(c.token_ids) for _, c in policy.turns)


async def test_invalid_calls_are_observations_counted_and_capped(fmt: ChatFormat) -> None:
    task = shop_task()
    answer = f"The total is {task.answer}."
    turns = [call("nope"), "<tool_call>{broken</tool_call>", call("lookup_price", item=3), answer]
    env = make("shop")
    traj = await run_episode(env, ScriptedPolicy.from_turns(turns, chat_format=fmt), task, RolloutConfig(), seed=0)
    assert traj.metrics["invalid_tool_calls"] == 3
    errors = [m.content for m in traj.messages if m.role == "tool"]
    assert "Unknown tool 'nope'" in errors[0]
    assert "not valid JSON" in errors[1]
    assert "argument 'item' must be string" in errors[2]
    assert traj.rewards["correct"] == 1.0  # the answer is right ...
    assert traj.reward <= env.failure_reward  # ... but invalid calls never beat a failure


async def test_max_turns_truncates() -> None:
    env = make("noop")
    task = Task("loop", "Call noop 100 times.", answer="done")
    traj = await run_episode(env, ScriptedPolicy(env.scripted_rule), task, RolloutConfig(max_turns=3), seed=0)
    assert traj.truncated and not traj.terminated
    assert traj.info["truncation"] == "max_turns"
    assert traj.metrics["turns"] == 3


async def test_context_budget_truncates(fmt: ChatFormat) -> None:
    env = make("noop")
    task = Task("loop", "Call noop 100 times.", answer="done")
    config = RolloutConfig(max_turns=50, max_context_tokens=400)
    traj = await run_episode(env, ScriptedPolicy(env.scripted_rule, chat_format=fmt), task, config, seed=0)
    assert traj.truncated and traj.info["truncation"] in ("max_context_tokens", "max_new_tokens")
    assert traj.num_tokens <= 400


class PruningEnv(ToolEnv):
    """Replaces the model's view after the first call (like prune_chunks or a summary would)."""

    name = "pruning"
    training = False

    @tool
    def forget(self) -> str:
        """Forget everything but the task."""
        return "forgotten"

    async def step(self, tool_calls):  # type: ignore[no-untyped-def]
        results, terminated, truncated, info = await super().step(tool_calls)
        assert self.task is not None
        prompt = self.task.prompt
        info["context"] = lambda view: [view[0], Message("user", prompt + " (pruned)")]
        return results, terminated, truncated, info

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"answered": float(trajectory.final_answer == "ok")}


async def test_non_append_context_change_opens_new_segment(fmt: ChatFormat) -> None:
    env = PruningEnv()
    policy = ScriptedPolicy(
        lambda msgs, tools: "ok" if "(pruned)" in msgs[1].content else call("forget"), chat_format=fmt
    )
    traj = await run_episode(env, policy, Task("t", "Do it."), RolloutConfig(), seed=0)
    assert traj.reward == 1.0 and traj.metrics["context_resets"] == 1
    assert env.training is True  # RolloutConfig.training reached the env
    assert len(traj.segments) == 2
    second = traj.segments[1]
    prompt = fmt.prompt_ids(
        [Message("system", env.system_prompt), Message("user", "Do it. (pruned)")], env.tools.schemas()
    )
    assert second.token_ids[: len(prompt)] == prompt
    assert second.loss_mask[: len(prompt)] == [0] * len(prompt)
    assert "forgotten" in [m.content for m in traj.messages]  # the full history keeps what was pruned


class ChattyEnv(ToolEnv):
    """A simulated user who says "go on" twice, then lets the episode end."""

    name = "chatty"

    def __init__(self) -> None:
        super().__init__()
        self.replies = 0

    def user_turn(self, text: str):  # type: ignore[no-untyped-def]
        self.replies += 1
        return [Message("user", "go on")], self.replies > 2, False, {}


async def test_user_turn_continues_the_conversation(fmt: ChatFormat) -> None:
    traj = await run_episode(
        ChattyEnv(),
        ScriptedPolicy.from_turns(["a", "b", "c"], chat_format=fmt),
        Task("t", "Talk."),
        RolloutConfig(),
        seed=0,
    )
    assert [m.content for m in traj.messages if m.role == "assistant"] == ["a", "b", "c"]
    assert traj.terminated and len(traj.segments) == 1


class BrokenEnv(ToolEnv):
    name = "broken"

    @tool
    def ping(self) -> str:
        """Ping."""
        return "pong"

    async def step(self, tool_calls):  # type: ignore[no-untyped-def]
        raise RuntimeError("env exploded")


async def test_env_error_ends_only_that_episode(fmt: ChatFormat) -> None:
    traj = await run_episode(
        BrokenEnv(), ScriptedPolicy.from_turns([call("ping")], chat_format=fmt), Task("t", "x"), RolloutConfig(), seed=0
    )
    assert traj.error == "RuntimeError: env exploded"
    assert not traj.trainable


class ThreeTupleEnv(BrokenEnv):
    name = "three_tuple"

    async def step(self, tool_calls):  # type: ignore[no-untyped-def]
        return await self.tools.execute(tool_calls), False, {}


async def test_a_step_of_the_wrong_shape_ends_the_episode_naming_the_env(fmt: ChatFormat) -> None:
    policy = ScriptedPolicy.from_turns([call("ping")], chat_format=fmt)
    traj = await run_episode(ThreeTupleEnv(), policy, Task("t", "x"), RolloutConfig(), seed=0)
    assert traj.error == (
        "EnvCheckError: env 'three_tuple': step must return (results, terminated, truncated, info), got a 3-tuple"
    )
    assert not traj.trainable


class FailingPolicy(ScriptedPolicy):
    async def generate(self, **kwargs: Any) -> Completion:
        messages = kwargs["messages"]
        if "fail" in messages[-1].content:
            await asyncio.sleep(0.05)
            raise PolicyError("server went away")
        return await super().generate(**kwargs)


async def test_policy_error_aborts_run_but_finished_episodes_were_delivered() -> None:
    tasks = [Task("ok1", "fine"), Task("ok2", "fine"), Task("bad", "fail")]
    seen: list[str] = []
    policy = FailingPolicy.from_turns(["done"])
    with pytest.raises(PolicyError, match="server went away"):
        await run_episodes(ToolEnv, policy, tasks, RolloutConfig(), on_trajectory=lambda t: seen.append(t.task_id))
    assert sorted(seen) == ["ok1", "ok2"]


async def test_groups_seeds_and_determinism(fmt: ChatFormat) -> None:
    env = make("shop")
    config = RolloutConfig(group_size=3, seed=7)
    tasks = env.tasks()[:2]

    async def play() -> list[Trajectory]:
        return await run_episodes(
            lambda: make("shop"), ScriptedPolicy(env.scripted_rule, chat_format=fmt), tasks, config
        )

    first, second = await play(), await play()
    assert len(first) == 6
    assert [t.group_id for t in first] == [f"{tasks[0].id}#7"] * 3 + [f"{tasks[1].id}#7"] * 3
    assert len({t.seed for t in first}) == 6
    for a, b in zip(first, second, strict=True):
        assert (a.seed, a.segments, a.messages, a.rewards) == (b.seed, b.segments, b.messages, b.rewards)


async def test_episodes_already_played_are_returned_in_place_not_replayed(fmt: ChatFormat) -> None:
    """Issue 39 item 5: ``eval`` resumes through ``run_episodes(done=...)``, the one episode runner."""
    env = make("shop")
    config = RolloutConfig(group_size=2, seed=3)
    tasks = env.tasks()[:2]
    policy = ScriptedPolicy(env.scripted_rule, chat_format=fmt)
    first = await run_episodes(lambda: make("shop"), policy, tasks, config)
    kept = {first[1].seed: first[1], first[2].seed: first[2]}
    made, seen = [], []

    def factory() -> ToolEnv:
        made.append(1)
        return make("shop")

    again = await run_episodes(factory, policy, tasks, config, done=kept, on_trajectory=seen.append)
    assert again[1] is first[1] and again[2] is first[2] and len(made) == 2 and len(seen) == 2
    assert [t.seed for t in again] == [t.seed for t in first]
    assert [(t.segments, t.rewards) for t in again] == [(t.segments, t.rewards) for t in first]


def test_eval_has_no_episode_runner_of_its_own() -> None:
    import taskrl.eval as eval_module

    assert not hasattr(eval_module, "_play") and eval_module.run_episodes is run_episodes


async def test_concurrency_is_bounded() -> None:
    live, peak = 0, 0

    class Slow(ScriptedPolicy):
        async def generate(self, **kwargs: Any) -> Completion:
            nonlocal live, peak
            live += 1
            peak = max(peak, live)
            await asyncio.sleep(0.01)
            live -= 1
            return await super().generate(**kwargs)

    tasks = [Task(f"t{i}", "x") for i in range(10)]
    out = await run_episodes(ToolEnv, Slow.from_turns(["done"]), tasks, RolloutConfig(concurrency=3))
    assert len(out) == 10 and peak == 3


async def test_message_mode_without_token_ids_is_not_trainable() -> None:
    env = make("shop")
    traj = await run_episode(env, ScriptedPolicy(env.scripted_rule), shop_task(), RolloutConfig(), seed=0)
    assert traj.reward == 1.0 and not traj.trainable and traj.segments == []
    assert "no token ids" in traj.info["untrainable_reason"]


def test_segment_builder_appends_extensions_and_splits_otherwise() -> None:
    b = _SegmentBuilder()
    b.add_turn([1, 2], Completion("", token_ids=[3], logprobs=[-0.5]))
    b.add_turn([1, 2, 3, 9], Completion("", token_ids=[4, 5], logprobs=[-0.1, -0.2]))
    assert len(b.segments) == 1
    assert b.segments[0].token_ids == [1, 2, 3, 9, 4, 5]
    assert b.segments[0].loss_mask == [0, 0, 1, 0, 1, 1]
    assert b.segments[0].logprobs == [0.0, 0.0, -0.5, 0.0, -0.1, -0.2]
    b.add_turn([1, 7], Completion("", token_ids=[8], logprobs=[-1.0]))  # re-rendered, not an extension
    b.add_turn([1, 7, 8], Completion("", token_ids=[6], logprobs=[-1.0], policy_version=1))  # new weights
    assert [s.token_ids for s in b.segments[1:]] == [[1, 7, 8], [1, 7, 8, 6]]
    assert [s.policy_version for s in b.segments] == [0, 0, 1]


def test_config_validation_and_summarize_names_its_replacement() -> None:
    with pytest.raises(ImportError, match="summarize was removed: use taskrl.scoring.batch_metrics"):
        from taskrl.rollout import summarize  # noqa: F401
    with pytest.raises(ValueError, match="RolloutConfig.group_size"):
        RolloutConfig(group_size=0)
    with pytest.raises(ValueError, match="SamplingParams.top_p"):
        SamplingParams(top_p=0)


class BudgetEnv(ToolEnv):
    """Records the token usage the loop reports before each step."""

    name = "budget"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    @tool
    def ping(self) -> str:
        """Ping."""
        return "pong"

    def observe_context(self, used: int, limit: int) -> None:
        self.seen.append((used, limit))


async def test_env_is_told_the_exact_context_size(fmt: ChatFormat) -> None:
    env = BudgetEnv()
    policy = Recording.from_turns([call("ping"), "done"], chat_format=fmt)
    traj = await run_episode(env, policy, Task("t", "x"), RolloutConfig(max_context_tokens=999), seed=0)
    assert [limit for _, limit in env.seen] == [999, 999]
    prompts = [len(p) + len(c.token_ids) for p, c in policy.turns]
    assert [used for used, _ in env.seen] == prompts
    assert env.seen[-1][0] == traj.num_tokens


DEEP_CALL = '<tool_call>{"name": "lookup_price", "arguments": {"item": ' + "[" * 500 + "]" * 500 + "}}</tool_call>"


async def test_arguments_nested_500_deep_are_an_invalid_call_and_every_trajectory_is_written(
    fmt: ChatFormat, tmp_path: Any
) -> None:
    from taskrl.cli import _play
    from taskrl.runlog import RunLog
    from taskrl.types import TRUNCATED_KEY, read_jsonl, write_jsonl

    turns = [DEEP_CALL, call("lookup_price", item="apple"), "The total is 48."]
    tasks = make("shop").tasks()[:3]
    config = RolloutConfig(sampling=SamplingParams(max_new_tokens=2048), max_context_tokens=8192, concurrency=1)
    trajs = await run_episodes(
        lambda: make("shop"), ScriptedPolicy.from_turns(turns * 3, chat_format=fmt), tasks, config
    )
    assert len(trajs) == 3 and all(t.error is None for t in trajs)
    for traj in trajs:
        assert traj.metrics["invalid_tool_calls"] >= 1
        first = next(i for i, m in enumerate(traj.messages) if m.role == "assistant")
        deep = traj.messages[first].tool_calls[0]
        assert set(deep.arguments) == {TRUNCATED_KEY} and deep.arguments[TRUNCATED_KEY].startswith('{"item": [[[')
        assert "nested deeper than" in traj.messages[first + 1].content
        assert traj.reward <= make("shop").failure_reward  # an invalid call never beats a failure
    write_jsonl(str(tmp_path / "lib.jsonl"), trajs)  # the library writer
    log = RunLog(tmp_path / "run")  # the trainer's trajectory writer
    assert len(read_jsonl(str(log.write_trajectories(0, trajs)))) == 3
    assert [t.id for t in read_jsonl(str(tmp_path / "lib.jsonl"))] == [t.id for t in trajs]
    out = tmp_path / "cli.jsonl"  # and `taskrl rollout`'s writer, with the same deep calls
    played = await _play("shop", ScriptedPolicy.from_turns(turns * 3, chat_format=fmt), tasks, config, out)
    assert len(played) == len(read_jsonl(str(out))) == 3


def test_trajectory_with_any_value_serialises() -> None:
    from taskrl.types import TRUNCATED_KEY, ToolCall

    deep: list = []
    cursor = deep
    for _ in range(100_000):  # far past the recursion limit
        cursor.append([])
        cursor = cursor[0]
    traj = Trajectory(messages=[Message("assistant", "", [ToolCall("c", "f", {"x": deep})])])
    traj.info.update({"deep": deep, "path": __import__("pathlib").Path("/tmp"), "huge": 10**5000, 3: "int key"})
    back = Trajectory.from_json(traj.to_json())
    assert TRUNCATED_KEY in str(back.messages[0].tool_calls[0].arguments)
    assert TRUNCATED_KEY in str(back.info["deep"])
    assert back.info["path"] == "/tmp" and back.info["huge"].startswith("<int of") and back.info["3"] == "int key"
