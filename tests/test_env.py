"""The env contract: check_env over every registered env, the registry, and the built-in shop env."""

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

import taskrl.env as env_module
from taskrl.env import (
    BUILTIN_ENVS,
    EnvCheckError,
    EnvDefaults,
    StepOutput,
    ToolEnv,
    UnknownEnvError,
    Wrapper,
    acheck_env,
    call_hook,
    check_env,
    declared,
    make,
    register,
    registry,
    step_output,
)
from taskrl.envs.builtin import PRICES, NoopEnv, ShopEnv, last_number, make_shop_tasks, safe_eval
from taskrl.scoring import GateRule, Rubric, TermWeight, rubric_of
from taskrl.tools import ToolSet, tool
from taskrl.types import Message, Task, ToolCall, ToolResult, Trajectory


@pytest.mark.parametrize("name", sorted(registry()))
async def test_registered_env_passes_check_env(name: str) -> None:
    env = make(name)
    assert env.name == name
    await acheck_env(env)


def test_builtin_envs_are_registered_with_descriptions() -> None:
    specs = registry()
    assert {"shop", "noop"} <= set(specs)
    assert set(BUILTIN_ENVS) <= set(specs)  # other tests may register envs of their own, without descriptions
    assert all(specs[name].description for name in BUILTIN_ENVS)


def test_check_env_sync_wrapper() -> None:
    check_env(ShopEnv(num_tasks=2))


# -- registry ----------------------------------------------------------------------------------


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_module, "_REGISTRY", dict(registry()))


def test_make_unknown_env_names_the_registered_ones() -> None:
    with pytest.raises(UnknownEnvError) as err:
        make("shopp")
    message = str(err.value)
    assert message.startswith("unknown env 'shopp'; registered envs: ")
    assert "noop" in message and "shop" in message
    assert isinstance(err.value, KeyError)


def test_register_duplicate_name_is_an_error(isolated_registry: None) -> None:
    register("mine", NoopEnv)
    with pytest.raises(ValueError, match="'mine' is already registered; pass overwrite=True"):
        register("mine", ShopEnv)
    assert isinstance(make("mine"), NoopEnv)
    register("mine", ShopEnv, overwrite=True)
    assert isinstance(make("mine"), ShopEnv)
    with pytest.raises(ValueError, match="already registered"):
        register("shop", ShopEnv)


def test_make_passes_kwargs_and_names_unnamed_envs(isolated_registry: None) -> None:
    class Unnamed(ToolEnv):
        name = ""

    register("unnamed", Unnamed)
    assert make("unnamed").name == "unnamed"
    assert make("shop", num_tasks=5).num_tasks == 5


def test_isolated_registry_does_not_leak() -> None:
    assert "mine" not in registry() and "unnamed" not in registry()


# -- check_env on broken envs ------------------------------------------------------------------

TASK = Task("t0", "What is 2+2?", answer=4)


class GoodEnv(ToolEnv):
    """A minimal correct env the broken ones below each change in one way."""

    name = "good"

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [TASK]

    @tool
    def echo(self, text: str) -> str:
        """Echo text."""
        return text

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"correct": float(trajectory.final_answer == str(self.task.answer)), "style": None}


class AsyncEnv(GoodEnv):
    name = "async"

    async def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        return super().reset(task, seed)

    async def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return super().reward(trajectory)


class ResetWrongShape(GoodEnv):
    def reset(self, task: Task, seed: int | None = None) -> Any:
        return super().reset(task, seed)[0]  # messages only, no info


class ResetNoMessages(GoodEnv):
    def reset(self, task: Task, seed: int | None = None) -> Any:
        return [], {}


class ResetStrings(GoodEnv):
    def reset(self, task: Task, seed: int | None = None) -> Any:
        return ["hello"], {}


class RewardIgnoresAnswer(GoodEnv):
    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"correct": 1.0}


class RewardPrefersWrong(GoodEnv):
    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"correct": float(trajectory.final_answer != str(self.task.answer))}


