"""HFPolicy: an in-process transformers model that samples token-exactly, batched across episodes.

Concurrent ``generate`` calls from many asyncio episodes are gathered for a couple of milliseconds (or
until ``max_batch_size``) and decoded together in one left-padded, KV-cached batch on a worker thread,
so the event loop stays free. Sampling is our own loop, not ``model.generate``: each request has its own
seeded ``torch.Generator``, and the logprobs are those of the temperature-scaled distribution before
top-p/top-k truncation, matching ``logprobs_of`` (a full forward pass) to float precision.

    policy = HFPolicy.from_pretrained("smollm2")
    completion = await policy.generate(token_ids=ids, sampling=SamplingParams(temperature=0.7, seed=1))
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from taskrl.chat import ChatFormat
from taskrl.policies.base import Completion, PolicyError, SamplingParams
from taskrl.policies.models import SMOLLM2_CACHE_NAME, load_smollm2, resolve_device
from taskrl.types import Message

T = TypeVar("T")

# Stop strings are looked for in the decoded tail of a row rather than its whole text, so checking is
# O(1) per token. A character costs at most 4 byte-level tokens, hence the factor.
_STOP_TAIL_TOKENS_PER_CHAR = 4


@dataclass
class _Request:
    """One pending ``generate`` call, as the decode thread sees it."""

    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    future: asyncio.Future[Completion]
    max_new_tokens: int
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop: str | None = None


class _Batcher:
    """Collects requests made on one event loop and feeds them, a batch at a time, to the decode thread."""

    def __init__(self, policy: HFPolicy, loop: asyncio.AbstractEventLoop) -> None:
        self.policy = policy
        self.loop = loop
        self.pending: list[_Request] = []
        self.full = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None

    def submit(self, request: _Request) -> None:
        self.pending.append(request)
        if len(self.pending) >= self.policy.max_batch_size:
            self.full.set()
        if self.worker is None or self.worker.done():
            self.worker = self.loop.create_task(self._run())

    async def _run(self) -> None:
        policy = self.policy
        while self.pending:
            if len(self.pending) < policy.max_batch_size:
                # The short wait lets episodes that resume in the same loop tick join this batch.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.full.wait(), timeout=policy.batch_wait_s)
            self.full.clear()
            batch = [r for r in self.pending[: policy.max_batch_size] if not r.future.done()]
            del self.pending[: policy.max_batch_size]
            if not batch:
                continue
            try:
                completions = await self.loop.run_in_executor(policy._executor, policy._decode_batch, batch)
            except Exception as exc:  # every caller in the batch must hear about it
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            for request, completion in zip(batch, completions, strict=True):
                if not request.future.done():  # the caller may have been cancelled meanwhile
                    request.future.set_result(completion)


class HFPolicy:
    """A transformers causal LM as a token-mode ``Policy``; trainers update ``model`` in place and bump ``version``."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str | None = None,
        device: str | torch.device | None = "auto",
        chat_format: ChatFormat | None = None,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.002,
    ) -> None:
        """Wrap ``model``/``tokenizer``; ``device`` None keeps the model where it is, "auto" picks CUDA if present."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0, got {batch_wait_s}")
        self.device = next(model.parameters()).device if device is None else resolve_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.chat_format = chat_format if chat_format is not None else ChatFormat(tokenizer)
        self.name = name or str(getattr(model.config, "_name_or_path", "") or "hf")
        self.version = 0
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._pad_id = int(pad or 0)  # any id works: padded positions are masked out
        # transformers 5 renamed ``past_key_values`` to ``cache``; accept both generations.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # One thread: torch work from every event loop is serialised, and the loops never block on it.
        self._decode_thread: int | None = None
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="taskrl-hf", initializer=self._mark_decode_thread
        )
        self._batchers: dict[int, _Batcher] = {}  # by id(loop): each event loop gets its own batcher

    @classmethod
    def from_pretrained(
        cls,
        path_or_name: str | Path = "smollm2",
        device: str | torch.device | None = "auto",
        dtype: torch.dtype = torch.float32,
        **kwargs: Any,
    ) -> HFPolicy:
        """``"smollm2"`` -> the bundled SmolLM2-135M-Instruct; otherwise a local ``save_pretrained`` directory."""
        resolved = resolve_device(device)
        if str(path_or_name) == "smollm2":
            model, tokenizer = load_smollm2(device=resolved, dtype=dtype)
            return cls(model, tokenizer, name=kwargs.pop("name", SMOLLM2_CACHE_NAME), device=resolved, **kwargs)
        path = Path(path_or_name).expanduser()
        if not (path / "config.json").is_file():
            raise PolicyError(
                f"no model at {str(path)!r} (expected a directory with config.json); pass a local directory "
                "written by save_pretrained, or 'smollm2' for the bundled model (taskrl never downloads)"
            )
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return cls(model, tokenizer, name=kwargs.pop("name", path.name), device=resolved, **kwargs)

    def close(self) -> None:
        """Stop the decode thread; pending work finishes first."""
        self._executor.shutdown(wait=True)

    def run_exclusive(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the decode thread between two decode batches and return its result (blocking).

        For anything that touches the model while it may be sampling: a weight sync (no batch then mixes old and
        new weights; batches read ``version`` when they start) and the learner's update of a shared model. It also
        keeps all torch work of a training process on one OS thread: each thread that calls torch gets its own
        OpenMP thread team, and two teams on few cores make decoding ~50% slower (benchmarks/RESULTS.md).
        """
        if threading.get_ident() == self._decode_thread:  # already on it: waiting for ourselves would deadlock
            return work()
        return self._executor.submit(work).result()

    def _mark_decode_thread(self) -> None:
        self._decode_thread = threading.get_ident()

    # -- the Policy protocol ---------------------------------------------------------------------
    async def generate(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> Completion:
        """Sample one turn from ``token_ids``, or from ``messages``+``tools`` rendered by ``chat_format``.

        ``token_ids`` win when both are given: the agent loop sends both so that any policy can serve it,
        and the exact tokens are what training needs.
        """
        if token_ids is None:
            if messages is None:
                raise PolicyError("HFPolicy.generate needs token_ids or messages")
            token_ids = self.chat_format.prompt_ids(messages, tools)
        prompt = [int(t) for t in token_ids]
        loop = asyncio.get_running_loop()
        request = _Request(
            prompt_ids=prompt,
            sampling=sampling,
            # An unseeded request still gets a recorded seed, so any sample can be replayed.
            seed=sampling.seed if sampling.seed is not None else secrets.randbits(63),
            future=loop.create_future(),
            max_new_tokens=self._room_for(prompt, sampling),
        )
        batcher = self._batchers.get(id(loop))
        if batcher is None or batcher.loop is not loop:
            # Forget batchers of closed loops (each pytest test, each asyncio.run, has its own loop).
            for key in [k for k, b in self._batchers.items() if b.loop.is_closed()]:
                del self._batchers[key]
            batcher = self._batchers[id(loop)] = _Batcher(self, loop)
        batcher.submit(request)
        return await request.future

    def _room_for(self, prompt: list[int], sampling: SamplingParams) -> int:
        """Validate a prompt up front (a bad one must not fail its batch neighbours); return its token budget."""
        if not prompt:
            raise PolicyError("HFPolicy.generate got an empty prompt; render at least the generation prompt")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise PolicyError(f"token ids {bad[:5]} are outside the model's vocabulary (size {self.vocab_size})")
        if self.max_positions is None:
            return sampling.max_new_tokens
        room = int(self.max_positions) - len(prompt)
        if room < 1:
            raise PolicyError(
                f"prompt of {len(prompt)} tokens leaves no room in the model's {self.max_positions}-token "
                "context; prune or summarise the conversation"
            )
        return min(sampling.max_new_tokens, room)

    # -- scoring ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def logprobs_of(self, token_ids: list[int], temperature: float = 1.0) -> list[float]:
        """log p(token i | tokens < i) under softmax(logits / temperature), one forward pass; index 0 is 0.0."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for logprobs_of, got {temperature}")
        if not token_ids:
            return []
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1].float() / temperature
        picked = logits.gather(-1, ids[0, 1:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        return [0.0, *picked.tolist()]

    # -- decoding (runs on the worker thread) ----------------------------------------------------
    def _forward(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,  # the prompt's other positions are never sampled from
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1, :].float()

    @torch.inference_mode()
    def _decode_batch(self, requests: list[_Request]) -> list[Completion]:
        from transformers import DynamicCache

        started = time.perf_counter()
        version = self.version
        stop_ids = set(self.chat_format.stop_token_ids)
        device = self.device
        for r in requests:
            r.generator = torch.Generator(device=device)
            r.generator.manual_seed(r.seed)

        # Left padding keeps every row's next token in the last column; position ids count only real
        # tokens so each row sees the same rotary positions it would see alone.
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(requests), width), dtype=torch.long)
        for row, r in enumerate(requests):
            input_ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attention[row, width - len(r.prompt_ids) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(input_ids, attention, positions, cache)
        next_position = positions[:, -1] + 1

        active = list(range(len(requests)))  # request index of each row still in the cache
        while True:
            rows = [requests[i] for i in active]
            tokens, logprobs = _sample(logits, rows)
            keep: list[int] = []
            for row, (r, token, logprob) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)):
                r.token_ids.append(token)
                r.logprobs.append(logprob)
                if token in stop_ids or (r.sampling.stop and self._hit_stop_string(r)):
                    r.finish_reason = "stop"
                elif len(r.token_ids) >= r.max_new_tokens:
                    r.finish_reason = "length"
                else:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(active):
                # Finished rows leave the batch so they stop costing compute.
                index = torch.tensor(keep, dtype=torch.long, device=device)
                cache.batch_select_indices(index)
                attention, next_position, tokens = attention[index], next_position[index], tokens[index]
                active = [active[row] for row in keep]
            attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=1)
            logits = self._forward(tokens[:, None], attention, next_position[:, None], cache)
            next_position = next_position + 1

        elapsed = time.perf_counter() - started
        return [
            Completion(
                text=self.chat_format.decode(r.token_ids),
                token_ids=r.token_ids,
                logprobs=r.logprobs,
                finish_reason=r.finish_reason or "length",
                policy_version=version,
                prompt_token_ids=r.prompt_ids,
                info={"seed": r.seed, "batch_size": len(requests), "stop": r.stop, "decode_s": elapsed},
            )
            for r in requests
        ]

    def _hit_stop_string(self, request: _Request) -> bool:
        longest = max(len(s) for s in request.sampling.stop)
        tail = self.chat_format.decode(request.token_ids[-(longest * _STOP_TAIL_TOKENS_PER_CHAR + 1) :])
        for stop in request.sampling.stop:
            if stop and stop in tail:
                request.stop = stop
                return True
        return False


def _sample(logits: torch.Tensor, requests: list[_Request]) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row with each request's own generator; logprobs before top-p/top-k truncation."""
    temperatures = torch.tensor(
        [r.sampling.temperature if r.sampling.temperature > 0 else 1.0 for r in requests],
        dtype=logits.dtype,
        device=logits.device,
    )
    logp = torch.log_softmax(logits / temperatures[:, None], dim=-1)
    picks = [
        logits[row].argmax().view(1) if r.sampling.temperature == 0 else _sample_row(logp[row], r)
        for row, r in enumerate(requests)
    ]
    tokens = torch.cat(picks)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _sample_row(logp: torch.Tensor, request: _Request) -> torch.Tensor:
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
