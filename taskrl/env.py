"""The environment contract, the registry, and ``check_env``.

``make(name)`` finds an env by registered name (``register``, ``taskrl env list``), by ``"module:Class"`` or
``"module:factory"`` (a module on ``sys.path``, in the current directory, or a ``.py`` path), or by an installed
package's ``taskrl.envs`` entry point; every command that takes ``--env`` (and ``train``'s ``env``) goes through it.

An env has ``name``, ``tools`` (a ToolSet), ``tasks(split)``, ``reset(task, seed) -> (messages, info)``,
``step(tool_calls) -> StepOutput(results, terminated, truncated, info)`` and ``reward(trajectory) -> {term: value}``
(unweighted measurements, or one float; ``taskrl.scoring`` turns them into the reward). Methods may be sync or
async. ``ToolEnv`` implements ``step`` for the common case (run the calls on its tools; ``reset`` keeps the task in
``self.task``); subclass it and write tools, tasks and a reward. ``check_env`` is run on every registered env.
``step`` may return a plain 4-tuple; the loop reads it with ``step_output``, naming the env when the shape is wrong.

``step``'s info may hold ``"context"``: a new ``list[Message]`` view of the conversation, or a function from the
current view (this step's tool results included) to the new one (pruning, summaries; the loop re-renders and opens
a new token Segment); ``"append_messages"``: messages added after the tool results; ``"final_answer"``: the
episode's answer when the env decides it (a submit tool).

The optional contract, declared with its defaults on ``EnvDefaults`` (``ToolEnv`` inherits it; ``check_env``
checks every hook an env has):

- ``rubric`` (None): a ``taskrl.scoring.Rubric``, the reward declared: its terms with their measuring functions
  (``ToolEnv.reward`` returns ``rubric.measure(trajectory, task)`` by default), measurements, derived terms, group
  terms, gates and clamp. None: every term ``reward`` returns at weight 1, failures at ``failure_reward``.
  An env is told nothing about training: schedules (annealed weights, Context-1's β) are the rubric's, applied
  by ``taskrl.scoring.score`` at the batch's ``Clock`` (there is no ``set_step`` or ``finalize_group`` hook).
- ``failure_reward`` (0.0): the reward of a failed episode; no invalid call and no failed gate scores above it.
- ``training`` (True): the loop sets it to ``RolloutConfig.training`` before reset; envs that add guidance only in
  training rollouts (Context-1's "prune or answer" note) read it. Eval and sub-agents play with False.
- ``user_turn`` (None): ``user_turn(text) -> (messages, terminated, truncated, info)``, a simulated user who answers
  a turn without tool calls and lets the conversation go on. None: such a turn ends the episode.
- ``scripted_rule`` (None): ``rule(messages, tools) -> str``, the env's expert (``--policy scripted``, SFT warm-up).
- ``observe_context(used_tokens, max_tokens)`` (no-op): after every sampled turn and before ``step``, how many
  tokens the model's view holds (token budgets, "[Token usage: ...]" lines).
- ``record_episode(trajectory)`` (no-op): write the env's keys and children into a trajectory without scoring it
  (a nested swarm under ``SubagentEnv``).
- ``close()`` (no-op, may be async): release the episode's resources; the loop calls it after every episode.
- ``unwrapped`` (the env itself): the innermost env under any ``Wrapper``s.

``Wrapper(env)`` is the base of env wrappers (``LoopGuard``, ``FirstToolHint``, ``SubagentEnv``): it forwards the
whole contract to ``env`` explicitly, so a wrapper overrides only what it changes. Envs that do not inherit
``EnvDefaults`` still work: the loop reads their optional contract with ``declared(env, name)``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from taskrl.hooks import HOOK_ARITY, REMOVED_HOOKS, call_hook, declared
from taskrl.tools import ToolSet
from taskrl.types import Message, Task, ToolCall, ToolResult, Trajectory
from taskrl.validate import did_you_mean

if TYPE_CHECKING:
    from taskrl.scoring import Rubric

T = TypeVar("T")


class StepOutput(NamedTuple):
    """What ``step`` returns; a plain 4-tuple in this order is read the same (``step_output``)."""

    results: list[ToolResult]
    """One result per executed call, carrying the call's id."""
    terminated: bool
    """The task ended (an answer was submitted, the goal reached)."""
    truncated: bool
    """A budget of the env ran out; the episode was cut off, not finished."""
    info: dict[str, Any]
    """Optional keys the loop reads: ``context``, ``append_messages``, ``final_answer``."""


