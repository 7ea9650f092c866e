"""HFPolicy: an in-process transformers model that samples token-exactly, batched across episodes.

Two decode engines run on one worker thread, so the event loop stays free. ``EngineConfig(engine="continuous")``
(the default, ``taskrl.policies.engine``): requests join the running batch at the next decode step, finished or
cancelled rows leave at once, and prompts that extend cached KV (the episode's previous turn, a GRPO group's
shared prompt) prefill only their new tokens. ``engine="static"`` (``taskrl.policies.static``): requests are
gathered for a moment and decoded together, each prompt prefilled from scratch. Sampling is our own loop,
not ``model.generate``: each request has its own seeded ``torch.Generator``, and the logprobs are those of
the temperature-scaled distribution before top-p/top-k truncation, matching ``logprobs_of`` (a full forward
pass) to float precision, whichever engine, batch or cache produced them.

    policy = HFPolicy.from_pretrained("smollm2")
    completion = await policy.generate(token_ids=ids, sampling=SamplingParams(temperature=0.7, seed=1))
"""

from __future__ import annotations

import asyncio
import inspect
import numbers
import secrets
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch

from taskrl.chat import ChatFormat
from taskrl.policies.attention import use_grouped_attention
from taskrl.policies.base import (
    Completion,
    InvalidRequestError,
    PolicyBase,
    PolicyError,
    SamplingParams,
    validate_sampling,
)
from taskrl.policies.constrain import ToolCallConstraint, tool_call_constraint
from taskrl.policies.engine import ContinuousEngine
from taskrl.policies.engine_config import ENGINES, EngineConfig
from taskrl.policies.models import SMOLLM2_CACHE_NAME, load_model_dir, load_smollm2, model_dir, resolve_device
from taskrl.policies.sampling import Request, sample_row
from taskrl.policies.static import StaticBatcher
from taskrl.types import Message

T = TypeVar("T")

__all__ = ["ENGINES", "EngineConfig", "HFPolicy", "sample_row"]


