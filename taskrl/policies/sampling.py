"""Per-request sampling shared by both HFPolicy engines: the request record and the seeded Gumbel-max sampler.

Each request owns a ``torch.Generator`` seeded with its seed and draws one uniform per vocabulary entry per
token, so what it samples never depends on its batch neighbours, on when it joined a batch, or on where its
KV came from. Logprobs are those of the temperature-scaled distribution before top-p/top-k truncation.
``DecodeHost`` is what an engine reads from the policy it decodes for (``HFPolicy`` satisfies it), so the engines
never import ``taskrl.policies.hf``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from taskrl.chat import ChatFormat
from taskrl.policies.base import Completion, SamplingParams


class DecodeHost(Protocol):
    """The policy a decode engine (``engine.ContinuousEngine``, ``static.StaticBatcher``) samples for."""

    model: Any
    """The causal LM (a ``transformers`` model), evaluated in place; trainers update it."""
    device: torch.device
    chat_format: ChatFormat
    max_batch_size: int
    batch_wait_s: float
    version: int
    """The weights' version, stamped on every completion."""
    _pad_id: int
    _cache_kwarg: str
    """The model's keyword for a KV cache ("cache" or "past_key_values")."""
    _executor: ThreadPoolExecutor
    """The one decode thread."""
    _static_stats: Counter[str]

    def _weights_key(self) -> Any: ...


@dataclass
class Request:
    """One ``generate`` call as a decode engine sees it; the engine fills the sampled fields."""

    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    max_new_tokens: int
    future: asyncio.Future[Completion]
    loop: asyncio.AbstractEventLoop
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop: str | None = None
    cancelled: bool = False
    """Set (on the event loop) when the caller stopped waiting; the engine drops the request at its next step."""
    submitted: float = field(default_factory=time.perf_counter)
    passed_over: int = 0
    """Admission passes in which other requests started while this one waited (the engine's aging rule)."""
    prompt_tensor: torch.Tensor = field(init=False)
    info: dict[str, Any] = field(default_factory=dict)
    constraint: Any = None
    """A ``ToolCallConstraint`` (``taskrl.policies.constrain``) the sampler obeys, or None."""
    listener: Callable[[tuple[int, float] | None], None] | None = None
    """Called on the caller's event loop with each ``(token, logprob)`` as it is sampled (``HFPolicy.stream``), and
    with None when sampling restarts from scratch (the weights changed under the request)."""

    def __post_init__(self) -> None:
        self.prompt_tensor = torch.tensor(self.prompt_ids, dtype=torch.long)

    def start(self, device: torch.device) -> None:
        """(Re)start sampling from scratch: a fresh generator at the seed, nothing sampled yet."""
        if self.token_ids and self.listener is not None:
            self._notify(None)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(self.seed)
        self.token_ids, self.logprobs, self.finish_reason, self.stop = [], [], None, None
        if self.constraint is not None:
            self.constraint.reset()

    def record(self, token: int, logprob: float) -> None:
        """Append a sampled token (decode thread) and tell the listener, if any."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if self.listener is not None:
            self._notify((token, logprob))

    def _notify(self, item: tuple[int, float] | None) -> None:
        assert self.listener is not None
        with contextlib.suppress(RuntimeError):  # the caller's event loop is closed: nobody listens
            self.loop.call_soon_threadsafe(self.listener, item)

    def deliver(self, outcome: Completion | BaseException) -> None:
        """Hand the result to the awaiting caller; safe from any thread, a no-op once the caller is gone."""

        def settle() -> None:
            if self.future.done():
                return
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the caller's event loop is closed: nobody is waiting
            self.loop.call_soon_threadsafe(settle)


def sample(logits: torch.Tensor, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row with each request's own generator; logprobs before top-p/top-k truncation.

    A row with a ``constraint`` picks among the tokens it allows (its logprob is still the unconstrained one, as
    ``logprobs_of`` scores it) and the constraint advances past the token: every sampled token is accepted."""
    temperatures = torch.tensor(
        [r.sampling.temperature if r.sampling.temperature > 0 else 1.0 for r in requests],
        dtype=logits.dtype,
        device=logits.device,
    )
    logp = torch.log_softmax(logits / temperatures[:, None], dim=-1)
    picks = []
    for row, r in enumerate(requests):
        if r.constraint is not None:
            picks.append(_constrained(logits[row], temperatures[row], r))
        elif r.sampling.temperature == 0:
            picks.append(logits[row].argmax().view(1))
        else:
            picks.append(sample_row(logp[row], r))
    tokens = torch.cat(picks)
    for r, token in zip(requests, tokens.tolist(), strict=True):
        if r.constraint is not None:
            r.constraint.advance(token)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _constrained(logits: torch.Tensor, temperature: torch.Tensor, request: Request) -> torch.Tensor:
    allowed = request.constraint.allowed(request.max_new_tokens - len(request.token_ids)).to(logits.device)
    if allowed.numel() == 0:
        raise ValueError("the tool-call constraint allows no token of this vocabulary")
    masked = torch.full_like(logits, float("-inf"))
    masked[allowed] = logits[allowed]
    if request.sampling.temperature == 0:
        return masked.argmax().view(1)
    return sample_row(torch.log_softmax(masked / temperature, dim=-1), request)


