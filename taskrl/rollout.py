"""The agent loop: Env x Policy -> Trajectory, token-exact, many episodes at once.

``run_episode`` plays one episode; ``run_episodes`` plays groups of K episodes per task with bounded
concurrency and hands each trajectory to a callback the moment it finishes (so a crash loses nothing
already played). The loop knows nothing about training: it records the exact sampled token ids and
logprobs in ``Segment``s (observations appended once with loss_mask 0), the measured reward terms and metrics;
an episode is scored alone with ``taskrl.scoring.score`` (the trainer and eval re-score whole groups).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict

from taskrl import context as summaries
from taskrl.context import SummaryConfig
from taskrl.env import Env, EnvCheckError, call_hook, declared, maybe_await, reward_terms, step_output
from taskrl.parsing import ParsedTurn, parse_hermes, parse_openai
from taskrl.policies.base import (
    Completion,
    InvalidRequestError,
    Policy,
    PolicyError,
    PolicyTimeoutError,
    SamplingParams,
)
from taskrl.scoring import Clock, rubric_of, score
from taskrl.seeding import derive_seed as derive_seed  # re-exported: taskrl.rollout.derive_seed
from taskrl.types import InfraError, Message, Segment, Task, ToolResult, Trajectory
from taskrl.validate import at_least, require


class EpisodeInfo(TypedDict, total=False):
    """The ``Trajectory.info`` keys the loop writes (besides the env's ``reset`` info, which it copies in). Envs
    document their own keys where they write them (``SearchEnv.reward``, ``SwarmEnv.record_episode``,
    ``CodeEnv.reward``, ``SubagentRuntime.run``); ``FirstToolHint`` adds ``first_tool_hint`` at reset."""

    final_answer: str | None
    """The answer: the text of the last turn without tool calls, or the env's (a step info's ``final_answer``)."""
    truncation: Literal["max_context_tokens", "max_new_tokens", "max_turns", "env", "timeout"]
    """Why a truncated episode was cut off (``timeout``: a sub-agent past its wall limit)."""
    untrainable_reason: str
    """Why ``trainable`` is False although the episode ran (the backend gave no token ids)."""
    summaries: list[dict[str, Any]]
    """One ``taskrl.context.record`` per self-summary (``context.SUMMARIES_KEY``)."""
    infra_failure: dict[str, str]
    """``{"source", "detail"}`` when the env, its sandbox or the engine failed (``Trajectory.infra_failure``)."""


@dataclass
class RolloutConfig:
    """How episodes are played."""

    max_turns: int = 8
    """Assistant turns per episode; reaching it marks the episode truncated."""
    max_context_tokens: int = 4096
    """Tokens in the model's context (prompt + generated); reaching it marks the episode truncated."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling of each turn; its seed is replaced by one derived from the episode seed and turn."""
    group_size: int = 1
    """Episodes per task (K); GRPO needs K >= 2. Episodes of one task share a ``group_id``."""
    concurrency: int = 8
    """Episodes in flight at once."""
    seed: int = 0
    """Root seed; every episode and turn seed derives from it, so runs are reproducible."""
    training: bool = True
    """Set on every env (``env.training``) before reset: some add guidance only in training."""
    summary: SummaryConfig | None = None
    """Self-summarization at a token trigger (see ``taskrl.context``); None = off."""
    engine_failures: Literal["raise", "drop"] = "raise"
    """A ``PolicyError`` of the engine (server down, bad response; never an ``InvalidRequestError``, which is
    the caller's bug): ``raise`` stops the run, ``drop`` ends only that episode as an infrastructure failure
    (``Trajectory.infra_failure``, source ``engine``), left out of its group (the trainer drops)."""

    def __post_init__(self) -> None:
        require("RolloutConfig", "must be >= 1", at_least(1), max_turns=self.max_turns,
                max_context_tokens=self.max_context_tokens, group_size=self.group_size,
                concurrency=self.concurrency)  # fmt: skip
        if self.engine_failures not in ("raise", "drop"):
            raise ValueError(f"RolloutConfig.engine_failures must be 'raise' or 'drop', got {self.engine_failures!r}")
        if self.summary is not None and self.summary.trigger_tokens >= self.max_context_tokens:
            raise ValueError(
                f"RolloutConfig.summary.trigger_tokens ({self.summary.trigger_tokens}) must be below "
                f"max_context_tokens ({self.max_context_tokens}): the summary needs room to be written"
            )


