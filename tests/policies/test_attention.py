"""Grouped-query attention without KV copies gives transformers' SDPA results, and only covers what it can."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from taskrl.policies import attention
from taskrl.policies.attention import NAME, use_grouped_attention
from taskrl.policies.kvcache import RowKV
from taskrl.policies.models import tiny_model


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any]:
    """(stock SDPA model, the same weights on the grouped function)."""
    model, _ = tiny_model(seed=3, hidden_size=96, num_heads=6, num_kv_heads=2)
    assert model.config._attn_implementation == "sdpa"
    grouped = copy.deepcopy(model)
    assert use_grouped_attention(grouped) and grouped.config._attn_implementation == NAME
    return model.eval(), grouped.eval()


def test_padded_batch_matches_sdpa(models: tuple[Any, Any]) -> None:
    stock, grouped = models
    ids = torch.randint(3, 1000, (3, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    mask[2, :31] = 0
    with torch.inference_mode():
        expected = stock(input_ids=ids, attention_mask=mask).logits
        got = grouped(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], expected[keep], rtol=1e-5, atol=1e-5)


def test_ragged_rows_with_cached_context_match_sdpa(models: tuple[Any, Any], monkeypatch) -> None:
    """The engine's case: rows of different cached lengths each feed a few new tokens (a 4-D mask)."""
    stock, grouped = models
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 1000, (n,), generator=gen) for n in (5, 17, 9)]
    queries = [3, 6, 1]
    out = {}
    calls = {"packed": 0}
    original = attention.scaled_dot_product_attention

    def counting(query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls["packed"] += 1
        return original(query, *args, **kwargs)

    for name, model in (("stock", stock), ("grouped", grouped)):
        if name == "grouped":
            monkeypatch.setattr(attention, "scaled_dot_product_attention", counting)
        kv = RowKV(model.config.num_hidden_layers)
        for _ in prompts:
            kv.add_row(None)
        with torch.inference_mode():
            window = max(len(p) for p in prompts)
            ids = torch.zeros((3, window), dtype=torch.long)
            for i, p in enumerate(prompts):
                ids[i, window - len(p) :] = p
            mask, positions = kv.plan([len(p) for p in prompts], torch.device("cpu"))
            model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=kv, logits_to_keep=1)
            kv.advance([len(p) for p in prompts])
            new = torch.randint(3, 1000, (3, max(queries)), generator=torch.Generator().manual_seed(2))
            mask, positions = kv.plan(queries, torch.device("cpu"))
            logits = model(input_ids=new, attention_mask=mask, position_ids=positions, cache=kv, logits_to_keep=6)
        out[name] = [logits.logits[i, -q:] for i, q in enumerate(queries)]
    assert calls["packed"] > 0, "the grouped path never ran"
    for got, expected in zip(out["grouped"], out["stock"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_training_and_unmasked_calls_use_sdpa_itself(models: tuple[Any, Any], monkeypatch) -> None:
    """Gradients, dropout and mask-free (causal) calls are transformers' own path, untouched."""
    _, grouped = models
    monkeypatch.setattr(attention, "scaled_dot_product_attention", None)  # the packed path would crash
    ids = torch.randint(3, 1000, (2, 12))
    grouped.train()
    try:
        loss = grouped(input_ids=ids, labels=ids).loss
        loss.backward()
    finally:
        grouped.eval()
        grouped.zero_grad(set_to_none=True)
    with torch.inference_mode():
        grouped(input_ids=ids)  # no padding: no mask, SDPA's causal path


def test_only_plain_sdpa_models_are_switched() -> None:
    model, _ = tiny_model(seed=0)
    model.config._attn_implementation_internal = "eager"
    assert not use_grouped_attention(model)
    assert model.config._attn_implementation == "eager"