class RewardNotADict(GoodEnv):
    def reward(self, trajectory: Trajectory) -> Any:
        return "1.0"  # one float is a term named 'reward'; a string is no reward


class RewardRaises(GoodEnv):
    def reward(self, trajectory: Trajectory) -> Any:
        raise KeyError("final")


class NoTasks(GoodEnv):
    def tasks(self, split: str = "train") -> Sequence[Task]:
        return []


class TasksNotTasks(GoodEnv):
    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [{"id": "t0", "prompt": "hi"}]  # type: ignore[list-item]


class StepWrongShape(GoodEnv):
    async def step(self, tool_calls: list[ToolCall]) -> Any:
        return await self.tools.execute(tool_calls), False, {}


class StepSwallowsUnknownTool(GoodEnv):
    async def step(self, tool_calls: list[ToolCall]) -> Any:
        return [], False, False, {}


class StepLosesCallId(GoodEnv):
    async def step(self, tool_calls: list[ToolCall]) -> Any:
        return [ToolResult("other", c.name, "no", is_error=True) for c in tool_calls], False, False, {}


class StepNonBoolFlags(GoodEnv):
    async def step(self, tool_calls: list[ToolCall]) -> Any:
        return await self.tools.execute(tool_calls), 0, None, {}


class StepRaises(GoodEnv):
    def step(self, tool_calls: list[ToolCall]) -> Any:
        raise KeyError(tool_calls[0].name)


class ToolsNotAToolSet(GoodEnv):
    def __init__(self) -> None:
        super().__init__()
        self.tools = [t for t in self.tools]  # type: ignore[assignment]


class ToolWithoutDescription(GoodEnv):
    def __init__(self) -> None:
        super().__init__()
        self.tools = ToolSet([replace(self.tools["echo"], description="")])


class MissingReward:
    name = "missing"
    tools = ToolSet()

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [TASK]

    def reset(self, task: Task, seed: int | None = None) -> Any:
        return [Message("user", task.prompt)], {}

    def step(self, tool_calls: list[ToolCall]) -> Any:
        return [], False, False, {}


@pytest.mark.parametrize("env_cls", [GoodEnv, AsyncEnv])
async def test_check_env_accepts_good_envs(env_cls: type) -> None:
    await acheck_env(env_cls())


@pytest.mark.parametrize(
    ("env_cls", "problem"),
    [
        (ResetWrongShape, "reset must return (messages, info)"),
        (ResetNoMessages, "reset must return a non-empty list[Message] and a dict"),
        (ResetStrings, "reset must return a non-empty list[Message] and a dict"),
        (RewardIgnoresAnswer, "task t0: the gold answer scores 1.0, not more than a wrong answer (1.0)"),
        (RewardPrefersWrong, "task t0: the gold answer scores 0.0, not more than a wrong answer (1.0)"),
        (RewardNotADict, "reward() must return a dict of term name -> float (or None), e.g. {'correct': 1.0}, or "
                         "one float; got str '1.0'"),
        (RewardRaises, "reward raised KeyError: 'final'"),
        (NoTasks, "tasks('train') returned no tasks"),
        (TasksNotTasks, "tasks() must yield Task objects, got dict"),
        (StepWrongShape, "step must return (results, terminated, truncated, info)"),
        (StepSwallowsUnknownTool, "step must answer an unknown tool with one error ToolResult carrying the call id"),
        (StepLosesCallId, "step must answer an unknown tool with one error ToolResult carrying the call id"),
        (StepNonBoolFlags, "step must return bools for terminated/truncated and a dict for info"),
        (StepRaises, "step raised KeyError: '__no_such_tool__'"),
        (ToolsNotAToolSet, "tools must be a ToolSet, got list"),
        (ToolWithoutDescription, "tool schema incomplete"),
        (MissingReward, "missing 'reward'"),
    ],
)
async def test_check_env_names_the_problem(env_cls: type, problem: str) -> None:
    env = env_cls()
    with pytest.raises(EnvCheckError) as err:
        await acheck_env(env)
    message = str(err.value)
    assert message.startswith(f"env '{env.name}': "), message
    assert problem in message


