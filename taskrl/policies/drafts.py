"""Prompt-lookup drafts for the continuous engine's speculative decoding.

An agent's turn copies a lot from its own context: the tool-call syntax of earlier turns, tool names, item
names and numbers from tool output. ``lookup_draft`` finds the most recent earlier occurrence of the sequence's
last n tokens (the longest n first) and proposes the tokens that followed it. The engine feeds the drafts with
the row's pending token in one forward and keeps each draft only while it equals the token the row's own
sampler picks at that position (see ``engine.ContinuousEngine._decode_step``), so drafts change the speed,
never the sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def lookup_draft(tokens: torch.Tensor, max_tokens: int, *, max_ngram: int = 3, min_ngram: int = 2) -> list[int]:
    """Up to ``max_tokens`` tokens that followed the latest earlier occurrence of ``tokens``' last n-gram.

    ``tokens`` is a 1-D long tensor (prompt + sampled so far, ending with the token about to be fed). Tries
    n = ``max_ngram`` down to ``min_ngram``; returns ``[]`` when no n-gram recurs or ``max_tokens`` < 1.
    """
    length = tokens.numel()
    if max_tokens < 1 or length <= min_ngram:
        return []
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = tokens[length - n :]
        # windows starting at 0 .. length-n-1: every n-gram but the trailing one itself
        windows = tokens[: length - 1].unfold(0, n, 1)
        hits = (windows == pattern).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return tokens[start : start + max_tokens].tolist()
    return []


DECODE_TOKEN_BUDGETS = {("cpu", "latency"): 16, ("cpu", "throughput"): 32, ("accelerator", "latency"): 256,
                        ("accelerator", "throughput"): 256}  # fmt: skip
"""Default ``decode_token_budget`` (the most padded positions of a decode forward that drafts may fill) by device
and schedule: on CPU rollouts (``throughput``) verify one draft per row on a full 16-row batch, serving
(``latency``) keeps forwards short (docs/design/rollout-engine.md, "The decode budget depends on the schedule")."""


def default_decode_budget(device_type: str, schedule: str) -> int:
    """``DECODE_TOKEN_BUDGETS`` for a torch device type ("cpu", "cuda", ...) and an engine schedule."""
    return DECODE_TOKEN_BUDGETS["cpu" if device_type == "cpu" else "accelerator", schedule]


def plan_drafts(rows: Sequence[Any], draft_tokens: int, budget: int) -> list[list[int]]:
    """Each decoding row's drafts for one step, as many per row as ``budget`` padded positions allow (rows x (1 +
    drafts per row) <= budget; at most ``draft_tokens``, never past the request's ``max_new_tokens``). A row has
    ``prompt`` (a 1-D long tensor) and ``request`` (its ``token_ids`` sampled so far, ``max_new_tokens``)."""
    per_row = min(draft_tokens, budget // len(rows) - 1)
    if per_row < 1:
        return [[] for _ in rows]
    out = []
    for row in rows:
        request = row.request
        room = min(per_row, request.max_new_tokens - len(request.token_ids) - 1)
        context = torch.cat([row.prompt, torch.tensor(request.token_ids, dtype=torch.long)])
        out.append(lookup_draft(context, room))
    return out