class HFPolicy(PolicyBase):
    """A transformers causal LM as a token-mode ``Policy``; trainers update ``model`` in place and bump ``version``.

    ``SamplingParams.force_tool_call`` is honoured by constrained decoding (``taskrl.policies.constrain``).
    Any weight change invalidates the engine's KV (prefix cache and rows in flight): bumping ``version`` (or
    ``set_version``), ``invalidate_kv_cache()``, and any in-place change of a parameter (detected by torch's
    version counters) all do; in-flight requests then restart from scratch under the new weights.
    """

    constrains_tool_calls = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str | None = None,
        device: str | torch.device | None = "auto",
        chat_format: ChatFormat | None = None,
        engine_config: EngineConfig | None = None,
    ) -> None:
        """Wrap ``model``/``tokenizer``; ``device`` None keeps the model where it is, "auto" picks CUDA if present.
        ``engine_config``: how it decodes (``EngineConfig``: the engine, batch and prefill sizes, prefix cache,
        drafts, schedule; its defaults when None).
        """
        self.engine_config = config = engine_config if engine_config is not None else EngineConfig()
        self.device = next(model.parameters()).device if device is None else resolve_device(device)
        self.model = model.to(self.device).eval()
        use_grouped_attention(self.model)  # same results; prefill chunks and drafts stop copying the KV
        self.tokenizer = tokenizer
        self.chat_format = chat_format if chat_format is not None else ChatFormat(tokenizer)
        self.name = name or model.config.name_or_path or "hf"
        self._version = 0
        self._kv_epoch = 0
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
        self._closed = False
        self._batchers: dict[int, StaticBatcher] = {}  # static engine: one batcher per event loop (by id)
        self._static_stats: Counter[str] = Counter()
        self._engine = ContinuousEngine(self, config)

    @classmethod
    def from_pretrained(
        cls,
        path_or_name: str | Path = "smollm2",
        device: str | torch.device | None = "auto",
        dtype: torch.dtype = torch.float32,
        **kwargs: Any,
    ) -> HFPolicy:
        """``"smollm2"`` -> the bundled SmolLM2-135M-Instruct; otherwise a local ``save_pretrained`` directory, a
        LoRA adapter directory (merged onto the base its adapter_config.json records) or a training run directory."""
        resolved = resolve_device(device)
        if str(path_or_name) == "smollm2":
            model, tokenizer = load_smollm2(device=resolved, dtype=dtype)
            return cls(model, tokenizer, name=kwargs.pop("name", SMOLLM2_CACHE_NAME), device=resolved, **kwargs)
        path = model_dir(path_or_name)  # a model, a LoRA adapter (merged onto its recorded base) or a run dir
        model, tokenizer = load_model_dir(path, dtype=dtype)
        default_name = f"{path.parent.name}/{path.name}" if path.name == "policy" else path.name
        return cls(model, tokenizer, name=kwargs.pop("name", default_name), device=resolved, **kwargs)

    def close(self, timeout_s: float = 600.0) -> None:
        """Stop the decode thread; requests already submitted finish first (up to ``timeout_s``)."""
        self._closed = True
        if threading.get_ident() != self._decode_thread:
            self._engine.wait_idle(timeout_s)
        self._executor.shutdown(wait=True)
        if threading.get_ident() != self._decode_thread:  # on the decode thread, shutdown cannot wait for it
            self._engine.close()

    # -- weights and versions --------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The policy version stamped on every Completion; setting a new value invalidates cached KV."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        value = int(value)
        if value != self._version:
            self._version = value
            self.invalidate_kv_cache()

    def set_version(self, version: int) -> None:
        """Sample as ``version`` from now on (what a weight sync calls after changing the weights)."""
        self.version = version

    def invalidate_kv_cache(self) -> None:
        """Forget all reusable KV and restart in-flight rows at the next step: call after changing the weights
        in a way that leaves parameters in place (e.g. switching a peft adapter); a version bump calls it."""
        self._kv_epoch += 1

    def _weights_key(self) -> Any:
        """Changes whenever the weights may have: epoch (version bumps), model object, each parameter's version
        counter (bumped by every in-place update: optimizer steps, ``copy_``, ``load_state_dict``)."""
        try:
            counters = tuple((id(p), p._version) for p in self.model.parameters())
        except RuntimeError:  # inference tensors keep no version counter: rely on the epoch and identities
            counters = tuple(id(p) for p in self.model.parameters())
        return self._kv_epoch, id(self.model), counters

    def engine_stats(self) -> dict[str, Any]:
        """Counters of the engine in use: prefill/decode tokens computed, cached tokens, restarts, occupancy."""
        if self.engine_config.engine == "static":
            return dict(self._static_stats)
        return self._engine.snapshot()

    def run_exclusive(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the decode thread between two decode steps and return its result (blocking).

        For anything that touches the model while it may be sampling: a weight sync (a changed weight restarts
        the rows in flight, so no sample mixes old and new weights; rows read ``version`` when they start) and
        the learner's update of a shared model. It also keeps all torch work of a training process on one OS
        thread: each thread that calls torch gets its own OpenMP thread team, and two teams on few cores make
        decoding ~50% slower (benchmarks/RESULTS.md).
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
        and the exact tokens are what training needs. A request that cannot be served raises
        ``InvalidRequestError`` before it joins a batch; cancelling the awaiting task removes the request from
        the running batch at the next step.
        """
        return await self._sample(token_ids, messages, tools, sampling)

    async def stream(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> AsyncIterator[tuple[list[int], list[float]] | Completion]:
        """``generate``, yielding ``(token_ids, logprobs)`` as the engine samples them, then the ``Completion``.

        Closing the iterator early cancels the request. If the weights change under it, the engine restarts the
        request from scratch, which a stream cannot take back: it raises ``PolicyError`` once tokens were yielded."""
        arrived: asyncio.Queue[tuple[int, float] | None | str] = asyncio.Queue()
        task = asyncio.ensure_future(self._sample(token_ids, messages, tools, sampling, listener=arrived.put_nowait))
        task.add_done_callback(lambda _: arrived.put_nowait("done"))
        yielded = False
        try:
            while True:
                items = [await arrived.get()]
                while not arrived.empty():
                    items.append(arrived.get_nowait())
                if None in items:  # a restart: what came before it was sampled under the old weights
                    if yielded:
                        raise PolicyError("the weights changed while this turn streamed; it restarted and cannot be "
                                          "streamed on: retry the request")  # fmt: skip
                    items = items[len(items) - items[::-1].index(None) :]
                tokens = [item for item in items if isinstance(item, tuple)]
                if tokens:
                    yielded = True
                    yield [t for t, _ in tokens], [lp for _, lp in tokens]
                if "done" in items:
                    break
            yield task.result()
        finally:
            task.cancel()

    async def _sample(
        self,
        token_ids: list[int] | None,
        messages: list[Message] | None,
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
        listener: Callable[[tuple[int, float] | None], None] | None = None,
    ) -> Completion:
        if self._closed:
            raise PolicyError("HFPolicy is closed")
        if token_ids is None:
            if messages is None:
                raise PolicyError("HFPolicy.generate needs token_ids or messages")
            token_ids = self.chat_format.prompt_ids(messages, tools)
        prompt = self._check_prompt(token_ids)
        validate_sampling(sampling)
        budget = self._room_for(prompt, sampling)
        constraint = self._tool_call_constraint(sampling, budget)
        loop = asyncio.get_running_loop()
        request = Request(
            prompt_ids=prompt,
            sampling=sampling,
            # An unseeded request still gets a recorded seed, so any sample can be replayed.
            seed=sampling.seed if sampling.seed is not None else secrets.randbits(63),
            max_new_tokens=budget,
            future=loop.create_future(),
            loop=loop,
            constraint=constraint,
            listener=listener,
        )
        if self.engine_config.engine == "static":
            self._static_batcher(loop).submit(request)
            return await request.future

        def on_done(future: asyncio.Future[Completion]) -> None:
            if future.cancelled():
                request.cancelled = True  # read by the engine at its next step

        request.future.add_done_callback(on_done)
        self._engine.submit(request)
        return await request.future

    def _tool_call_constraint(self, sampling: SamplingParams, budget: int) -> ToolCallConstraint | None:
        """The automaton that forces ``sampling.force_tool_call`` (None when nothing is forced)."""
        names = list(sampling.force_tool_call)
        if not names:
            return None
        constraint = tool_call_constraint(self.tokenizer, self.chat_format.stop_token_ids, names)
        if budget < constraint.min_tokens():
            raise InvalidRequestError(f"a forced tool call needs {constraint.min_tokens()} tokens, but the turn may "
                                      f"sample only {budget}; raise max_new_tokens or shorten the prompt")  # fmt: skip
        return constraint

    def min_tool_call_tokens(self, names: list[str]) -> int:
        """Tokens the shortest forced call to one of ``names`` needs (``SamplingParams.force_tool_call``)."""
        return tool_call_constraint(self.tokenizer, self.chat_format.stop_token_ids, names).min_tokens()

    def _static_batcher(self, loop: asyncio.AbstractEventLoop) -> StaticBatcher:
        batcher = self._batchers.get(id(loop))
        if batcher is None or batcher.loop is not loop:
            # Forget batchers of closed loops (each pytest test, each asyncio.run, has its own loop).
            for key in [k for k, b in self._batchers.items() if b.loop.is_closed()]:
                del self._batchers[key]
            batcher = self._batchers[id(loop)] = StaticBatcher(self, loop)
        return batcher

    def _check_prompt(self, token_ids: Any) -> list[int]:
        """The prompt as a list of in-vocabulary ints, or ``InvalidRequestError``."""
        if isinstance(token_ids, str | bytes) or not hasattr(token_ids, "__iter__"):
            raise InvalidRequestError(f"token_ids must be a list of integers, got {type(token_ids).__name__}")
        prompt = list(token_ids)
        if not prompt:
            raise InvalidRequestError("HFPolicy.generate got an empty prompt; render at least the generation prompt")
        wrong = [t for t in prompt if not isinstance(t, numbers.Integral) or isinstance(t, bool)]
        if wrong:
            raise InvalidRequestError(f"token ids must be integers, got {wrong[:3]!r}")
        prompt = [int(t) for t in prompt]
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"token ids {bad[:5]} are outside the model's vocabulary (size {self.vocab_size})"
            )
        return prompt

    def _room_for(self, prompt: list[int], sampling: SamplingParams) -> int:
        """The request's token budget: ``max_new_tokens`` cut to the context room left after the prompt."""
        if self.max_positions is None:
            return sampling.max_new_tokens
        room = int(self.max_positions) - len(prompt)
        if room < 1:
            raise InvalidRequestError(
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