def test_check_env_sync_wrapper_raises_too() -> None:
    with pytest.raises(EnvCheckError, match="gold answer"):
        check_env(RewardIgnoresAnswer())


# -- ShopEnv -----------------------------------------------------------------------------------


def calls(*specs: tuple[str, dict]) -> list[ToolCall]:
    return [ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(specs)]


async def test_shop_tools() -> None:
    env = ShopEnv(num_tasks=3)
    assert sorted(env.tools.names) == ["calculator", "lookup_price"]
    env.reset(env.tasks()[0], seed=0)
    results, terminated, truncated, info = await env.step(
        calls(
            ("lookup_price", {"item": "apple"}),
            ("lookup_price", {"item": " Coffees "}),
            ("lookup_price", {"item": "caviar"}),
            ("calculator", {"expression": "3*4 + 2*7"}),
            ("calculator", {"expression": "7 / 2"}),
            ("calculator", {"expression": "-(1 - 4) * 2.5"}),
            ("calculator", {"expression": "__import__('os')"}),
            ("calculator", {"expression": "1/0"}),
            ("calculator", {"expression": "2 ** 10"}),
            ("calculator", {"expression": "1+" * 150 + "1"}),
            ("calculator", {"expression": "3 +"}),
        )
    )
    assert (terminated, truncated, info) == (False, False, {})
    assert [r.call_id for r in results] == [f"call_{i}" for i in range(11)]
    ok = [(r.is_error, r.content) for r in results]
    assert ok[0] == (False, "apple: $3")
    assert ok[1] == (False, "coffee: $12")
    assert ok[2][0] and "no item 'caviar'" in ok[2][1] and "known items: apple, banana," in ok[2][1]
    assert ok[3] == (False, "26")
    assert ok[4] == (False, "3.5")
    assert ok[5] == (False, "7.5")
    assert ok[6][0] and "only numbers, + - * / and parentheses are allowed" in ok[6][1]
    assert ok[7][0] and "ZeroDivisionError" in ok[7][1]
    assert ok[8][0] and "only numbers" in ok[8][1]
    assert ok[9][0] and "longer than 200 characters" in ok[9][1]
    assert ok[10][0] and "SyntaxError" in ok[10][1]


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "open('x')", "(1).__class__", "[1, 2]", "x", "'a' * 3", "1 if 1 else 2"]
)
def test_safe_eval_refuses_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises((ValueError, SyntaxError)):
        safe_eval(expression)


async def test_shop_tool_arguments_are_validated() -> None:
    env = ShopEnv(num_tasks=1)
    results, *_ = await env.step(calls(("lookup_price", {"item": 3}), ("calculator", {})))
    assert results[0].is_error and "argument 'item' must be string" in results[0].content
    assert results[1].is_error and "missing required argument 'expression'" in results[1].content


def _answered(task: Task, answer: str | None) -> Trajectory:
    traj = Trajectory(task_id=task.id, terminated=True)
    if answer is not None:
        traj.info["final_answer"] = answer
    return traj


def test_shop_reward_is_one_for_the_gold_total_and_zero_otherwise() -> None:
    env = ShopEnv(num_tasks=8)
    for task in env.tasks("train"):
        env.reset(task, seed=0)
        total = task.answer
        assert env.reward(_answered(task, str(total))) == {"correct": 1.0}
        assert env.reward(_answered(task, f"The total is ${total}.")) == {"correct": 1.0}
        assert env.reward(_answered(task, f"{total}.00")) == {"correct": 1.0}
        assert env.reward(_answered(task, str(total + 1))) == {"correct": 0.0}
        assert env.reward(_answered(task, f"{total} dollars, or maybe {total - 1}")) == {"correct": 0.0}
        assert env.reward(_answered(task, "I don't know")) == {"correct": 0.0}
        assert env.reward(_answered(task, None)) == {"correct": 0.0}


def test_shop_reward_uses_the_current_task() -> None:
    env = ShopEnv(num_tasks=2)
    first, second = env.tasks()
    assert first.answer != second.answer
    env.reset(second)
    assert env.reward(_answered(first, str(first.answer))) == {"correct": 0.0}
    assert env.reward(_answered(second, str(second.answer))) == {"correct": 1.0}


