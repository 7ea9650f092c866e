"""Speculative decoding with prompt-lookup drafts: drafts change how many forwards a turn takes, never what it
samples (same seed -> same tokens, logprobs within 1e-4 of a fresh full forward), whatever the drafts propose."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from taskrl.policies import engine as engine_module
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

        monkeypatch.setattr(engine_module, "lookup_draft", oracle)
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


async def test_drafts_stay_within_the_decode_budget(tiny: tuple[Any, Any], monkeypatch) -> None:
    """A decode forward holds at most ``decode_token_budget`` padded positions, whatever the drafter offers:
    rows x (1 + drafts per row) <= budget, and a full batch of 16 rows under a budget of 16 drafts nothing."""
    _, tokenizer = tiny
    policy = make_policy(tiny, draft_tokens=4, decode_token_budget=16)
    widths: list[tuple[int, int]] = []

    def always(context: torch.Tensor, max_tokens: int) -> list[int]:
        widths.append((policy._engine.decoding.rows, max_tokens))
        return [0] * max_tokens

    monkeypatch.setattr(engine_module, "lookup_draft", always)
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


def test_prefill_mode_sets_the_chunk_while_rows_decode(tiny: tuple[Any, Any]) -> None:
    """"latency" shrinks a prefill chunk to about one decode forward's cost while rows decode; "throughput"
    (the trainer's rollouts) keeps every chunk full."""
    budgets = {}
    for mode in ("latency", "throughput"):
        policy = make_policy(tiny, prefill_chunk_tokens=128, prefill_mode=mode)
        engine = policy._engine
        engine._decode_s, engine._prefill_token_s = 0.05, 0.001  # measured costs: a decode = 50 prompt tokens
        engine.decoding.add_row(None)  # a row is decoding
        budgets[mode] = engine._prefill_budget()
        engine.decoding.remove_rows({0})
        policy.close()
    assert budgets == {"latency": 50, "throughput": 128}
    with pytest.raises(ValueError, match="prefill_mode"):
        make_policy(tiny, prefill_mode="fast")
