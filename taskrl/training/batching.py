"""Trajectories -> token sequences -> micro-batches that waste no compute on padding or repeated prompts.

Each trainable segment becomes a ``TokenSequence`` (exact sampled ids, loss mask, sampler logprobs; never a
re-render). ``plan_micro_batches`` sorts sequences so that those sharing a prompt sit together, then fills a
token budget. ``collate`` finds the longest prefix a micro-batch shares (the K samples of a GRPO group share
their whole prompt) so the learner runs it once and the rows only their own suffixes: the gradient is exact
(the suffixes attend to the prefix's keys and values, and backpropagate into them), and a group of 8 answers
to a 300-token prompt costs 300 + 8 x answer tokens instead of 8 x (300 + answer). ``share_prefix=False``
(the FSDP2 learner: every rank must make the same decoder calls) runs each micro-batch as one plain forward.

``plan_step`` goes one level up: when every sequence of an optimizer step shares a prompt (the system prompt and
tool schemas of a GRPO step), the learner can run that prompt once for the whole step (``model.StepPrefix``)
and every micro-batch only its rows' suffixes, packed by length. It picks that plan or the per-micro-batch one,
whichever computes fewer tokens (a micro-batch counted as ``MICRO_BATCH_OVERHEAD`` tokens more).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from taskrl.types import Trajectory

MIN_SHARED_PREFIX = 8
"""Shorter shared prefixes are not worth a separate forward call."""
MICRO_BATCH_OVERHEAD = 64
"""What one more forward+backward call costs, in tokens: the per-op cost of ~30 layers' calls on a CPU, which is
why the planners do not split a batch into a micro-batch per row to save a little padding."""


@dataclass
class TokenSequence:
    """One segment of one trajectory, as the learner trains it; per-token arrays cover sampled tokens only."""

    traj_index: int
    """Index of the trajectory in the list given to ``sequences_from``."""
    token_ids: list[int]
    sampled_positions: list[int]
    """Positions (>= 1) of the tokens with loss_mask 1, in order."""
    sampler_logprobs: torch.Tensor
    """The sampler's logprob of each sampled token."""
    policy_version: int
    temperature: float | None = None
    """The segment's own sampling temperature (production rows); None = the learner's configured one."""

    @property
    def num_sampled(self) -> int:
        return len(self.sampled_positions)

    @property
    def first_sampled(self) -> int:
        return self.sampled_positions[0]


def sequences_from(trajectories: Sequence[Trajectory]) -> list[TokenSequence]:
    """Every segment with at least one trainable token (a token at position 0 has no context: skipped)."""
    out: list[TokenSequence] = []
    for index, traj in enumerate(trajectories):
        for seg in traj.segments:
            positions = [i for i, m in enumerate(seg.loss_mask) if m and i > 0]
            if not positions:
                continue
            out.append(
                TokenSequence(
                    traj_index=index,
                    token_ids=list(seg.token_ids),
                    sampled_positions=positions,
                    sampler_logprobs=torch.tensor([seg.logprobs[i] for i in positions], dtype=torch.float32),
                    policy_version=seg.policy_version,
                    temperature=seg.temperature,
                )
            )
    return out


def _shared_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_length(sequences: Sequence[TokenSequence], share_prefix: bool = True) -> int:
    """Tokens all rows share that no row needs a hidden state for (the shared prompt, minus its last token).

    The hidden state that predicts a sampled token at position j sits at j - 1, so the prefix stops one token
    before the earliest sampled position. Below ``MIN_SHARED_PREFIX`` it is 0 (one plain batched forward).
    """
    if len(sequences) < 2 or not share_prefix:
        return 0
    limit = min(s.first_sampled for s in sequences) - 1
    first = sequences[0].token_ids
    for s in sequences[1:]:
        limit = _shared_prefix(first, s.token_ids, limit)
        if limit < MIN_SHARED_PREFIX:
            return 0
    return limit


def micro_batch_cost(sequences: Sequence[TokenSequence]) -> int:
    """Tokens a forward of these rows computes: shared prefix once, then every row padded to the longest."""
    prefix = prefix_length(sequences)
    return prefix + len(sequences) * max(len(s.token_ids) - prefix for s in sequences)