def test_last_number() -> None:
    assert last_number("a 1, then 2.5 and -3") == -3.0
    assert last_number("$1,234") == 1234.0
    assert last_number("none") is None
    assert last_number(None) is None


def test_shop_tasks_are_deterministic_per_split() -> None:
    train = ShopEnv(num_tasks=16).tasks("train")
    assert train == ShopEnv(num_tasks=16).tasks("train")
    assert ShopEnv(num_tasks=16).tasks("test") == ShopEnv(num_tasks=16).tasks("test")
    assert [t.prompt for t in train] != [t.prompt for t in ShopEnv(num_tasks=16).tasks("test")]
    assert ShopEnv(num_tasks=4).tasks("train") == train[:4]
    assert len({t.id for t in train} | {t.id for t in ShopEnv(num_tasks=16).tasks("test")}) == 32
    assert make_shop_tasks(5, seed=7) == make_shop_tasks(5, seed=7)


def test_shop_tasks_are_consistent() -> None:
    for task in ShopEnv(num_tasks=32).tasks("train"):
        order = task.info["order"]
        assert 1 <= len(order) <= 3
        assert all(item in PRICES and 1 <= qty <= 5 for item, qty in order.items())
        assert task.answer == sum(PRICES[item] * qty for item, qty in order.items())
        for item, qty in order.items():
            assert f"{qty} x {item}" in task.prompt
        assert str(task.answer) not in task.prompt.split("has", 1)[0]


def test_shop_reset_opens_with_system_and_task_prompt() -> None:
    env = ShopEnv(num_tasks=1)
    task = env.tasks()[0]
    messages, info = env.reset(task, seed=3)
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[0].content == ShopEnv.system_prompt
    assert messages[1].content == task.prompt
    assert info == {} and env.task is task


async def test_noop_env() -> None:
    env = NoopEnv()
    results, *_ = await env.step(calls(("noop", {}), ("noop", {})))
    assert [(r.content, r.is_error) for r in results] == [("ok", False), ("ok", False)]
    env.reset(env.tasks()[0])
    assert env.reward(_answered(env.tasks()[0], " Done ")) == {"done": 1.0}
    assert env.reward(_answered(env.tasks()[0], "not yet")) == {"done": 0.0}


# -- the optional contract: EnvDefaults, declared hooks, Wrapper, StepOutput -------------------------------


class RubricNotARubric(GoodEnv):
    rubric = {"correct": 1.0}  # type: ignore[assignment]


class FailureRewardNotANumber(GoodEnv):
    failure_reward = "0"  # type: ignore[assignment]


class TrainingNotABool(GoodEnv):
    training = "yes"  # type: ignore[assignment]


class KeepsTheTrainingClock(GoodEnv):
    """An env written for the removed ``set_step`` hook: refused, naming what replaces it."""

    def set_step(self, step: int, epoch: int = 0) -> None:
        pass


class ScoresItsOwnGroups(GoodEnv):
    def finalize_group(self, trajectories: list[Trajectory], task: Task | None) -> None:
        pass


class UserTurnTakesNothing(GoodEnv):
    def user_turn(self) -> Any:  # type: ignore[override]
        return [], True, False, {}


class ObserveContextOneArgument(GoodEnv):
    def observe_context(self, used_tokens: int) -> None:  # type: ignore[override]
        pass


class RuleWithoutTools(GoodEnv):
    scripted_rule = staticmethod(lambda messages: "4")  # type: ignore[assignment]


class CloseNeedsAnArgument(GoodEnv):
    def close(self, force: bool) -> None:  # type: ignore[override]
        pass


