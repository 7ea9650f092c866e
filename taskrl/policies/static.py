"""The static-batch decode engine behind ``HFPolicy(engine="static")``, kept for comparison and as a fallback.

Concurrent requests made on one event loop are gathered for ``batch_wait_s`` (or until ``max_batch_size``)
and decoded together in one left-padded, KV-cached batch on the decode thread: a request that arrives while a
batch decodes waits for the whole batch, and every prompt is prefilled from scratch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import torch

from taskrl.policies.base import Completion
from taskrl.policies.sampling import DecodeHost, Request, sample

_STOP_TAIL_TOKENS_PER_CHAR = 4  # stop strings are searched in the decoded tail: a char is <= 4 byte tokens


class StaticBatcher:
    """Collects requests made on one event loop and feeds them, a batch at a time, to the decode thread."""

    def __init__(self, policy: DecodeHost, loop: asyncio.AbstractEventLoop) -> None:
        self.policy = policy
        self.loop = loop
        self.pending: list[Request] = []
        self.full = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None

    def submit(self, request: Request) -> None:
        self.pending.append(request)
        if len(self.pending) >= self.policy.engine_config.max_batch_size:
            self.full.set()
        if self.worker is None or self.worker.done():
            self.worker = self.loop.create_task(self._run())

    async def _run(self) -> None:
        policy = self.policy
        while self.pending:
            if len(self.pending) < policy.engine_config.max_batch_size:
                # The short wait lets episodes that resume in the same loop tick join this batch.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.full.wait(), timeout=policy.engine_config.batch_wait_s)
            self.full.clear()
            batch = [r for r in self.pending[: policy.engine_config.max_batch_size] if not r.future.done()]
            del self.pending[: policy.engine_config.max_batch_size]
            if not batch:
                continue
            try:
                completions = await self.loop.run_in_executor(policy._executor, decode_batch, policy, batch)
            except Exception as exc:  # every caller in the batch must hear about it
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            for request, completion in zip(batch, completions, strict=True):
                if not request.future.done():  # the caller may have been cancelled meanwhile
                    request.future.set_result(completion)


def _forward(
    policy: DecodeHost, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: object
) -> torch.Tensor:
    out = policy.model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,  # the prompt's other positions are never sampled from
        **{policy._cache_kwarg: cache},
    )
    return out.logits[:, -1, :].float()


@torch.inference_mode()
def decode_batch(policy: DecodeHost, requests: list[Request]) -> list[Completion]:
    """Decode ``requests`` together until every one has finished; runs on the decode thread."""
    from transformers import DynamicCache

    started = time.perf_counter()
    version = policy.version
    stop_ids = set(policy.chat_format.stop_token_ids)
    device = policy.device
    for r in requests:
        r.start(device)

    # Left padding keeps every row's next token in the last column; position ids count only real
    # tokens so each row sees the same rotary positions it would see alone.
    width = max(len(r.prompt_ids) for r in requests)
    input_ids = torch.full((len(requests), width), policy._pad_id, dtype=torch.long)
    attention = torch.zeros((len(requests), width), dtype=torch.long)
    for row, r in enumerate(requests):
        input_ids[row, width - len(r.prompt_ids) :] = r.prompt_tensor
        attention[row, width - len(r.prompt_ids) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=policy.model.config)
    logits = _forward(policy, input_ids, attention, positions, cache)
    next_position = positions[:, -1] + 1

    active = list(range(len(requests)))  # request index of each row still in the cache
    while True:
        rows = [requests[i] for i in active]
        tokens, logprobs = sample(logits, rows)
        keep: list[int] = []
        for row, (r, token, logprob) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            r.record(token, logprob)
            if token in stop_ids or (r.sampling.stop and _hit_stop_string(policy, r)):
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
        logits = _forward(policy, tokens[:, None], attention, next_position[:, None], cache)
        next_position = next_position + 1

    elapsed = time.perf_counter() - started
    policy._static_stats["prefill_tokens"] += sum(len(r.prompt_ids) for r in requests)
    policy._static_stats["prefill_padded_tokens"] += width * len(requests)
    policy._static_stats["decode_tokens"] += sum(len(r.token_ids) - 1 for r in requests)
    return [
        Completion(
            text=policy.chat_format.decode(r.token_ids),
            token_ids=r.token_ids,
            logprobs=r.logprobs,
            finish_reason=r.finish_reason or "length",
            policy_version=version,
            prompt_token_ids=r.prompt_ids,
            info={"seed": r.seed, "batch_size": len(requests), "stop": r.stop, "decode_s": elapsed, "engine": "static"},
        )
        for r in requests
    ]


def _hit_stop_string(policy: DecodeHost, request: Request) -> bool:
    longest = max(len(s) for s in request.sampling.stop)
    tail = policy.chat_format.decode(request.token_ids[-(longest * _STOP_TAIL_TOKENS_PER_CHAR + 1) :])
    for stop in request.sampling.stop:
        if stop and stop in tail:
            request.stop = stop
            return True
    return False