class UnknownEnvError(KeyError):
    """No env is registered under the requested name."""

    def __str__(self) -> str:  # KeyError would print the message with quotes
        return str(self.args[0])


class EnvCheckError(AssertionError):
    """An env breaks the contract; the message names the env, the method and what was wrong."""


ResetOutput = tuple[list[Message], dict[str, Any]]
"""What ``reset`` returns: the episode's first messages and an info dict."""
StepResult = StepOutput | tuple[list[ToolResult], bool, bool, dict[str, Any]]
"""What ``step`` returns: a ``StepOutput`` or the same four values as a plain tuple (read by ``step_output``)."""
RewardOutput = dict[str, float | None] | float
"""What ``reward`` returns: unweighted measured terms (None = not applicable), or one number (the term
``reward``); read by ``reward_terms``."""
MaybeAwaitable = T | Awaitable[T]
"""A method of the contract may be sync or async."""


@runtime_checkable
class Env(Protocol):
    """The required contract (see the module docstring); methods may be sync or async."""

    name: str
    tools: ToolSet

    def tasks(self, split: str = "train") -> Sequence[Task]: ...

    def reset(self, task: Task, seed: int | None = None) -> MaybeAwaitable[ResetOutput]: ...

    def step(self, tool_calls: list[ToolCall]) -> MaybeAwaitable[StepResult]: ...

    def reward(self, trajectory: Trajectory) -> MaybeAwaitable[RewardOutput]: ...


def step_output(value: Any, env_name: str) -> StepOutput:
    """``step``'s return value as a ``StepOutput``; ``EnvCheckError`` naming the env when its shape is wrong."""
    if not (isinstance(value, tuple) and len(value) == 4):
        got = f"a {len(value)}-tuple" if isinstance(value, tuple) else type(value).__name__
        raise EnvCheckError(f"env '{env_name}': step must return (results, terminated, truncated, info), got {got}")
    results, terminated, truncated, info = value
    if not isinstance(results, list) or not all(isinstance(r, ToolResult) for r in results):
        raise EnvCheckError(f"env '{env_name}': step must return a list of ToolResult as its results")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool) or not isinstance(info, dict):
        raise EnvCheckError(f"env '{env_name}': step must return bools for terminated/truncated and a dict for info")
    return StepOutput(results, terminated, truncated, info)


def reward_terms(value: Any, env_name: str) -> dict[str, float | None]:
    """``reward``'s return value as measured terms: a dict of term name -> number (bools count 0/1) or None (not
    applicable), or one number (the term ``reward``). ``EnvCheckError`` naming ``reward()`` and what it must return."""
    must = "reward() must return a dict of term name -> float (or None), e.g. {'correct': 1.0}, or one float"
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = {"reward": value}
    if not isinstance(value, dict):
        raise EnvCheckError(f"env '{env_name}': {must}; got {type(value).__name__} {str(value)[:80]!r}")
    terms: dict[str, float | None] = {}
    for name, term in value.items():
        number = isinstance(term, int | float)
        if not isinstance(name, str) or not (term is None or number) or (number and not math.isfinite(term)):
            raise EnvCheckError(f"env '{env_name}': {must}; got {str(name)[:40]!r}: {str(term)[:40]!r}")
        terms[name] = None if term is None else float(term)
    return terms


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class EnvDefaults:
    """The optional env contract with its defaults (see the module docstring); ``ToolEnv`` inherits it."""

    rubric: Rubric | None = None
    """How the measured terms become the reward; None: every term at weight 1 (``taskrl.scoring.rubric_of``)."""
    failure_reward: float = 0.0
    """Reward of a failed episode; trajectories with invalid tool calls or failed gates score no better."""
    training: bool = True
    """Set by the loop before reset (``RolloutConfig.training``): False in eval and sub-agent episodes."""
    user_turn: Callable[[str], Any] | None = None
    """``user_turn(text) -> (messages, terminated, truncated, info)``; None: a turn without tool calls ends it."""
    scripted_rule: Callable[[list[Message], list[dict[str, Any]] | None], str] | None = None
    """The env's expert ``rule(messages, tools) -> str``; None: the env has none."""

    def observe_context(self, used_tokens: int, max_tokens: int) -> None:
        """Tokens in the model's view after a sampled turn, before ``step``."""

    def record_episode(self, trajectory: Trajectory) -> None:
        """Write the env's keys and children into ``trajectory`` without scoring it."""

    def close(self) -> Any:
        """Release the episode's resources (may return an awaitable)."""

    @property
    def unwrapped(self) -> Any:
        """The innermost env under any wrappers: this env."""
        return self