@pytest.mark.parametrize(
    ("env_cls", "problem"),
    [
        (RubricNotARubric, "rubric must be a taskrl.scoring.Rubric or None, got dict"),
        (FailureRewardNotANumber, "failure_reward must be a finite float, got '0'"),
        (TrainingNotABool, "training must be a bool, got 'yes'"),
        (KeepsTheTrainingClock, "'set_step' is no longer part of the env contract: envs are told nothing about "
                                "training: declare the schedule on the env's rubric"),
        (ScoresItsOwnGroups, "'finalize_group' is no longer part of the env contract: declare the group "
                             "measurement as a group term of the env's rubric (Rubric.group_terms)"),
        (UserTurnTakesNothing, "user_turn must take 1 positional argument: ()"),
        (ObserveContextOneArgument, "observe_context must take 2 positional arguments: (used_tokens: int)"),
        (RuleWithoutTools, "scripted_rule must take 2 positional arguments: (messages)"),
        (CloseNeedsAnArgument, "close must take 0 positional arguments: (force: bool)"),
    ],
)
async def test_check_env_checks_the_optional_contract(env_cls: type, problem: str) -> None:
    with pytest.raises(EnvCheckError) as err:
        await acheck_env(env_cls())
    assert str(err.value).startswith("env 'good': ") and problem in str(err.value), str(err.value)


class WeightPrefersTheWrongAnswer(GoodEnv):
    """Its measured terms favour the gold answer (1 + 0 against 0 + 0.75), but its rubric weighs them so that
    training scores the wrong answer higher (1.0 against 1.5): a raw sum would pass it, the scored totals do not."""

    rubric = Rubric(terms=[TermWeight("correct", 1.0), TermWeight("verbose", 2.0)])

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        correct = trajectory.final_answer == str(self.task.answer)
        return {"correct": float(correct), "verbose": 0.0 if correct else 0.75}


class GateRejectsEveryAnswer(GoodEnv):
    """A gate no bare answer passes, and terms that do not rank the gold answer first even before the gate."""

    rubric = Rubric(gates=[GateRule("cited")])

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"correct": 0.0, "cited": 0.0}


class GateNeedsATool(GoodEnv):
    """A gate on behaviour (the quickstart's "used_tool"): a bare answer fails it, so the check ranks the terms
    before the gate, where the gold answer comes first."""

    rubric = Rubric(gates=[GateRule("used_tool")])

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        used = any(c.name == "echo" for m in trajectory.messages for c in m.tool_calls)
        return {**super().reward(trajectory), "used_tool": float(used)}


async def test_check_env_compares_scored_totals_not_raw_sums() -> None:
    with pytest.raises(EnvCheckError, match="the gold answer scores 1.0, not more than a wrong answer \\(1.5\\)"):
        await acheck_env(WeightPrefersTheWrongAnswer())
    with pytest.raises(EnvCheckError, match="the gold answer scores 0.0, not more than a wrong answer \\(0.0\\)"):
        await acheck_env(GateRejectsEveryAnswer())
    await acheck_env(GateNeedsATool())


class PlainEnv:
    """A third-party env that does not inherit EnvDefaults: only the required contract, a plain 4-tuple step."""

    name = "plain"

    def __init__(self) -> None:
        self.tools = ToolSet()
        self.task: Task | None = None

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [TASK]

    def reset(self, task: Task, seed: int | None = None) -> Any:
        self.task = task
        return [Message("user", task.prompt)], {}

    def step(self, tool_calls: list[ToolCall]) -> Any:
        return [ToolResult(c.id, c.name, "no such tool", is_error=True) for c in tool_calls], False, False, {}

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"correct": float(trajectory.final_answer == "4")}


async def test_an_env_without_env_defaults_passes_and_reads_the_defaults() -> None:
    env = PlainEnv()
    await acheck_env(env)
    assert declared(env, "rubric") is None and declared(env, "failure_reward") == 0.0
    assert declared(env, "training") is True and declared(env, "user_turn") is None
    assert call_hook(env, "observe_context", 3, 1) is None and call_hook(env, "close") is None
    assert rubric_of(env).failure_reward == 0.0
    with pytest.raises(ValueError, match="'reward_fn' is not part of the optional env contract"):
        declared(env, "reward_fn")
    with pytest.raises(ValueError, match="'rubric' is not an optional env hook"):
        call_hook(env, "rubric")


