"""Shared loss pieces: KL estimators, truncated IS weights, token logprobs and entropy."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from taskrl.algos.losses import approx_kl, kl_k1, kl_k3, token_entropy, token_logprobs, truncated_is_weights


def test_kl_estimators_golden_values() -> None:
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_k1(logp, ref).item() == pytest.approx(math.log(2))
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 + math.log(2) - 1)  # e^-ln2 - (-ln2) - 1
    assert approx_kl(logp, logp).item() == 0.0


@given(st.floats(-10, 0), st.floats(-10, 0))
def test_k3_is_non_negative_and_zero_only_at_equality(logp: float, ref: float) -> None:
    value = kl_k3(torch.tensor([logp], dtype=torch.float64), torch.tensor([ref], dtype=torch.float64)).item()
    assert value >= 0.0
    if logp == ref:
        assert value == 0.0


def test_truncated_is_weights() -> None:
    old, sampler = torch.tensor([math.log(0.6), math.log(0.1)]), torch.tensor([math.log(0.2), math.log(0.2)])
    assert truncated_is_weights(old, sampler, cap=2.0).tolist() == pytest.approx([2.0, 0.5])
    assert truncated_is_weights(old, sampler, cap=0.0).tolist() == [1.0, 1.0]


def test_token_logprobs_and_entropy() -> None:
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([0, 3, 10, 2, 2])
    expected = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), expected, atol=1e-6)
    assert torch.allclose(token_entropy(torch.zeros(2, 11)), torch.full((2,), math.log(11)))
    probs = torch.softmax(logits, -1)
    assert torch.allclose(token_entropy(logits), -(probs * probs.log()).sum(-1), atol=1e-5)