def _cost(rows: int, shared: int, longest: int, share_prefix: bool = True) -> int:
    prefix = shared if share_prefix and rows > 1 and shared >= MIN_SHARED_PREFIX else 0
    return prefix + rows * (longest - prefix)


def plan_micro_batches(
    sequences: Sequence[TokenSequence], token_budget: int, share_prefix: bool = True
) -> list[list[int]]:
    """Group sequence indices into micro-batches of at most ``token_budget`` computed tokens.

    Sorted by prompt (so a group's samples share a micro-batch and its prefix), then by length (so padding
    is small); a sequence joins the current micro-batch when that costs no more than computing it alone. A
    sequence longer than the budget gets a micro-batch of its own.
    """
    order = sorted(
        range(len(sequences)),
        key=lambda i: (sequences[i].token_ids[: sequences[i].first_sampled], len(sequences[i].token_ids)),
    )
    batches: list[list[int]] = []
    current: list[int] = []
    shared = longest = 0  # of ``current``: raw common prefix (capped before the first sampled token), max length
    for i in order:
        s = sequences[i]
        if current:
            first = sequences[current[0]].token_ids
            new_shared = _shared_prefix(first, s.token_ids, min(shared, s.first_sampled - 1))
            new_longest = max(longest, len(s.token_ids))
            cost_with = _cost(len(current) + 1, new_shared, new_longest, share_prefix)
            # Join only if that is no dearer than running the sequence alone: one long outlier must not make
            # every row of the batch pay its padding.
            cost_now = _cost(len(current), shared, longest, share_prefix)
            if cost_with <= token_budget and cost_with - cost_now <= len(s.token_ids):
                current.append(i)
                shared, longest = new_shared, new_longest
                continue
            batches.append(current)
        current, shared, longest = [i], s.first_sampled - 1, len(s.token_ids)
    if current:
        batches.append(current)
    return batches


def plan_step(
    sequences: Sequence[TokenSequence], token_budget: int, share_prefix: bool = True
) -> tuple[int, list[list[int]]]:
    """(step prefix, micro-batches): the prompt length all ``sequences`` share, to be run once for every
    micro-batch, and the micro-batches of their suffixes; or (0, ``plan_micro_batches``'s plan) where that
    computes fewer tokens (groups with long prompts of their own, or nothing shared by all)."""
    per_batch = plan_micro_batches(sequences, token_budget, share_prefix)
    prefix = prefix_length(sequences, share_prefix)
    if not prefix:
        return 0, per_batch
    suffixes = _plan_suffixes(sequences, token_budget, prefix)
    cost_step = prefix + sum(_step_cost([sequences[i] for i in batch], prefix) for batch in suffixes)
    cost_batches = sum(micro_batch_cost([sequences[i] for i in batch]) + MICRO_BATCH_OVERHEAD for batch in per_batch)
    return (prefix, suffixes) if cost_step < cost_batches else (0, per_batch)


def _step_cost(rows: Sequence[TokenSequence], prefix: int) -> int:
    return len(rows) * max(len(s.token_ids) - prefix for s in rows) + MICRO_BATCH_OVERHEAD