def test_tool_env_declares_the_defaults() -> None:
    env = GoodEnv()
    assert isinstance(env, EnvDefaults) and env.unwrapped is env
    assert (env.rubric, env.failure_reward, env.training) == (None, 0.0, True)
    assert env.user_turn is None and env.scripted_rule is None
    assert env.observe_context(1, 2) is None and env.close() is None
    assert not hasattr(env, "set_step") and not hasattr(env, "finalize_group")  # envs know nothing of training


def test_step_output_reads_plain_tuples_and_names_the_env_on_a_wrong_shape() -> None:
    result = ToolResult("c1", "echo", "hi")
    out = step_output(([result], True, False, {"k": 1}), "mine")
    assert isinstance(out, StepOutput) and out.results == [result] and out.terminated and out.info == {"k": 1}
    results, terminated, truncated, info = out  # unpacks like the tuple it replaces
    assert (terminated, truncated) == (True, False)
    for bad, problem in [
        (([result], True, {}), "step must return (results, terminated, truncated, info), got a 3-tuple"),
        ([[result], True, False, {}], "got list"),
        ((result, True, False, {}), "a list of ToolResult"),
        (([result], 1, False, {}), "bools for terminated/truncated"),
        (([result], True, False, None), "a dict for info"),
    ]:
        with pytest.raises(EnvCheckError, match=r"^env 'mine': ") as err:
            step_output(bad, "mine")
        assert problem in str(err.value)


class Recorder(GoodEnv):
    """Records every optional hook it is called with."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []
        self.rubric = Rubric(failure_reward=-1.0)
        self.failure_reward = -1.0

    def user_turn(self, text: str) -> Any:
        return [Message("user", "go on")], True, False, {}

    def scripted_rule(self, messages: list[Message], tools: Any) -> str:
        return "4"

    def observe_context(self, used_tokens: int, max_tokens: int) -> None:
        self.calls.append(("observe_context", used_tokens, max_tokens))

    def record_episode(self, trajectory: Trajectory) -> None:
        self.calls.append(("record_episode", trajectory.id))

    def close(self) -> None:
        self.calls.append(("close",))


async def test_wrapper_forwards_the_whole_contract_explicitly() -> None:
    inner = Recorder()
    wrapped = Wrapper(Wrapper(inner))
    await acheck_env(wrapped)
    assert wrapped.name == "good" and wrapped.tools is inner.tools and wrapped.tasks() == [TASK]
    assert wrapped.unwrapped is inner and wrapped.rubric is inner.rubric and wrapped.failure_reward == -1.0
    assert wrapped.user_turn("x")[1] is True and wrapped.scripted_rule([], None) == "4"
    wrapped.observe_context(10, 20)
    wrapped.record_episode(Trajectory(id="t"))
    wrapped.close()
    assert inner.calls == [("observe_context", 10, 20), ("record_episode", "t"), ("close",)]
    wrapped.training, wrapped.name = False, "renamed"  # the loop's and make's writes reach the wrapped env
    assert inner.training is False and inner.name == "renamed"
    with pytest.raises(AttributeError):  # no __getattr__: only the declared contract is forwarded
        wrapped.calls  # noqa: B018


async def test_wrapper_of_an_env_without_env_defaults() -> None:
    wrapped = Wrapper(PlainEnv())
    await acheck_env(wrapped)
    assert wrapped.rubric is None and wrapped.user_turn is None and wrapped.unwrapped is wrapped.env
    assert wrapped.close() is None


def test_the_env_protocol_is_typed_without_any_returns() -> None:
    """Issue 39 item 5: every required method of ``Env`` says what it returns (sync or async), none ``Any``."""
    import typing

    import taskrl.env as env_module
    from taskrl.env import Env

    for method in ("tasks", "reset", "step", "reward"):
        hints = typing.get_type_hints(getattr(Env, method), vars(env_module))
        assert hints["return"] is not typing.Any, method
        assert "typing.Any]" not in str(hints["return"]).replace("dict[str, typing.Any]", ""), (method, hints)
