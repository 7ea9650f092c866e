"""Speculative decoding with prompt-lookup drafts: drafts change how many forwards a turn takes, never what it
samples (same seed -> same tokens, logprobs within 1e-4 of a fresh full forward), whatever the drafts propose."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from taskrl.policies import drafts as drafts_module
from taskrl.policies.drafts import lookup_draft
from taskrl.policies.hf import HFPolicy
from tests.policies.test_engine import assert_exact, ids, make_policy, sampling


def test_lookup_draft_proposes_what_followed_the_latest_ngram() -> None:
    tokens = torch.tensor([5, 6, 7, 8, 9, 5, 6, 1, 2, 5, 6])
    assert lookup_draft(tokens, 3) == [1, 2, 5]  # the latest earlier (5, 6) is at index 5
    assert lookup_draft(tokens, 1) == [1]
    assert lookup_draft(tokens, 0) == []
    assert lookup_draft(torch.tensor([1, 2, 3, 4]), 4) == []  # nothing recurs
    assert lookup_draft(torch.tensor([3, 4, 9, 3, 4]), 8) == [9, 3, 4]  # cut at the sequence's end
    # the longest n-gram wins: (1, 2, 3) recurs at 0, while (2, 3) alone last occurred at 5
    assert lookup_draft(torch.tensor([1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3]), 1, max_ngram=3) == [7]


@given(st.lists(st.integers(0, 4), min_size=0, max_size=40), st.integers(0, 6))
def test_lookup_draft_always_continues_an_earlier_occurrence(values: list[int], max_tokens: int) -> None:
    tokens = torch.tensor(values, dtype=torch.long)
    draft = lookup_draft(tokens, max_tokens)
    assert len(draft) <= max_tokens
    if draft:
        n = len(values)
        found = any(
            values[start - k : start] == values[n - k :] and values[start : start + len(draft)] == draft
            for k in (2, 3)
            for start in range(k, n)
        )
        assert found, (values, draft)


async def _generate(policy: HFPolicy, prompts: list[list[int]], n: int, temperature: float) -> list[Any]:
    return await asyncio.gather(
        *(policy.generate(token_ids=p, sampling=sampling(n, seed, temperature)) for seed, p in enumerate(prompts))
    )


@pytest.mark.parametrize("temperature", [1.0, 0.0])
async def test_any_drafts_change_forwards_not_samples(tiny: tuple[Any, Any], monkeypatch, temperature) -> None:
    """An oracle drafter proposes each row's true continuation, corrupted at every third step: kept drafts save
    forwards, rejected ones are thrown away, and every sample equals the one decoded without drafts."""
    _, tokenizer = tiny
    prompts = [ids(tokenizer, text) for text in ("hello there", "one two three four", "x")]
    plain = make_policy(tiny, draft_tokens=0)
    try:
        expected = await _generate(plain, prompts, 24, temperature)
        plain_forwards = plain.engine_stats()["decode_forwards"]
        by_prompt = {tuple(p): e.token_ids for p, e in zip(prompts, expected, strict=True)}

        def oracle(context: torch.Tensor, max_tokens: int) -> list[int]:
            tokens = context.tolist()
            prompt = next(p for p in by_prompt if tuple(tokens[: len(p)]) == p)
            produced = len(tokens) - len(prompt)
            upcoming = list(by_prompt[prompt][produced : produced + max_tokens])
            if produced % 3 == 0 and upcoming:
                upcoming[-1] = (upcoming[-1] + 1) % plain.vocab_size
            return upcoming

        monkeypatch.setattr(drafts_module, "lookup_draft", oracle)
        fast = make_policy(tiny, draft_tokens=4)
        try:
            got = await _generate(fast, prompts, 24, temperature)
            stats = fast.engine_stats()
        finally:
            fast.close()
        for prompt, completion, reference in zip(prompts, got, expected, strict=True):
            assert_exact(plain, prompt, completion, reference, temperature=temperature or 1.0)
        assert 0 < stats["accepted_draft_tokens"] < stats["draft_tokens"]
        assert stats["decode_forwards"] < plain_forwards / 2
    finally:
        plain.close()


async def test_prompt_lookup_on_a_repetitive_turn(tiny: tuple[Any, Any]) -> None:
    """The real drafter: a greedy turn that repeats its prompt's pattern keeps drafts and samples the same."""
    _, tokenizer = tiny
    prompt = ids(tokenizer, "a b c d a b c d a b c d a b")
    results = {}
    for drafts in (0, 4):
        policy = make_policy(tiny, draft_tokens=drafts)
        try:
            (completion,) = await _generate(policy, [prompt], 40, 0.0)
            results[drafts] = (completion, policy.engine_stats())
        finally:
            policy.close()
    (plain, _), (fast, stats) = results[0], results[4]
    assert fast.token_ids == plain.token_ids
    assert max(abs(a - b) for a, b in zip(fast.logprobs, plain.logprobs, strict=True)) < 1e-4
    assert stats["accepted_draft_tokens"] > 0