class Wrapper(EnvDefaults):
    """An env around ``env`` (Gymnasium's ``Wrapper``): forwards the whole contract explicitly, so a subclass
    overrides only what it changes. Writes of ``name`` and ``training`` reach the wrapped env."""

    def __init__(self, env: Env) -> None:
        self.env = env

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.env.name

    @name.setter
    def name(self, value: str) -> None:
        self.env.name = value

    @property
    def tools(self) -> ToolSet:
        return self.env.tools

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self.env.tasks(split)

    def reset(self, task: Task, seed: int | None = None) -> MaybeAwaitable[ResetOutput]:
        return self.env.reset(task, seed=seed)

    def step(self, tool_calls: list[ToolCall]) -> MaybeAwaitable[StepResult]:
        return self.env.step(tool_calls)

    def reward(self, trajectory: Trajectory) -> MaybeAwaitable[RewardOutput]:
        return self.env.reward(trajectory)

    @property
    def rubric(self) -> Rubric | None:  # type: ignore[override]
        return declared(self.env, "rubric")

    @property
    def failure_reward(self) -> float:  # type: ignore[override]
        return declared(self.env, "failure_reward")

    @property
    def training(self) -> bool:  # type: ignore[override]
        return declared(self.env, "training")

    @training.setter
    def training(self, value: bool) -> None:
        self.env.training = value  # type: ignore[attr-defined]

    @property
    def user_turn(self) -> Callable[[str], Any] | None:  # type: ignore[override]
        return declared(self.env, "user_turn")

    @property
    def scripted_rule(self) -> Callable[[list[Message], list[dict[str, Any]] | None], str] | None:  # type: ignore[override]
        return declared(self.env, "scripted_rule")

    def observe_context(self, used_tokens: int, max_tokens: int) -> None:
        call_hook(self.env, "observe_context", used_tokens, max_tokens)

    def record_episode(self, trajectory: Trajectory) -> None:
        call_hook(self.env, "record_episode", trajectory)

    def close(self) -> Any:
        return call_hook(self.env, "close")

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped if isinstance(self.env, EnvDefaults) else self.env


class ToolEnv(EnvDefaults):
    """Base class: an env whose actions are calls to its ``@tool`` methods.

    Subclasses set ``name`` and ``system_prompt``, define ``@tool`` methods, ``tasks``, and a ``rubric`` (whose
    terms measure the episode: the default ``reward``) or their own ``reward``; ``reset`` stores the task in
    ``self.task`` and opens with the system prompt and the task prompt.
    """

    name: str = "tool_env"
    system_prompt: str = "You are a helpful assistant. Use the tools when they help."
    max_parallel: int | None = None
    sequential_tools: bool = False
    """Run a turn's tool calls in call order, one at a time (``ToolSet.sequential``): set it when the tools share
    episode state, so a turn's observations depend only on its calls."""

    def __init__(self) -> None:
        self.tools = ToolSet.from_object(self, max_parallel=self.max_parallel, sequential=self.sequential_tools)
        self.task: Task | None = None

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return []

    def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        self.task = task
        return [Message("system", self.system_prompt), Message("user", task.prompt)], {}

    async def step(self, tool_calls: list[ToolCall]) -> StepOutput:
        return StepOutput(await self.tools.execute(tool_calls), False, False, {})

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        """The rubric's measurement of the episode (``Rubric.measure``); {} without a rubric."""
        return self.rubric.measure(trajectory, self.task) if self.rubric is not None else {}