class _SegmentBuilder:
    """Appends each turn's prompt delta (mask 0) and completion (mask 1) to the current segment.

    When the prompt a turn was sampled from does not extend the current segment (the context was
    pruned or summarised, or the backend re-rendered it differently) or the policy version changed,
    a new segment is opened. That one rule covers token mode and message mode.
    """

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.untokenised_turns = 0

    def add_turn(self, prompt_ids: list[int] | None, completion: Completion) -> None:
        if prompt_ids is None or not completion.token_ids or len(completion.logprobs) != len(
            completion.token_ids
        ):
            self.untokenised_turns += 1
            return
        seg = self.segments[-1] if self.segments else None
        n = len(seg) if seg else 0
        if seg is None or seg.policy_version != completion.policy_version or prompt_ids[:n] != seg.token_ids:
            seg = Segment(policy_version=completion.policy_version)
            self.segments.append(seg)
            n = 0
        seg.append(prompt_ids[n:], sampled=False)
        seg.append(completion.token_ids, sampled=True, logprobs=completion.logprobs)


class _Context:
    """The model's view: messages, and in token mode the exact token ids it will be prompted with."""

    def __init__(self, policy: Policy, messages: list[Message], tools: list[dict[str, Any]]) -> None:
        self.fmt = policy.chat_format
        self.tools = tools
        self.messages = list(messages)
        self.token_ids: list[int] | None = self.fmt.prompt_ids(self.messages, tools) if self.fmt else None
        self._observed_at: int | None = None  # where the last turn's observation tokens start
        self._observations: list[Message] = []

    def __len__(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else 0

    def add_turn(self, completion: Completion, assistant: Message, observations: list[Message]) -> None:
        """Append the sampled turn and its observations, each tokenised once."""
        self.messages.append(assistant)
        self.messages.extend(observations)
        if self.fmt is not None and self.token_ids is not None:
            closed = self.token_ids + completion.token_ids + self.fmt.close_turn_ids(completion.token_ids)
            self._observed_at, self._observations = len(closed), list(observations)
            self.token_ids = closed + (self.fmt.observation_ids(observations) if observations else [])

    def add_message(self, message: Message) -> None:
        """Append a forced message after the last turn's observations, still as an append (same Segment)."""
        self.messages.append(message)
        if self.fmt is None or self.token_ids is None:
            return
        if self._observed_at is None:  # nothing sampled since the last re-render
            self.token_ids = self.fmt.prompt_ids(self.messages, self.tools)
            return
        self._observations.append(message)  # re-render only the observation block: it ends in the generation prompt
        self.token_ids = self.token_ids[: self._observed_at] + self.fmt.observation_ids(self._observations)

    def replace(self, messages: list[Message]) -> None:
        """A non-append change (pruning, summary): re-render; the next turn opens a new Segment."""
        self.messages = list(messages)
        self._observed_at = None
        if self.fmt is not None:
            self.token_ids = self.fmt.prompt_ids(self.messages, self.tools)

    def estimated_tokens(self) -> int:
        """Tokens in the view: exact in token mode; otherwise ~4 characters per token plus ~4 per message."""
        if self.token_ids is not None:
            return len(self)
        calls = sum(len(c.name) + len(str(c.arguments)) for m in self.messages for c in m.tool_calls)
        return (sum(len(m.content) for m in self.messages) + calls) // 4 + 4 * len(self.messages)


def _parse(completion: Completion, env: Env, call_offset: int) -> ParsedTurn:
    if completion.tool_calls is not None:
        return parse_openai(completion.text, completion.tool_calls, env.tools)
    return parse_hermes(completion.text, env.tools, start=call_offset)


async def run_episode(
    env: Env,
    policy: Policy,
    task: Task,
    config: RolloutConfig,
    *,
    seed: int,
    group_id: str | None = None,
) -> Trajectory:
    """Play one episode. An env error (a bug, a broken sandbox, a reward() that raises) and a request past its time
    limit (``PolicyTimeoutError``) end the episode as an infrastructure failure; so does any engine error with
    ``config.engine_failures="drop"``, otherwise policy errors propagate."""
    start = time.perf_counter()
    traj = Trajectory(task_id=task.id, env=env.name, group_id=group_id, seed=seed)
    metrics = dict.fromkeys(
        ("turns", "tool_calls", "invalid_tool_calls", "tool_errors", "tool_cost", "context_resets", "capped_turns"),
        0.0,
    )  # capped_turns: turns cut by max_new_tokens, counted even when their complete calls still ran
    segments = _SegmentBuilder()
    try:
        env.training = config.training
        messages, info = await maybe_await(env.reset(task, seed=seed))
        traj.info.update({k: v for k, v in info.items() if k != "context"})
        ctx = _Context(policy, messages, env.tools.schemas())
        traj.messages = list(ctx.messages)
        opening = list(ctx.messages)  # what a self-summary's new view starts from
        calls_so_far = 0
        for turn in range(config.max_turns):
            room = config.max_context_tokens - len(ctx)
            if room < 1:
                traj.truncated, traj.info["truncation"] = True, "max_context_tokens"
                break
            sampling = replace(
                config.sampling,
                seed=(seed * 1_000_003 + turn) & 0x7FFFFFFF,  # cheaper than a hash, per turn
                max_new_tokens=min(config.sampling.max_new_tokens, room),
            )
            prompt_ids = ctx.token_ids
            completion = await policy.generate(
                token_ids=prompt_ids, messages=ctx.messages, tools=ctx.tools, sampling=sampling
            )
            segments.add_turn(prompt_ids if prompt_ids is not None else completion.prompt_token_ids, completion)
            parsed = _parse(completion, env, calls_so_far)
            calls_so_far += len(parsed.all_calls)
            metrics["turns"] += 1
            metrics["tool_calls"] += len(parsed.all_calls)
            metrics["invalid_tool_calls"] += len(parsed.invalid)
            metrics["capped_turns"] += completion.finish_reason == "length"
            assistant = Message("assistant", parsed.content, tool_calls=parsed.all_calls)
            traj.messages.append(assistant)
            # envs that show or enforce a token budget (Context-1) need this
            call_hook(env, "observe_context", _context_tokens(ctx, prompt_ids, completion), config.max_context_tokens)
            if completion.finish_reason == "length" and parsed.invalid:  # a tool call cut mid-way: never a call
                traj.truncated, traj.info["truncation"] = True, "max_new_tokens"
                break
            if parsed.is_final:
                traj.info["final_answer"] = parsed.final_answer
                user_turn = declared(env, "user_turn")
                if completion.finish_reason == "length":
                    traj.truncated, traj.info["truncation"] = True, "max_new_tokens"
                    break
                if user_turn is None:
                    traj.terminated = True
                    break
                observations, terminated, truncated, step_info = await maybe_await(user_turn(parsed.content))
            else:
                results, terminated, truncated, step_info = step_output(
                    await maybe_await(env.step(parsed.tool_calls)), env.name
                )
                metrics["tool_cost"] += env.tools.cost(parsed.tool_calls)
                results = _merge_results(parsed, results)
                metrics["tool_errors"] += sum(r.is_error for r in results)
                observations = [Message.from_result(r) for r in results]
            observations = list(observations) + step_info.get("append_messages", [])
            traj.messages.extend(observations)
            ctx.add_turn(completion, assistant, observations)
            if "context" in step_info:  # a new view, or a function of the current one (pruning)
                view = step_info["context"]
                ctx.replace(view(list(ctx.messages)) if callable(view) else view)
                metrics["context_resets"] += 1
            if "final_answer" in step_info:
                traj.info["final_answer"] = step_info["final_answer"]
            if terminated or truncated:
                traj.terminated, traj.truncated = bool(terminated), bool(truncated) and not terminated
                if traj.truncated:
                    traj.info["truncation"] = "env"
                break
            if config.summary is not None and not await _maybe_summarize(
                ctx, policy, config, config.summary, segments, traj, opening, turn
            ):
                traj.truncated, traj.info["truncation"] = True, "max_context_tokens"
                break
        else:
            traj.truncated, traj.info["truncation"] = True, "max_turns"
        traj.terms = await _measure(env, traj)  # the env measures; taskrl.scoring decides
    except InvalidRequestError:
        raise
    except PolicyTimeoutError as e:  # one slow request (a long generation) fails this episode, not the run
        traj.mark_infra_failure("engine", f"{type(e).__name__}: {e}")
    except PolicyError as e:
        if config.engine_failures == "raise":
            raise
        traj.mark_infra_failure("engine", f"{type(e).__name__}: {e}")
    except Exception as e:  # an env, sandbox or tool failure ends this episode, not the run; not the policy's fault
        traj.mark_infra_failure(e.source if isinstance(e, InfraError) else "env", f"{type(e).__name__}: {e}")
    traj.segments = segments.segments
    if segments.untokenised_turns:
        traj.trainable = False
        traj.info["untrainable_reason"] = "the policy backend reported no token ids for some turns"
    if config.summary is not None:
        metrics.update(summaries.summary_metrics(traj.info.get(summaries.SUMMARIES_KEY, [])))
    metrics["segments"] = len(traj.segments)
    metrics["tokens"] = traj.num_tokens
    metrics["sampled_tokens"] = traj.num_sampled_tokens
    metrics["wall_time_s"] = time.perf_counter() - start
    traj.metrics.update(metrics)
    # A provisional score of this episode alone at the start of training: group terms need the whole batch and
    # the training clock is the scorer's (the trainer and eval re-score the batch at theirs); envs never see it.
    score([traj], rubric_of(env), Clock())
    return traj


async def _measure(env: Env, traj: Trajectory) -> dict[str, float | None]:
    """The env's reward terms; an exception or a wrong shape names the env and ``reward()`` (the episode's
    error, counted in ``errors``), never a bare ``TypeError`` from deep inside the loop."""
    try:
        value = await maybe_await(env.reward(traj))
    except Exception as e:  # noqa: BLE001 - re-raised naming the method
        raise EnvCheckError(f"env '{env.name}': reward() raised {type(e).__name__}: {e}") from e
    return reward_terms(value, env.name)


async def _maybe_summarize(
    ctx: _Context,
    policy: Policy,
    config: RolloutConfig,
    summary: SummaryConfig,
    segments: _SegmentBuilder,
    traj: Trajectory,
    opening: list[Message],
    turn: int,
) -> bool:
    """At the trigger: compact the view to opening + a summary (a new segment). mode=self asks the agent (forced
    request, then trainable summary tokens, same segment); the harness modes write it outside the episode (see
    ``taskrl.context``). Returns False when no room is left to write it."""
    before = ctx.estimated_tokens()
    if not summaries.is_due(summary, before, len(traj.info.get(summaries.SUMMARIES_KEY, []))):
        return True
    seed = (((traj.seed or 0) * 1_000_003 + turn) & 0x7FFFFFFF) ^ 0x5A5A5A5A  # not the turn's own seed
    if summary.mode == "state_dump":
        text = summaries.state_dump(traj.messages)
        tokens = len(ctx.fmt.encode(text)) if ctx.fmt is not None else len(text) // 4
    elif summary.mode == "prompted":  # the same policy, a separate conversation: no segment, no training
        request_view = summaries.harness_request(summary, ctx.messages)
        ids = ctx.fmt.prompt_ids(request_view, None) if ctx.fmt is not None else None
        sampling = replace(config.sampling, seed=seed, max_new_tokens=summary.max_summary_tokens)
        completion = await policy.generate(token_ids=ids, messages=request_view, tools=None, sampling=sampling)
        text = summaries.summary_text(completion.text)
        tokens = len(completion.token_ids) if completion.token_ids else len(completion.text) // 4
    else:
        request = summaries.summary_request(summary)
        ctx.add_message(request)
        traj.messages.append(request)
        room = config.max_context_tokens - len(ctx)
        if room < 1:
            return False
        sampling = replace(config.sampling, seed=seed, max_new_tokens=min(summary.max_summary_tokens, room))
        prompt_ids = ctx.token_ids
        completion = await policy.generate(token_ids=prompt_ids, messages=ctx.messages, tools=ctx.tools,
                                           sampling=sampling)  # fmt: skip
        segments.add_turn(prompt_ids if prompt_ids is not None else completion.prompt_token_ids, completion)
        text = summaries.summary_text(completion.text)
        tokens = len(completion.token_ids) if completion.token_ids else len(completion.text) // 4
        traj.messages.append(Message("assistant", text))
    view = summaries.compacted_view(opening, text, summary)
    ctx.replace(view)
    traj.messages.append(view[-1])
    record = summaries.record(turn, len(traj.messages) - 1, text, before, ctx.estimated_tokens(),
                              mode=summary.mode, summary_tokens=tokens)  # fmt: skip
    traj.info.setdefault(summaries.SUMMARIES_KEY, []).append(record)
    return True


def _context_tokens(ctx: _Context, prompt_ids: list[int] | None, completion: Completion) -> int:
    """Tokens in the model's view after this turn: exact in token mode, else as reported or estimated."""
    prompt = prompt_ids if prompt_ids is not None else completion.prompt_token_ids
    if prompt is not None and completion.token_ids:
        return len(prompt) + len(completion.token_ids)
    return sum(len(m.content) for m in ctx.messages) // 4 + len(completion.text) // 4  # ~4 chars per token


def _merge_results(parsed: ParsedTurn, env_results: list[ToolResult]) -> list[ToolResult]:
    """Results in the order the model wrote its calls: env results for valid calls, errors for the rest."""
    by_id = {r.call_id: r for r in env_results}
    by_id.update({c.id: r for c, r in parsed.invalid})
    missing = [c for c in parsed.all_calls if c.id not in by_id]
    for c in missing:
        by_id[c.id] = ToolResult(c.id, c.name, "The environment returned no result for this call.", True)
    return [by_id[c.id] for c in parsed.all_calls]


async def run_episodes(
    env_factory: Callable[[], Env],
    policy: Policy,
    tasks: Sequence[Task],
    config: RolloutConfig,
    *,
    on_trajectory: Callable[[Trajectory], Any] | None = None,
    task_indices: Sequence[int] | None = None,
    done: Mapping[int, Trajectory] | None = None,
) -> list[Trajectory]:
    """Play ``config.group_size`` episodes of every task, at most ``config.concurrency`` at once.

    Each episode gets a fresh env from ``env_factory``. Trajectories come back in task order;
    ``on_trajectory`` sees each one as soon as it finishes. Episode seeds come from ``config.seed``, the task's
    index and id and the sample number; ``task_indices`` gives each task its index in the whole batch when
    ``tasks`` is a share of it (a data-parallel rank, a Ray worker), so every share samples what one process would.
    ``done`` holds episodes already played, by seed (a resumed evaluation): each is returned in its place as it
    is, neither replayed nor passed to ``on_trajectory``.
    """
    if task_indices is not None and len(task_indices) != len(tasks):
        raise ValueError(f"task_indices has {len(task_indices)} entries for {len(tasks)} tasks")
    indices = list(task_indices) if task_indices is not None else list(range(len(tasks)))
    limit = asyncio.Semaphore(config.concurrency)

    async def play(task_index: int, task: Task, k: int) -> Trajectory:
        seed = derive_seed(config.seed, task_index, task.id, k)
        if done is not None and seed in done:
            return done[seed]
        async with limit:
            env = env_factory()
            group = f"{task.id}#{config.seed}" if config.group_size > 1 else None
            try:
                traj = await run_episode(env, policy, task, config, seed=seed, group_id=group)
            finally:
                await maybe_await(call_hook(env, "close"))
            if on_trajectory is not None:
                await maybe_await(on_trajectory(traj))
            return traj

    jobs = [
        asyncio.ensure_future(play(i, task, k))
        for i, task in zip(indices, tasks, strict=True)
        for k in range(config.group_size)
    ]
    try:
        return list(await asyncio.gather(*jobs))
    except BaseException:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise


def error_note(trajectories: Sequence[Trajectory]) -> str | None:
    """One line for a batch with failed episodes: how many, and the first error (None when there are none)."""
    failed = [t for t in trajectories if t.error is not None]
    if not failed:
        return None
    return f"{len(failed)} of {len(trajectories)} episodes ended in an error (reward 0), e.g. {failed[0].error}"


def __getattr__(name: str) -> Any:
    if name == "summarize":  # an ImportError: ``from taskrl.rollout import summarize`` keeps this message
        raise ImportError(
            "taskrl.rollout.summarize was removed: use taskrl.scoring.batch_metrics (keys rewards/total, "
            "rewards/<term>, tools/turns, tools/tool_calls, charts/episodes, charts/errors, ...)"
        )
    raise AttributeError(f"module 'taskrl.rollout' has no attribute {name!r}")