def sample_row(logp: torch.Tensor, request: Any) -> torch.Tensor:
    """Gumbel-max sample over the top-k / nucleus support, drawing one uniform per vocabulary entry.

    Gumbel-max rather than an inverse CDF: the winner only changes when two perturbed scores are within
    float noise, so a row samples the same token whether it was decoded alone or padded into a batch.
    The generator draws the same amount every step, so a request's stream never depends on its support.
    """
    uniform = torch.rand(logp.shape, generator=request.generator, device=logp.device, dtype=logp.dtype)
    scores = logp - torch.log(-torch.log(uniform))
    support = _support(logp, request.sampling)
    if support is None:
        return scores.argmax().view(1)
    return support[scores[support].argmax()].view(1)


def _support(logp: torch.Tensor, sampling: SamplingParams) -> torch.Tensor | None:
    """Token ids kept by top-k, top-p and min-p (most likely first), or None when none truncates."""
    support = _top_support(logp, sampling)
    if sampling.min_p <= 0:
        return support
    floor = logp.max() + math.log(sampling.min_p)  # p >= min_p * p_max, in log space (the top token always stays)
    if support is None:
        kept = (logp >= floor).nonzero().squeeze(-1)
        return kept[logp[kept].argsort(descending=True)]
    return support[logp[support] >= floor]


def _top_support(logp: torch.Tensor, sampling: SamplingParams) -> torch.Tensor | None:
    """Token ids kept by top-k then top-p (most likely first), or None when neither truncates.

    A full-vocabulary sort costs milliseconds per token on CPU and a trained model's nucleus is small,
    so the top-p candidates come from a ``topk`` that grows until it holds the top_p mass.
    """
    vocab = logp.numel()
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else vocab
    if top_k == vocab and sampling.top_p >= 1.0:
        return None
    if top_k < vocab:
        values, order = torch.topk(logp, top_k)
        total = values.exp().sum()  # top-p applies to the top-k-renormalised distribution
    else:
        size, total = min(vocab, 64), 1.0
        while True:
            values, order = torch.topk(logp, size)
            if size == vocab or float(values.exp().sum()) >= sampling.top_p:
                break
            size = min(vocab, size * 4)
    if sampling.top_p < 1.0:
        probs = values.exp()
        # Keep a token while the mass before it is under top_p; the most likely token always stays.
        kept = int(((probs.cumsum(-1) - probs) < sampling.top_p * total).sum())
        order = order[: max(1, kept)]
    return order
