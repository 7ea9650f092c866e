"""The continuous-batching decode engine behind ``HFPolicy(engine="continuous")``.

Requests from any event loop land in an inbox; each *step* (one job on the policy's single decode thread,
so ``run_exclusive`` work runs between two steps) admits queued requests, prefills up to
``prefill_chunk_tokens`` prompt tokens, and decodes one token for every running row. A new request joins at
the next step, a finished or cancelled row leaves at once, and a prompt that extends cached KV (the previous
turn of its episode, or a prompt a GRPO group shares) prefills only its new tokens. Any weight change (the
policy's version or KV epoch moves, or a parameter is modified in place) empties the prefix cache and
restarts in-flight rows from scratch, so no sample is ever drawn from stale KV.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from taskrl.policies.base import Completion, PolicyError
from taskrl.policies.drafts import default_decode_budget, plan_drafts
from taskrl.policies.engine_config import EngineConfig
from taskrl.policies.fastpath import FastForward
from taskrl.policies.idle import IdleState
from taskrl.policies.kvcache import PrefixCache, RowKV
from taskrl.policies.sampling import DecodeHost, Request, sample

_STATS = (
    "steps", "prefill_tokens", "prefill_padded_tokens", "cached_tokens", "decode_tokens", "max_running",
    "completed", "failed", "cancelled", "restarts", "draft_tokens", "accepted_draft_tokens", "decode_forwards",
    "priority_forwards", "fast_forwards",
)  # fmt: skip
_MIN_PREFILL_SHARE = 16  # a prefill chunk gives each of its rows at least this many tokens
_MIN_PREFILL_CHUNK = 32  # the prefill budget while rows decode never drops below this
AGING_PASSES = 16
"""A request passed over (others started, it did not) in this many admission passes goes before every younger one,
skips the wait for in-flight KV, and holds a row slot while it cannot start: once among the first ``max_batch_size``
queued, it waits at most this many passes (each starts <= ``max_batch_size``), then for older aged ones and a slot."""
_PRIORITY_STREAK = 2  # the priority lane runs at most this many times priority_tokens steps in a row
_STOP_TAIL_TOKENS_PER_CHAR = 4  # stop strings are searched in the decoded tail: a char is <= 4 byte tokens


def _ema(previous: float | None, value: float, weight: float = 0.2) -> float:
    return value if previous is None else (1 - weight) * previous + weight * value


@dataclass
class _Row:
    """A request in the engine: its prompt, how much of it has KV, and what the Completion will report."""

    request: Request
    prompt: torch.Tensor
    version: int
    fed: int = 0
    """Prompt tokens whose KV the row holds (prefill progress)."""
    cached: int = 0
    """Prompt tokens whose KV came from the prefix cache."""
    pending: int = -1
    """The last sampled token, fed at the next decode step."""
    started: float = 0.0
    batch_size: int = 1
    """Most rows this request shared a forward pass with."""


class ContinuousEngine:
    """Schedules ``Request``s of one ``HFPolicy`` step by step on its decode thread (see the module docstring)."""

    def __init__(
        self,
        policy: DecodeHost,
        config: EngineConfig,
        *,
        share_min_tokens: int = 32,
        idle_release_s: float = 30.0,
    ) -> None:
        """``config``: the policy's ``EngineConfig`` (batch and prefill sizes, prefix cache, drafts, schedule,
        priority lane, fast forward). ``idle_release_s``: the batch KV buffers are kept between requests and freed
        after this long idle. ``fast_forward`` runs forwards through a ``FastDecoder`` of the current weights
        (rebuilt after every weight change) where it reproduces the model; otherwise, and in training mode,
        transformers' forward. The settings are copied onto the engine: benchmarks switch them per run."""
        max_batch_size = config.max_batch_size
        fast_forward = config.fast_forward
        self.policy = policy
        self.schedule = config.schedule
        self.priority_tokens = config.priority_tokens
        self._priority_streak = 0
        self._yielded = False
        self.draft_tokens = config.draft_tokens
        self.decode_token_budget = config.decode_token_budget
        self.max_batch_size = max_batch_size
        self.prefill_chunk_tokens = config.prefill_chunk_tokens
        self.share_min_tokens = share_min_tokens
        self.prefix = PrefixCache(config.prefix_cache_bytes)
        config = policy.model.config
        layers = int(config.get_text_config().num_hidden_layers)
        eager = config._attn_implementation == "eager"
        mask_dtype = next(policy.model.parameters()).dtype if eager else None
        self.prefilling = RowKV(layers, float_mask_dtype=mask_dtype, max_rows=max_batch_size)
        self.decoding = RowKV(layers, float_mask_dtype=mask_dtype, max_rows=max_batch_size)
        self.priority = RowKV(layers, float_mask_dtype=mask_dtype, max_rows=max_batch_size)
        self.priority_prefilling = RowKV(layers, float_mask_dtype=mask_dtype, max_rows=max_batch_size)
        self.idle_release_s = idle_release_s
        self._decode_s: float | None = None  # moving averages: a decode forward, a padded prefill token
        self._prefill_token_s: float | None = None
        self.queue: list[Request] = []
        # Every key exists from the start: other threads read the counters while this one updates them.
        self.stats: Counter[str] = Counter(dict.fromkeys(_STATS, 0))
        self._inbox: list[Request] = []
        self._lock = threading.RLock()  # _fail_all may run under it
        self._scheduled = False
        self._idle = IdleState(self._release_if_idle)
        self._weights: Any = None
        on_cpu = policy.device.type == "cpu"
        self.fast = FastForward(on_cpu if fast_forward == "auto" else bool(fast_forward))

    # -- any thread --------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        with self._lock:
            self._inbox.append(request)
            if not self._scheduled:
                self._scheduled = True
                self._idle.busy()
                self._schedule()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is queued or running; False on timeout."""
        return self._idle.wait(timeout)

    def snapshot(self) -> dict[str, Any]:
        """Counters and current occupancy (for benchmarks and tests; read without locking)."""
        return {
            **self.stats,
            **{f"prefix_{k}": v for k, v in self.prefix.stats.items()},
            "prefix_entries": len(self.prefix),
            "prefix_bytes": self.prefix.bytes,
            "queued": len(self.queue) + len(self._inbox),
            "prefilling": self.prefilling.rows + self.priority_prefilling.rows,
            "running": self.decoding.rows + self.priority.rows,
            "kv_bytes": sum(kv.nbytes for kv in self._kvs()),
        }

    def _schedule(self) -> None:
        """Queue the next step on the decode thread (called with the lock held)."""
        try:
            self.policy._executor.submit(self._tick)
        except RuntimeError as exc:  # the policy was closed under us: nobody will run the step
            self._scheduled = False
            self._idle.idle(None)
            self._fail_all(PolicyError(f"HFPolicy is closed ({exc})"))

    # -- decode thread -----------------------------------------------------------------------------
    def _tick(self) -> None:
        try:
            with torch.inference_mode():
                self.step()
        except Exception as exc:  # an engine bug: fail what is in flight rather than hang its callers
            self._fail_all(PolicyError(f"HFPolicy decode step failed: {type(exc).__name__}: {exc}"))
        with self._lock:
            if self._inbox or self.queue or self._rows():
                self._schedule()
            else:
                self._scheduled = False
                self._idle.idle(self.idle_release_s)

    def close(self) -> None:
        """Free the batch KV buffers and the prefix cache now, and cancel the pending idle release: its timer
        held the engine, and so the policy's model, for ``idle_release_s`` after the policy was closed (a
        ladder's next arm then built its model beside the last one's). Call once the decode thread has stopped."""
        self._idle.close()
        with self._lock:
            for kv in self._kvs():
                kv.clear()  # rows a timed-out close left behind too: nothing will decode them any more
            self.prefix.clear()

    def _release_if_idle(self, epoch: int) -> None:
        """Free the batch KV buffers if the engine has stayed idle since ``epoch`` (a timer thread calls it)."""

        def release() -> None:
            with self._lock:
                if self._idle.still_idle(epoch):
                    for kv in self._kvs():
                        kv.release()

        try:
            self.policy._executor.submit(release)  # on the decode thread, between steps
        except RuntimeError:  # the policy is closed
            return None

    def step(self) -> None:
        """One scheduling step: admit, prefill a chunk, decode one token per running row. While requests of the
        priority lane decode, a step decodes only them (a short request under load then pays for a one-row
        forward, not for the whole batch's), for at most ``_PRIORITY_STREAK`` x ``priority_tokens`` steps in a
        row (two short requests that overlap both finish), so a stream of short requests cannot starve the others."""
        with self._lock:
            self.queue.extend(self._inbox)
            self._inbox = []
        self._check_weights()
        self._drop_cancelled()
        lane_busy = self.priority.rows or self.priority_prefilling.rows or self._short_arrived()
        if lane_busy and self._priority_streak < _PRIORITY_STREAK * self.priority_tokens:
            self._priority_streak += 1
            self._admit(priority_only=True)  # another short request joins the lane at once
            for kv, run in ((self.priority_prefilling, self._prefill_step), (self.priority, self._decode_step)):
                if kv.rows:  # a short request still queued (no row slot yet) runs no forward this step
                    self.stats["priority_forwards"] += 1
                    run(kv)
        else:
            self._priority_streak = 0
            self._admit()
            for kv in (self.priority_prefilling, self.prefilling):
                if kv.rows:
                    self._prefill_step(kv)
            if self._short_arrived() and not self._yielded:
                self._yielded = True  # it starts next step instead of after a whole-batch decode; once in a row
            else:
                self._yielded = False
                for kv in (self.decoding, self.priority):
                    if kv.rows:
                        self._decode_step(kv)
        self.stats["steps"] += 1

    def _short_arrived(self) -> bool:
        """Whether a request of the priority lane waits in the inbox or the queue."""
        if self.schedule != "latency" or not self.priority_tokens:  # no lane: skip the lock on every step
            return False
        with self._lock:
            waiting = [*self._inbox, *self.queue]
        return any(self._prioritised(request) for request in waiting)

    def _kvs(self) -> tuple[RowKV, ...]:
        return (self.prefilling, self.priority_prefilling, self.decoding, self.priority)

    def _rows(self) -> int:
        return sum(kv.rows for kv in self._kvs())

    def _check_weights(self) -> None:
        key = self.policy._weights_key()
        if key == self._weights:
            return
        self.fast.invalidate()  # rebuilt from the new weights at the next forward
        if self._weights is not None:
            self.prefix.clear()
            rows = [row for kv in self._kvs() for row in kv.owners]
            for kv in self._kvs():
                kv.clear()
            if rows:  # sampled under the old weights: start over, in arrival order, under the new ones
                self.stats["restarts"] += len(rows)
                restarted = sorted((row.request for row in rows), key=lambda r: r.submitted)
                self.queue[:0] = restarted
        self._weights = key

    def _drop_cancelled(self) -> None:
        def gone(request: Request) -> bool:
            return request.cancelled or request.loop.is_closed()

        kept = [r for r in self.queue if not gone(r)]
        self.stats["cancelled"] += len(self.queue) - len(kept)
        self.queue = kept
        for kv in self._kvs():
            rows = {i for i, row in enumerate(kv.owners) if gone(row.request)}
            if rows:
                self.stats["cancelled"] += len(rows)
                kv.remove_rows(rows)  # its slot and KV are free for the next row

    def _admit(self, *, priority_only: bool = False) -> None:
        """Start prefilling queued requests, fewest prompt tokens left to compute first (a short prompt skips ahead
        of long ones; ``AGING_PASSES`` bounds for how long), while row slots last and each prefilling row still gets
        ``_MIN_PREFILL_SHARE`` tokens of the budget. Requests of the priority lane prefill apart from the others
        (``priority_only``: only they start)."""
        most = max(1, self._prefill_budget() // _MIN_PREFILL_SHARE)
        window = self.queue[: self.max_batch_size]
        held = 0  # row slots kept for aged requests that cannot start in this pass
        candidates = []
        for order, request in enumerate(window):
            aged = request.passed_over >= AGING_PASSES
            if priority_only and not self._prioritised(request):
                held += aged
                continue
            prompt = request.prompt_tensor
            cached, _ = self.prefix.match(prompt, len(prompt) - 1, record=False)
            key = (0, order) if aged else (1, len(prompt) - cached, order)
            candidates.append((key, aged, request, prompt, cached))
        candidates.sort(key=lambda c: c[0])
        started: set[int] = set()
        for _, aged, request, prompt, cached in candidates:
            target = self.priority_prefilling if self._prioritised(request) else self.prefilling
            if self._rows() + held >= self.max_batch_size or target.rows >= most:
                held += aged
                continue
            if not aged and target.rows and self._shares_inflight(target, prompt, cached):
                continue  # wait a step, then reuse the in-flight KV from the cache
            self.queue.remove(request)
            self._start(request, prompt, target)
            started.add(id(request))
        if started:  # the others in the window were passed over
            for request in window:
                request.passed_over += id(request) not in started

    def _shares_inflight(self, kv: RowKV, prompt: torch.Tensor, cached: int) -> bool:
        for row in kv.owners:
            n = min(len(row.prompt), len(prompt)) - 1
            if n - cached < self.share_min_tokens:
                continue
            same = row.prompt[:n] == prompt[:n]
            common = n if bool(same.all()) else int((~same).to(torch.uint8).argmax())
            if common - cached >= self.share_min_tokens:
                return True
        return False

    def _start(self, request: Request, prompt: torch.Tensor, target: RowKV) -> None:
        cached, kv = self.prefix.match(prompt, len(prompt) - 1)  # at least one token left to prefill
        request.start(self.policy.device)
        row = _Row(request, prompt, version=self.policy.version, fed=cached, cached=cached)
        row.started = time.perf_counter()
        target.add_row(row, kv)
        self.stats["cached_tokens"] += cached

    def _prefill_budget(self) -> int:
        """Padded prompt tokens in this step's prefill forward: ``prefill_chunk_tokens``. In the ``"latency"`` schedule,
        while rows decode, at most about as many as cost what their decode forward costs (measured), so a running
        row's time per token at most roughly doubles while prompts are read (a CPU's prefill is compute-bound; a
        GPU's budget stays at ``prefill_chunk_tokens``). In the ``"throughput"`` schedule (rollouts: only the
        batch's total time counts) every chunk is full size, since each forward pays for one read of the weights. Never
        the whole prompt at once: a request arriving next must wait for one chunk at most."""
        budget = self.prefill_chunk_tokens
        bounded = self.schedule == "latency" and self.decoding.rows
        if bounded and self._decode_s is not None and self._prefill_token_s:
            budget = min(budget, max(_MIN_PREFILL_CHUNK, int(self._decode_s / self._prefill_token_s)))
        return budget

    def _chunks(self, rows: list[_Row], budget: int) -> list[int]:
        """Tokens each prefilling row feeds this step: the budget split evenly, a row needing less takes less."""
        window = max(1, budget // len(rows))
        return [min(len(row.prompt) - row.fed, window) for row in rows]

    def _prefill_step(self, kv: RowKV) -> None:
        rows: list[_Row] = list(kv.owners)
        # the priority lane's prompts are short and latency-bound: they take the full chunk
        budget = self.prefill_chunk_tokens if kv is self.priority_prefilling else self._prefill_budget()
        queries = self._chunks(rows, budget)
        window = max(queries)
        ids = torch.full((len(rows), window), self.policy._pad_id, dtype=torch.long)
        for i, (row, q) in enumerate(zip(rows, queries, strict=True)):
            ids[i, window - q :] = row.prompt[row.fed : row.fed + q]
        started = time.perf_counter()
        logits, failed = self._forward(kv, ids, queries)
        if window * len(rows) >= _MIN_PREFILL_CHUNK:  # smaller chunks are dominated by the per-forward cost
            self._prefill_token_s = _ema(self._prefill_token_s, (time.perf_counter() - started) / (window * len(rows)))
        kv.advance(queries)
        self.stats["prefill_tokens"] += sum(queries)
        self.stats["prefill_padded_tokens"] += window * len(rows)
        done: list[int] = []
        scrub = set(failed)
        for i, (row, q) in enumerate(zip(rows, queries, strict=True)):
            row.batch_size = max(row.batch_size, len(rows))
            if i in failed:
                continue
            row.fed += q
            if row.fed == len(row.prompt):
                done.append(i)
        leaving = set(failed) | set(done)
        for i, exc in failed.items():
            self._fail(rows[i], exc)
        if done:
            for i in done:  # the prompt's KV, for requests that share it (a GRPO group) or extend it
                if torch.isfinite(logits[i]).all():
                    self.prefix.insert(rows[i].prompt, kv.row_kv(i))
            for i, token, logprob in self._sample_rows(rows, done, logits):
                row = rows[i]
                if token is None:
                    scrub.add(i)
                elif not self._accept(row, token, logprob):
                    row.pending = token
                    lane = self.priority if self._prioritised(row.request) else self.decoding
                    lane.add_row(row, kv.row_kv(i))
        kv.remove_rows(leaving, scrub)

    def _prioritised(self, request: Request) -> bool:
        return self.schedule == "latency" and request.max_new_tokens <= self.priority_tokens

    def _decode_step(self, kv: RowKV) -> None:
        rows: list[_Row] = list(kv.owners)
        drafts = plan_drafts(rows, self.draft_tokens, self.draft_budget())
        queries = [1 + len(d) for d in drafts]
        window = max(queries)
        ids = torch.full((len(rows), window), self.policy._pad_id, dtype=torch.long)
        for i, (row, draft) in enumerate(zip(rows, drafts, strict=True)):
            ids[i, window - queries[i] :] = torch.tensor([row.pending, *draft], dtype=torch.long)
        started = time.perf_counter()
        logits, failed = self._forward(kv, ids, queries, keep=window)
        if window == 1 and kv is self.decoding:  # the prefill budget is sized by a plain decode forward's cost
            self._decode_s = _ema(self._decode_s, time.perf_counter() - started)
        kv.advance([1] * len(rows))  # the pending tokens; accepted drafts advance their row below
        self.stats["decode_forwards"] += 1
        self.stats["decode_tokens"] += len(rows)
        self.stats["draft_tokens"] += sum(queries) - len(rows)
        self.stats["max_running"] = max(self.stats["max_running"], len(rows))
        for row in rows:
            row.batch_size = max(row.batch_size, len(rows))
        for i, exc in failed.items():
            self._fail(rows[i], exc)
        leaving, scrub = set(failed), set(failed)
        alive = [i for i in range(len(rows)) if i not in failed]
        if not alive:
            kv.remove_rows(leaving, scrub)
            return
        # each row's pending token sits at column window - q of the window
        first = logits if window == 1 else logits[torch.arange(len(rows)), [window - q for q in queries]]
        for i, token, logprob in self._sample_rows(rows, alive, first):
            row = rows[i]
            if token is None:
                leaving.add(i)
                scrub.add(i)
            elif self._accept(row, token, logprob, kv=kv, kv_row=i):
                leaving.add(i)
            elif not drafts[i]:
                row.pending = token
            elif self._verify(kv, i, row, token, drafts[i], logits[i]):
                leaving.add(i)
        kv.remove_rows(leaving, scrub)

    def draft_budget(self) -> int:
        """The most padded positions a decode forward may hold with drafts (``decode_token_budget``)."""
        explicit = self.decode_token_budget
        return explicit if explicit is not None else default_decode_budget(self.policy.device.type, self.schedule)

    def _verify(self, kv: RowKV, i: int, row: _Row, token: int, draft: list[int], logits: torch.Tensor) -> bool:
        """Walk row ``i``'s drafts after its first sampled ``token``: each draft equal to the token sampled before
        it is kept (its KV is already written) and the next position is sampled from its logits, with the row's
        own generator, exactly as a plain step would. True when the row finished; else ``pending`` is set."""
        offset = logits.shape[0] - 1 - len(draft)  # position of the pending token's logits in the window
        for j, proposed in enumerate(draft):
            if token != proposed:
                break
            position = logits[offset + 1 + j]
            if not bool(torch.isfinite(position).all()):
                break  # kept drafts stop here; the model fails this row at its next plain step if it stays so
            kv.lengths[i] += 1
            self.stats["accepted_draft_tokens"] += 1
            picked, logprobs = sample(position[None], [row.request])
            token = int(picked[0])
            if self._accept(row, token, float(logprobs[0]), kv=kv, kv_row=i):
                return True
        if not bool(torch.isfinite(logits).all()):  # a rejected draft's KV may be non-finite: never leave it behind
            kv.zero_tail(i)
        row.pending = token
        return False

    # -- pieces ------------------------------------------------------------------------------------
    def _forward(
        self, kv: RowKV, ids: torch.Tensor, queries: list[int], keep: int = 1
    ) -> tuple[torch.Tensor, dict[int, Exception]]:
        """Logits of every row's last ``keep`` window positions (``[rows, keep, vocab]``, or ``[rows, vocab]`` when
        ``keep`` is 1); a row whose forward fails alone is reported, not raised."""
        try:
            return self._run(kv, ids, queries, keep), {}
        except Exception as exc:
            if kv.rows == 1:
                return torch.empty(0), {0: exc}
        # Someone in the batch broke it: run each row alone to find who. The batch's writes are all past each
        # row's length, so re-running a row recomputes exactly its own new columns.
        window = ids.shape[1]
        logits: list[torch.Tensor | None] = []
        failed: dict[int, Exception] = {}
        for i, q in enumerate(queries):
            alone = RowKV(kv.num_layers, float_mask_dtype=kv.float_mask_dtype)
            alone.add_row(None, kv.row_kv(i) if kv.lengths[i] else None)
            try:
                own = self._run(alone, ids[i : i + 1, window - q :], [q], min(keep, q))[0]
                if keep > 1:  # left-pad to the window's kept positions (padding positions are never read)
                    own = torch.cat([own.new_zeros((keep - own.shape[0], own.shape[-1])), own])
                logits.append(own)
                alone.advance([q])
                kv.write_row(i, alone.row_kv(0))  # the caller advances every row
            except Exception as exc:
                logits.append(None)
                failed[i] = exc
        template = next((t for t in logits if t is not None), None)
        if template is None:
            return torch.empty(0), failed
        return torch.stack([t if t is not None else torch.zeros_like(template) for t in logits]), failed

    def _run(self, kv: RowKV, ids: torch.Tensor, queries: list[int], keep: int = 1) -> torch.Tensor:
        policy = self.policy
        mask, positions = kv.plan(queries, policy.device)
        fast = self.fast.get(policy.model)
        if fast is not None:
            self.stats["fast_forwards"] += 1
            logits = fast(ids.to(policy.device), mask, positions, kv, keep)
            return logits[:, -1, :].float() if keep == 1 else logits.float()
        out = policy.model(
            input_ids=ids.to(policy.device),
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,  # every row's last query is the window's last column
            **{policy._cache_kwarg: kv},
        )
        return out.logits[:, -1, :].float() if keep == 1 else out.logits[:, -keep:, :].float()

    def _sample_rows(
        self, rows: list[_Row], indices: list[int], logits: torch.Tensor
    ) -> list[tuple[int, int | None, float]]:
        """(row index, token or None if that row failed, logprob) for each of ``indices``."""
        if not indices:
            return []
        picked = logits[indices]
        finite = torch.isfinite(picked).all(dim=-1).tolist()
        out: list[tuple[int, int | None, float]] = []
        good = [i for i, ok in zip(indices, finite, strict=True) if ok]
        for i, ok in zip(indices, finite, strict=True):
            if not ok:
                self._fail(rows[i], PolicyError("the model produced non-finite logits for this request"))
                out.append((i, None, 0.0))
        if not good:
            return out
        try:
            tokens, logprobs = sample(logits[good], [rows[i].request for i in good])
            out.extend(zip(good, tokens.tolist(), logprobs.tolist(), strict=True))
        except Exception:  # find the row that cannot be sampled; the others carry on
            for i in good:
                try:
                    token, logprob = sample(logits[i : i + 1], [rows[i].request])
                    out.append((i, int(token[0]), float(logprob[0])))
                except Exception as exc:
                    self._fail(rows[i], exc)
                    out.append((i, None, 0.0))
        return out

    def _accept(self, row: _Row, token: int, logprob: float, kv: RowKV | None = None, kv_row: int = 0) -> bool:
        """Record a sampled token; True when the row is finished (its Completion, or its error, is delivered)."""
        request = row.request
        try:
            request.record(token, logprob)
            if token in self.policy.chat_format.stop_token_ids or (request.sampling.stop and self._hit_stop(request)):
                request.finish_reason = "stop"
            elif len(request.token_ids) >= request.max_new_tokens:
                request.finish_reason = "length"
            else:
                return False
            if kv is not None:  # this turn's KV (row ``kv_row`` of ``kv``), for the episode's next turn
                fed = torch.tensor(request.prompt_ids + request.token_ids[:-1], dtype=torch.long)
                self.prefix.insert(fed, kv.row_kv(kv_row))
            self._complete(row)
        except Exception as exc:
            self._fail(row, exc)
        return True

    def _hit_stop(self, request: Request) -> bool:
        longest = max(len(s) for s in request.sampling.stop)
        tail = self.policy.chat_format.decode(request.token_ids[-(longest * _STOP_TAIL_TOKENS_PER_CHAR + 1) :])
        for stop in request.sampling.stop:
            if stop and stop in tail:
                request.stop = stop
                return True
        return False

    def _complete(self, row: _Row) -> None:
        request = row.request
        now = time.perf_counter()
        completion = Completion(
            text=self.policy.chat_format.decode(request.token_ids),
            token_ids=request.token_ids,
            logprobs=request.logprobs,
            finish_reason=request.finish_reason or "length",
            policy_version=row.version,
            prompt_token_ids=request.prompt_ids,
            info={
                "seed": request.seed,
                "batch_size": row.batch_size,
                "stop": request.stop,
                "decode_s": now - row.started,
                "queue_s": row.started - request.submitted,
                "cached_tokens": row.cached,
                "prefill_tokens": len(row.prompt) - row.cached,
                "engine": "continuous",
            },
        )
        self.stats["completed"] += 1
        request.deliver(completion)

    def _fail(self, row: _Row, exc: BaseException) -> None:
        self.stats["failed"] += 1
        error = exc if isinstance(exc, PolicyError) else PolicyError(f"generation failed: {type(exc).__name__}: {exc}")
        if error is not exc:
            error.__cause__ = exc
        row.request.deliver(error)

    def _fail_all(self, error: PolicyError) -> None:
        requests = [*self.queue, *(row.request for kv in self._kvs() for row in kv.owners)]
        with self._lock:
            requests += self._inbox
            self._inbox = []
        self.queue = []
        for kv in self._kvs():
            kv.clear()
        for request in requests:
            request.deliver(error)