def test_default_decode_budget_follows_device_and_schedule(tiny: tuple[Any, Any]) -> None:
    """Unset, the budget is the device's and the schedule's in force (rollouts draft on a full CPU batch, serving
    keeps forwards short); a set budget is kept whatever the schedule."""
    policy = make_policy(tiny, draft_tokens=4)
    try:
        engine = policy._engine
        assert engine.draft_budget() == drafts_module.DECODE_TOKEN_BUDGETS["cpu", "latency"] == 16
        engine.schedule = "throughput"
        assert engine.draft_budget() == drafts_module.DECODE_TOKEN_BUDGETS["cpu", "throughput"] > 16
    finally:
        policy.close()
    policy = make_policy(tiny, draft_tokens=4, decode_token_budget=9, schedule="throughput")
    try:
        assert policy._engine.draft_budget() == 9
    finally:
        policy.close()


async def test_drafts_stay_within_the_decode_budget(tiny: tuple[Any, Any], monkeypatch) -> None:
    """A decode forward holds at most ``decode_token_budget`` padded positions, whatever the drafter offers:
    rows x (1 + drafts per row) <= budget, and a full batch of 16 rows under a budget of 16 drafts nothing."""
    _, tokenizer = tiny
    policy = make_policy(tiny, draft_tokens=4, decode_token_budget=16)
    widths: list[tuple[int, int]] = []

    def always(context: torch.Tensor, max_tokens: int) -> list[int]:
        widths.append((policy._engine.decoding.rows, max_tokens))
        return [0] * max_tokens

    monkeypatch.setattr(drafts_module, "lookup_draft", always)
    try:
        for rows in (8, 16):
            await _generate(policy, [ids(tokenizer, f"row {i} of {rows}") for i in range(rows)], 6, 1.0)
        assert widths and all(rows * (1 + n) <= 16 for rows, n in widths)
        assert all(rows < 16 for rows, _ in widths)
    finally:
        policy.close()


def test_bad_draft_settings_fail_naming_the_field(tiny: tuple[Any, Any]) -> None:
    with pytest.raises(ValueError, match="draft_tokens"):
        make_policy(tiny, draft_tokens=-1)
    with pytest.raises(ValueError, match="decode_token_budget"):
        make_policy(tiny, decode_token_budget=0)


def test_schedule_sets_the_prefill_chunk_while_rows_decode(tiny: tuple[Any, Any]) -> None:
    """ "latency" shrinks a prefill chunk to about one decode forward's cost while rows decode; "throughput"
    (the trainer's rollouts) keeps every chunk full."""
    budgets = {}
    for mode in ("latency", "throughput"):
        policy = make_policy(tiny, prefill_chunk_tokens=128, schedule=mode)
        engine = policy._engine
        engine._decode_s, engine._prefill_token_s = 0.05, 0.001  # measured costs: a decode = 50 prompt tokens
        engine.decoding.add_row(None)  # a row is decoding
        budgets[mode] = engine._prefill_budget()
        engine.decoding.remove_rows({0})
        policy.close()
    assert budgets == {"latency": 50, "throughput": 128}
    with pytest.raises(ValueError, match="schedule"):
        make_policy(tiny, schedule="fast")
    with pytest.raises(ValueError, match="priority_tokens"):
        make_policy(tiny, priority_tokens=-1)


async def test_a_short_request_decodes_in_its_own_lane_without_starving_the_batch(tiny: tuple[Any, Any]) -> None:
    """In the "latency" schedule a request for <= priority_tokens tokens decodes alone while the running batch
    waits, at most priority_tokens steps in a row; every sample is still the one decoded alone."""
    _, tokenizer = tiny
    policy = make_policy(tiny, priority_tokens=3, draft_tokens=0)
    reference = make_policy(tiny, priority_tokens=0, draft_tokens=0, prefix_cache_bytes=0)
    engine = policy._engine
    lanes: list[str] = []
    plain_decode = engine._decode_step

    def logged(kv: Any) -> None:
        lanes.append("priority" if kv is engine.priority else "batch")
        plain_decode(kv)

    engine._decode_step = logged  # type: ignore[method-assign]
    try:
        long_prompt = ids(tokenizer, "A long story begins")
        long_task = asyncio.create_task(policy.generate(token_ids=long_prompt, sampling=sampling(40, 1)))
        while engine.decoding.rows == 0:
            await asyncio.sleep(0.001)
        shorts = [ids(tokenizer, f"Quick question {i}?") for i in range(3)]
        got = await asyncio.gather(*(policy.generate(token_ids=p, sampling=sampling(3, 10 + i)) for i, p in
                                     enumerate(shorts)))  # fmt: skip
        assert not long_task.done()
        long = await long_task
        assert engine.stats["priority_forwards"] > 0
        assert all(c.info["batch_size"] <= len(shorts) for c in got)  # never in a forward with the long row
        # never more than priority_tokens priority-only forwards in a row while the batch has rows to decode
        streak = longest = 0
        for lane in lanes:
            streak = streak + 1 if lane == "priority" else 0
            longest = max(longest, streak)
        assert longest <= 2 * 3 + 1  # the bounded streak, then the full step's own priority forward
        cases = [(long_prompt, long, 1)] + [(p, c, 10 + i) for i, (p, c) in enumerate(zip(shorts, got, strict=True))]
        for prompt, completion, seed in cases:
            n = len(completion.token_ids)
            expected = await reference.generate(token_ids=prompt, sampling=sampling(n, seed))
            assert_exact(reference, prompt, completion, expected)
    finally:
        policy.close()
        reference.close()