def _plan_suffixes(sequences: Sequence[TokenSequence], token_budget: int, prefix: int) -> list[list[int]]:
    """Sequences sorted by length, cut into consecutive runs minimising padded suffix tokens plus a
    ``MICRO_BATCH_OVERHEAD`` per run, each run within ``token_budget`` (a longer suffix runs alone)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].token_ids))
    widths = [len(sequences[i].token_ids) - prefix for i in order]
    n = len(order)
    best = [0] + [float("inf")] * n  # best[j]: cheapest cut of the first j sequences
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j - 1, -1, -1):  # the run order[i:j], padded to its longest, widths[j - 1]
            cost = (j - i) * widths[j - 1]
            if cost > token_budget and i < j - 1:
                break
            if best[i] + cost + MICRO_BATCH_OVERHEAD < best[j]:
                best[j], cut[j] = best[i] + cost + MICRO_BATCH_OVERHEAD, i
    runs: list[list[int]] = []
    j = n
    while j > 0:
        runs.append(order[cut[j] : j])
        j = cut[j]
    return runs[::-1]


@dataclass
class MicroBatch:
    """Tensors of one forward: an optional shared prefix and right-padded suffix rows."""

    prefix_ids: torch.Tensor | None
    """[P] token ids all rows share (run once), or None."""
    input_ids: torch.Tensor
    """[n, S] suffix ids, right-padded."""
    attention_mask: torch.Tensor
    """[n, P + S] 1 for real tokens (the prefix included)."""
    position_ids: torch.Tensor
    """[n, S] positions of the suffix tokens (P, P + 1, ...)."""
    rows: torch.Tensor
    """[N] row of each sampled token."""
    columns: torch.Tensor
    """[N] suffix column whose hidden state predicts each sampled token."""
    targets: torch.Tensor
    """[N] the sampled token ids."""
    last_columns: torch.Tensor
    """[n] suffix column of each row's last real token (the state after it bootstraps truncated episodes)."""
    num_sampled: list[int]
    """Sampled tokens per row; the flattened [N] tensors are in row order."""
    temperatures: torch.Tensor | None = None
    """[N] sampling temperature of each sampled token's row, NaN where the row has none; None when no row has one."""
    step_prefix: bool = False
    """The prefix is the optimizer step's, run once for all its micro-batches (not counted here)."""

    @property
    def computed_tokens(self) -> int:
        prefix = 0 if self.prefix_ids is None or self.step_prefix else len(self.prefix_ids)
        return prefix + self.input_ids.numel()


def collate(
    sequences: Sequence[TokenSequence],
    pad_id: int,
    device: torch.device | str = "cpu",
    share_prefix: bool = True,
    step_prefix: int = 0,
) -> MicroBatch:
    """Build the tensors of one micro-batch (see the module docstring for the prefix sharing).

    ``step_prefix``: the length of the prompt the optimizer step shares (``plan_step``), which the learner runs
    once for all micro-batches: the rows then hold only what follows it, even a row alone."""
    prefix = step_prefix or prefix_length(sequences, share_prefix)
    if step_prefix:
        head = sequences[0].token_ids[:step_prefix]
        if any(s.token_ids[:step_prefix] != head or s.first_sampled <= step_prefix for s in sequences):
            raise ValueError(f"step_prefix={step_prefix}: not a prompt every row shares before its first sampled token")
    width = max(len(s.token_ids) for s in sequences) - prefix
    n = len(sequences)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, prefix + width), dtype=torch.long)
    attention[:, :prefix] = 1
    rows, columns, targets, last_columns = [], [], [], []
    for row, s in enumerate(sequences):
        suffix = s.token_ids[prefix:]
        input_ids[row, : len(suffix)] = torch.tensor(suffix, dtype=torch.long)
        attention[row, prefix : prefix + len(suffix)] = 1
        rows += [row] * s.num_sampled
        columns += [p - 1 - prefix for p in s.sampled_positions]
        targets += [s.token_ids[p] for p in s.sampled_positions]
        last_columns.append(len(suffix) - 1)
    positions = torch.arange(prefix, prefix + width, dtype=torch.long).expand(n, width)
    prefix_ids = torch.tensor(sequences[0].token_ids[:prefix], dtype=torch.long) if prefix else None
    return MicroBatch(
        prefix_ids=None if prefix_ids is None else prefix_ids.to(device),
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        rows=torch.tensor(rows, dtype=torch.long, device=device),
        columns=torch.tensor(columns, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        last_columns=torch.tensor(last_columns, dtype=torch.long, device=device),
        num_sampled=[s.num_sampled for s in sequences],
        temperatures=_row_temperatures(sequences, device),
        step_prefix=bool(step_prefix),
    )


def _row_temperatures(sequences: Sequence[TokenSequence], device: torch.device | str) -> torch.Tensor | None:
    if all(s.temperature is None for s in sequences):
        return None
    values = [float("nan") if s.temperature is None else s.temperature for s in sequences for _ in range(s.num_sampled)]
    return torch.tensor(values, dtype=torch.float32, device=device)