@dataclass(frozen=True)
class EntryPoint:
    """A factory named by ``"module:attribute"`` and imported when first called (Gymnasium's ``entry_point``):
    how the built-in envs are registered without the contract importing them, so ``taskrl env list`` and
    ``import taskrl.env`` load no env's dependencies and no import cycle runs through the registry.
    ``module`` may also be a ``.py`` file path; a module not on ``sys.path`` is looked up in the current
    directory (as ``python -m`` would), so ``taskrl rollout --env my_env:MyEnv`` works beside ``my_env.py``."""

    target: str

    def resolve(self) -> Callable[..., Env]:
        """The factory itself; ``UnknownEnvError`` naming the module or attribute that cannot be found."""
        module_name, sep, attribute = self.target.rpartition(":")
        if not sep or not module_name or not attribute:
            raise UnknownEnvError(f"env '{self.target}' is not 'module:attribute' (e.g. my_env:MyEnv)")
        module = _import_env_module(module_name, self.target)
        factory = module
        for part in attribute.split("."):
            if not hasattr(factory, part):
                raise UnknownEnvError(f"env '{self.target}': module '{module_name}' has no attribute '{attribute}'")
            factory = getattr(factory, part)
        if not callable(factory):
            raise UnknownEnvError(f"env '{self.target}': '{attribute}' is a {type(factory).__name__}, not an env "
                                  "class or a factory function")  # fmt: skip
        return factory

    def __call__(self, **kwargs: Any) -> Env:
        return self.resolve()(**kwargs)


