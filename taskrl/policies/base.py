"""The Policy contract: what the agent loop asks of any model (in-process, served, or scripted).

A policy either works on token ids (``chat_format`` is set: the loop renders and keeps the exact token
sequence, and calls ``generate(token_ids=...)``) or on messages (``chat_format`` is None: the loop sends
messages and tool schemas, and keeps whatever token ids the backend reports). Both return a
``Completion``. All generation is async so many episodes can share one policy. ``PolicyBase`` holds the
optional members (context size, lifecycle) with their defaults; the built-in policies subclass it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from taskrl.types import Message, ToolCall

if TYPE_CHECKING:
    from taskrl.chat import ChatFormat

T = TypeVar("T")


class PolicyError(RuntimeError):
    """A policy could not produce a completion (model missing, server unreachable, bad response)."""


class PolicyTimeoutError(PolicyError):
    """One request ran past its time limit; the server may be fine (a long generation): the episode that sent it
    fails and the run goes on (``run_episode`` records it as the episode's error)."""


class InvalidRequestError(PolicyError, ValueError):
    """A generate request that cannot be served as asked (sampling parameters, seed, prompt, context room).

    Raised before the request joins a batch, so nothing ran and no neighbour is affected; a server answers it
    with HTTP 400. It is a ``PolicyError`` (callers that catch those keep working) and a ``ValueError``.
    """


SEED_RANGE = (-(2**63), 2**64)
"""Seeds must fit 64 bits: ``low <= seed < high``, exactly what ``torch.Generator.manual_seed`` accepts."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def validate_sampling(sampling: SamplingParams) -> None:
    """Raise ``InvalidRequestError`` naming the field if ``sampling`` cannot be served (checked again at submit:
    the dataclass is mutable, and a server builds it from hostile request fields)."""
    where = "SamplingParams"
    if not _is_int(sampling.max_new_tokens) or sampling.max_new_tokens < 1:
        raise InvalidRequestError(f"{where}.max_new_tokens must be an integer >= 1, got {sampling.max_new_tokens!r}")
    if not _is_real(sampling.temperature) or not math.isfinite(sampling.temperature) or sampling.temperature < 0:
        raise InvalidRequestError(f"{where}.temperature must be a finite number >= 0, got {sampling.temperature!r}")
    if not _is_real(sampling.top_p) or not 0 < sampling.top_p <= 1:  # NaN fails the comparison too
        raise InvalidRequestError(f"{where}.top_p must be in (0, 1], got {sampling.top_p!r}")
    if not _is_real(sampling.min_p) or not 0 <= sampling.min_p <= 1:
        raise InvalidRequestError(f"{where}.min_p must be in [0, 1], got {sampling.min_p!r}")
    if not _is_int(sampling.top_k) or sampling.top_k < 0:
        raise InvalidRequestError(f"{where}.top_k must be an integer >= 0, got {sampling.top_k!r}")
    low, high = SEED_RANGE
    if sampling.seed is not None and (not _is_int(sampling.seed) or not low <= sampling.seed < high):
        raise InvalidRequestError(f"{where}.seed must be None or an integer in [-2**63, 2**64), got {sampling.seed!r}")
    if not isinstance(sampling.stop, list | tuple) or not all(isinstance(s, str) for s in sampling.stop):
        raise InvalidRequestError(f"{where}.stop must be a list of strings, got {sampling.stop!r}")
    names = sampling.force_tool_call
    if not isinstance(names, tuple | list) or not all(isinstance(n, str) and n for n in names):
        raise InvalidRequestError(f"{where}.force_tool_call must be a tuple of function names, got {names!r}")


@dataclass
class SamplingParams:
    """How to sample one assistant turn."""

    max_new_tokens: int = 256
    """Most tokens sampled in one turn."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (logprobs are then those of the temperature-1 distribution)."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 disables it."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables it."""
    min_p: float = 0.0
    """Keep only tokens at least ``min_p`` times as likely as the most likely one (after temperature); 0 disables it."""
    seed: int | None = None
    """Seed of this request's own random generator, so a sample does not depend on batch neighbours."""
    stop: list[str] = field(default_factory=list)
    """Extra stop strings, on top of the model's end-of-turn token."""
    force_tool_call: tuple[str, ...] = ()
    """Function names: when set, the turn is exactly one Hermes tool call to one of them (constrained decoding, see
    ``taskrl.policies.constrain``); only policies with ``constrains_tool_calls`` accept it."""

    def __post_init__(self) -> None:
        validate_sampling(self)  # InvalidRequestError is a ValueError


@dataclass
class Completion:
    """One sampled assistant turn.

    ``token_ids``/``logprobs`` are the sampled tokens (including a sampled end-of-turn token) and their
    sampler log-probabilities; empty when the backend does not report them. ``prompt_token_ids`` is what
    the backend actually conditioned on, when it reports it. ``tool_calls`` is filled by backends that
    parse calls themselves (OpenAI ``tool_calls``); otherwise the loop parses ``text``.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    """"stop" (end-of-turn or stop string) or "length" (hit max_new_tokens)."""
    policy_version: int = 0
    prompt_token_ids: list[int] | None = None
    tool_calls: list[ToolCall] | None = None
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """Anything that can sample assistant turns."""

    name: str
    version: int
    chat_format: ChatFormat | None

    async def generate(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> Completion:
        """Sample one turn from ``token_ids`` (token mode) or ``messages`` + ``tools`` (message mode).

        The agent loop passes ``messages`` and ``tools`` in token mode too (rules and logging may read
        them); when ``token_ids`` is given it is the exact prompt and takes precedence.
        """
        ...


class PolicyBase:
    """The optional members of a policy, with defaults: subclass it, set ``name``/``version``/``chat_format`` and
    write ``generate``. Callers read these instead of probing a policy for them."""

    max_positions: int | None = None
    """Tokens of context the model has (prompt + completion); None when unknown."""
    constrains_tool_calls: bool = False
    """Whether ``generate`` honours ``SamplingParams.force_tool_call`` (constrained decoding of the call)."""

    async def stream(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> AsyncIterator[tuple[list[int], list[float]] | Completion]:
        """``generate``, yielding ``(token_ids, logprobs)`` batches as they are sampled and then the ``Completion``.

        This default samples the whole turn and yields only the Completion; engines that can, stream (``HFPolicy``).
        """
        yield await self.generate(  # type: ignore[attr-defined]
            token_ids=token_ids, messages=messages, tools=tools, sampling=sampling
        )

    def min_tool_call_tokens(self, names: list[str]) -> int:
        """Tokens the shortest forced call to one of ``names`` needs (policies that ``constrains_tool_calls``)."""
        return 0

    def run_exclusive(self, work: Callable[[], T]) -> T:
        """Run ``work`` while nothing samples from this policy's weights; without a decode thread, just run it."""
        return work()

    async def aclose(self) -> None:
        """Release what belongs to the event loop that ran the requests (HTTP connections); nothing by default."""

    def close(self) -> None:
        """Release threads and memory once no request is in flight; nothing by default."""