def _import_env_module(module_name: str, target: str) -> Any:
    """Import ``module_name`` (a dotted module or a ``.py`` path), trying the current directory last."""
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise UnknownEnvError(f"env '{target}': no file {str(path)!r}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise UnknownEnvError(f"env '{target}': cannot import {str(path)!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)  # pickling (Ray workers) finds the env's classes by module name
        spec.loader.exec_module(module)
        return module
    cwd = os.getcwd()
    for attempt in ("sys.path", "cwd"):
        if attempt == "cwd":
            if cwd in sys.path:
                break
            sys.path.append(cwd)
            importlib.invalidate_caches()
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as e:  # the env's module itself, or something it imports?
            if e.name is None or not (module_name == e.name or module_name.startswith(e.name + ".")):
                raise  # the env's module imports something missing: its traceback says what
    raise UnknownEnvError(f"env '{target}': no module named '{module_name}' on sys.path or in {cwd}; run from the "
                          "directory that holds it, set PYTHONPATH, or pip install its package")


@dataclass
class EnvSpec:
    name: str
    factory: Callable[..., Env]
    description: str = ""


BUILTIN_ENVS: dict[str, tuple[str, str]] = {
    "shop": ("taskrl.envs.builtin:ShopEnv", "look up item prices and compute an order total (2 tools)"),
    "price": ("taskrl.envs.builtin:PriceEnv", "look up one price, answer quantity x price (1 tool; the demo env)"),
    "prices": ("taskrl.envs.prices:PricesEnv", "look up 1-3 prices, list them (1 tool; the learning recipe env)"),
    "noop": ("taskrl.envs.builtin:NoopEnv", "call a no-op tool N times, then answer 'done' (loop benchmarks)"),
    "reverse_text": ("taskrl.envs.reverse_text:ReverseTextEnv",
                     "reverse a random lowercase string; LCS-ratio reward (prime-rl's reverse-text; no tools)"),
    "countdown": ("taskrl.envs.countdown:CountdownEnv",
                  "reach a target from 3 numbers with + - * / (exact checker, no expert; no tools)"),
    "arithmetic": ("taskrl.envs.arithmetic:ArithmeticEnv",
                   "one + - * on two numbers <= 20, answered with the number (exact checker, no expert; no tools)"),
    "code-humaneval": ("taskrl.envs.code:make_humaneval_env",
                       "Composer coding: HumanEval in a sandbox, hidden tests"),
    "code-bugs": ("taskrl.envs.code:make_codebugs_env", "Composer coding: fix bugs mined from PyPI projects"),
    "swarm": ("taskrl.recipes:make_swarm_env",
              "Kimi PARL agent swarm: orchestrator + frozen concurrent sub-agents"),
    "search": ("taskrl.recipes:make_search_env",
               "Context-1 agentic search: hybrid search, prune_chunks, F-beta reward"),
}  # fmt: skip
"""The built-in envs: name -> (entry point, description)."""

_REGISTRY: dict[str, EnvSpec] = {
    name: EnvSpec(name, EntryPoint(target), description) for name, (target, description) in BUILTIN_ENVS.items()
}


ENTRY_POINT_GROUP = "taskrl.envs"
"""Installed packages add envs under this entry-point group: ``[project.entry-points."taskrl.envs"]
unitconv = "unitconv.env:UnitConvEnv"`` in their pyproject.toml."""


def register(name: str, factory: Callable[..., Env], *, description: str = "", overwrite: bool = False) -> None:
    """Make ``make(name)`` build an env with ``factory(**kwargs)``; ``description`` shows in ``taskrl env list``."""
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"env '{name}' is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = EnvSpec(name, factory, description)


def _installed_envs() -> dict[str, EnvSpec]:
    """Envs of installed packages (the ``taskrl.envs`` entry-point group), read from their metadata only."""
    from importlib.metadata import entry_points

    specs: dict[str, EnvSpec] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        package = point.dist.name if point.dist is not None else "an installed package"
        specs.setdefault(point.name, EnvSpec(point.name, EntryPoint(point.value), f"{point.value} (from {package})"))
    return specs


def registry() -> dict[str, EnvSpec]:
    """All registered envs: the built-in ones, ``register``ed ones, and installed packages' ``taskrl.envs`` entry
    points (a registered name wins over an entry point of the same name; nothing is imported until ``make``)."""
    return {**_installed_envs(), **_REGISTRY}


def make(name: str, **kwargs: Any) -> Env:
    """Build env ``name``: a registered name (``taskrl env list``), an installed package's ``taskrl.envs`` entry
    point, or ``"module:Class"`` / ``"module:factory"`` (``module`` may be a ``.py`` path). An env that does not
    name itself (``ToolEnv``'s default ``tool_env``) takes ``name``, so trajectories and reports say which env."""
    specs = registry()
    if name in specs:
        factory: Callable[..., Env] = specs[name].factory
    elif ":" in name:
        factory = EntryPoint(name).resolve()
    else:
        raise UnknownEnvError(
            f"unknown env '{name}'; registered envs: {', '.join(sorted(specs)) or 'none'} "
            "(see `taskrl env list`); your own env: --env my_module:MyEnv, or an entry point in the "
            f"'{ENTRY_POINT_GROUP}' group of your package"
        )
    _check_kwargs(name, factory, kwargs)
    env = factory(**kwargs)
    if not declared(env, "name") or env.name == ToolEnv.name:
        env.name = name
    return env


class EnvKwargsError(ValueError):
    """An env's keyword arguments (``env_kwargs``, ``--env-kwargs``) name a parameter its constructor lacks."""


def _check_kwargs(name: str, factory: Callable[..., Env], kwargs: dict[str, Any]) -> None:
    """Refuse a keyword the factory does not take, in one line naming it, the closest parameter and all of them
    (instead of a TypeError traceback from deep inside the first episode or the trainer)."""
    if isinstance(factory, EntryPoint):
        factory = factory.resolve()
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read: the call itself reports
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in accepted:
            takes = ", ".join(accepted) or "no arguments"
            raise EnvKwargsError(f"env '{name}' takes no argument '{key}'{did_you_mean(key, accepted)}; "
                                 f"its arguments: {takes}")  # fmt: skip


def _takes(fn: Callable[..., Any], arity: int) -> bool:
    """Whether ``fn`` can be called with ``arity`` positional arguments (True where Python cannot tell)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return True
    try:
        signature.bind(*range(arity))
    except TypeError:
        return False
    return True


def _check_optional(env: Any, fail: Callable[[str], None]) -> None:
    """The optional contract: declared values of the right type, hooks callable with their arguments."""
    from taskrl.scoring import Rubric  # the scoring leaf is imported by the loop; the env contract sits above it

    rubric = declared(env, "rubric")
    if rubric is not None and not isinstance(rubric, Rubric):
        fail(f"rubric must be a taskrl.scoring.Rubric or None, got {type(rubric).__name__}")
    failure = declared(env, "failure_reward")
    if isinstance(failure, bool) or not isinstance(failure, int | float) or not math.isfinite(failure):
        fail(f"failure_reward must be a finite float, got {failure!r}")
    if not isinstance(declared(env, "training"), bool):
        fail(f"training must be a bool, got {declared(env, 'training')!r}")
    for name, replacement in REMOVED_HOOKS.items():
        if getattr(env, name, None) is not None:
            fail(f"'{name}' is no longer part of the env contract: {replacement}")
    for name, arity in HOOK_ARITY.items():
        fn = declared(env, name)
        if fn is None:
            continue
        if not callable(fn):
            fail(f"{name} must be callable or None, got {type(fn).__name__}")
        if not _takes(fn, arity):
            fail(f"{name} must take {arity} positional argument{'s' if arity != 1 else ''}: {inspect.signature(fn)}")


async def acheck_env(env: Env, *, num_tasks: int = 3) -> None:
    """Exercise an env through the contract; raise ``EnvCheckError`` naming what is wrong."""
    env_name = declared(env, "name") or type(env).__name__

    def fail(msg: str) -> None:
        raise EnvCheckError(f"env '{env_name}': {msg}")

    async def call(method: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await maybe_await(fn(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - reported as a contract failure naming the method
            fail(f"{method} raised {type(e).__name__}: {e}")

    async def reward_for_answer(task: Task, messages: list[Message], answer: str) -> tuple[float, float]:
        """The episode's scored total (``taskrl.scoring.score`` with the env's rubric, as training scores it), and
        the same without the rubric's gates (a bare answer cannot satisfy a gate on behaviour, e.g. a tool call)."""
        import dataclasses

        from taskrl.scoring import Clock, rubric_of, score

        await call("reset", env.reset, task, seed=0)
        pair = [Trajectory(task_id=task.id, messages=[*messages, Message("assistant", answer)], terminated=True)
                for _ in range(2)]  # fmt: skip
        for traj in pair:
            traj.info["final_answer"] = answer
        terms = reward_terms(await call("reward", env.reward, pair[0]), env_name)
        for traj in pair:
            traj.terms = dict(terms)
        rubric = rubric_of(env)
        score([pair[0]], rubric, Clock())
        score([pair[1]], dataclasses.replace(rubric, gates=()), Clock())
        return pair[0].reward, pair[1].reward

    for attr in ("tools", "tasks", "reset", "step", "reward"):
        if not hasattr(env, attr):
            fail(f"missing '{attr}'")
    if not isinstance(env.tools, ToolSet):
        fail(f"tools must be a ToolSet, got {type(env.tools).__name__}")
    for schema in env.tools.schemas():
        fn = schema.get("function", {})
        if not fn.get("name") or not fn.get("description") or fn.get("parameters", {}).get("type") != "object":
            fail(f"tool schema incomplete: {schema}")
    _check_optional(env, fail)
    tasks = list(await call("tasks", env.tasks, "train"))[:num_tasks]
    if not tasks:
        fail("tasks('train') returned no tasks")
    for task in tasks:
        if not isinstance(task, Task):
            fail(f"tasks() must yield Task objects, got {type(task).__name__}")
        out = await call("reset", env.reset, task, seed=0)
        if not (isinstance(out, tuple) and len(out) == 2):
            fail("reset must return (messages, info)")
        messages, info = out
        if not messages or not all(isinstance(m, Message) for m in messages) or not isinstance(info, dict):
            fail("reset must return a non-empty list[Message] and a dict")
        bogus = ToolCall("call_check", "__no_such_tool__", {})
        results = step_output(await call("step", env.step, [bogus]), env_name).results
        if len(results) != 1 or not results[0].is_error or results[0].call_id != "call_check":
            fail("step must answer an unknown tool with one error ToolResult carrying the call id")
        if task.answer is not None:
            (gold, gold_ungated) = await reward_for_answer(task, messages, str(task.answer))
            (wrong, wrong_ungated) = await reward_for_answer(task, messages, "__certainly wrong__")
            # A gate the bare gold answer fails (e.g. "used_tool") needs behaviour this check does not play: then
            # the terms before the gates must still rank the gold answer first.
            gated_out = gold == wrong and gold_ungated != gold
            if not (gold > wrong or (gated_out and gold_ungated > wrong_ungated)):
                fail(f"task {task.id}: the gold answer scores {gold}, not more than a wrong answer ({wrong})")


def check_env(env: Env, *, num_tasks: int = 3) -> None:
    """Synchronous wrapper of ``acheck_env`` for scripts and the CLI."""
    import asyncio

    asyncio.run(acheck_env(env, num_tasks=num_tasks))
