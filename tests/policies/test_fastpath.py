"""The engine's fast forward computes transformers' forward (logits and KV) on ragged cached rows, with and without
LoRA, follows every weight change, and declines what it cannot reproduce."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from taskrl.policies.fastpath import FastDecoder
from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.policies.kvcache import RowKV
from taskrl.policies.models import tiny_model
from taskrl.policies.sampling import SamplingParams

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def model() -> Any:
    """Grouped-query attention (6 heads on 2 KV heads), as SmolLM2 has (9 on 3)."""
    return tiny_model(seed=5, hidden_size=96, num_heads=6, num_kv_heads=2, num_layers=3)[0]


def lora(model: Any, **kwargs: Any) -> Any:
    """``model`` under a LoRA adapter whose B matrices are not zero (so the adapter changes every projection)."""
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, **kwargs))
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return wrapped.eval()


def ragged_forwards(run: Any, layers: int) -> tuple[list[torch.Tensor], RowKV]:
    """Three rows of different cached lengths: a prefill, then mixed query lengths twice (a draft window, a
    decode); returns each forward's logits of every row's last 3 positions and the final KV."""
    gen = torch.Generator().manual_seed(2)
    kv = RowKV(layers)
    for _ in range(3):
        kv.add_row(None)
    out = []
    for queries in ([7, 19, 11], [3, 1, 5], [1, 1, 1]):
        ids = torch.randint(3, 1000, (3, max(queries)), generator=gen)
        mask, positions = kv.plan(queries, torch.device("cpu"))
        keep = min(3, max(queries))
        out.append(run(ids, mask, positions, kv, keep)[:, -1:])  # every row's own last position
        kv.advance(queries)
    return out, kv


def transformers_run(model: Any) -> Any:
    def run(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, kv: RowKV, keep: int) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=kv,
                         use_cache=True, logits_to_keep=keep).logits  # fmt: skip

    return run


@pytest.mark.parametrize("adapter", [False, True], ids=["plain", "lora"])
def test_matches_transformers_on_ragged_cached_rows(model: Any, adapter: bool) -> None:
    subject = lora(model) if adapter else model
    fast, why = FastDecoder.build(subject)
    assert fast is not None, why
    layers = model.config.num_hidden_layers
    expected, expected_kv = ragged_forwards(transformers_run(subject), layers)
    got, got_kv = ragged_forwards(fast, layers)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert got_kv.lengths == expected_kv.lengths
    for row, length in enumerate(got_kv.lengths):
        torch.testing.assert_close(got_kv.row_kv(row), expected_kv.row_kv(row), rtol=1e-5, atol=1e-5)
        assert length == got_kv.row_kv(row).shape[-2]
    if adapter:  # the adapter really changed the function: the merged weights are not the base ones
        plain, _ = ragged_forwards(transformers_run(model), layers)
        assert not torch.allclose(plain[0], got[0], atol=1e-3)


def test_declines_what_it_cannot_reproduce(model: Any) -> None:
    dora = lora(model, use_dora=True)
    assert FastDecoder.build(dora) == (None, "DoRA adapters")
    from peft import LoraConfig, get_peft_model

    embedded = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules=["q_proj", "embed_tokens"]))
    fast, why = FastDecoder.build(embedded)
    assert fast is None and "embed_tokens" in why
    saved = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules=["q_proj"],
                                                            modules_to_save=["input_layernorm"]))  # fmt: skip
    fast, why = FastDecoder.build(saved)
    assert fast is None and "norm" in why
    assert FastDecoder.build(lora(model, lora_bias=True)) == (None, "LoRA adapters with a bias")
    biased = copy.deepcopy(model)
    biased.config.attention_bias = True
    assert FastDecoder.build(biased) == (None, "attention or MLP biases")
    other = copy.deepcopy(model)
    other.config.model_type = "gpt2"
    fast, why = FastDecoder.build(other)
    assert fast is None and "'gpt2'" in why


async def test_engine_uses_it_and_follows_in_place_updates(model: Any) -> None:
    """On CPU the engine decodes through the fast forward; an in-place update (an optimizer step under LoRA)
    rebuilds it, so what it samples next equals transformers' forward on the new weights."""
    subject = lora(model)
    tokenizer = tiny_model(seed=5)[1]
    fast = HFPolicy(subject, tokenizer, device="cpu")
    slow = HFPolicy(subject, tokenizer, device="cpu", engine_config=EngineConfig(fast_forward=False,
                                                                                 prefix_cache_bytes=0))
    prompt = tokenizer.encode("An in-place update between two requests.")
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=4)
    try:
        for _ in range(2):
            before = fast.engine_stats()["fast_forwards"]
            got = await fast.generate(token_ids=prompt, sampling=params)
            assert fast.engine_stats()["fast_forwards"] > before
            expected = await slow.generate(token_ids=prompt, sampling=params)
            assert slow.engine_stats()["fast_forwards"] == 0
            assert got.token_ids == expected.token_ids
            assert max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs, strict=True)) < 1e-4
            with torch.no_grad():
                for name, p in subject.named_parameters():
                    if "lora_A" in name:
                        p.mul_(-2.0)
    finally:
        fast.close()
        slow.close()


async def test_training_mode_and_unsupported_models_keep_transformers_forward(model: Any) -> None:
    tokenizer = tiny_model(seed=5)[1]
    other = copy.deepcopy(model)
    other.config.attention_bias = True  # declared, not real: enough for the check, and the forward still runs
    policy = HFPolicy(other, tokenizer, device="cpu")
    try:
        await policy.generate(token_ids=tokenizer.encode("hello"), sampling=SamplingParams(max_new_tokens=3, seed=0))
        assert policy.engine_stats()["fast_forwards"] == 0
        assert policy._engine.fast.unsupported[1] == "attention or MLP biases"
    finally:
        policy.close()
    policy = HFPolicy(copy.deepcopy(model), tokenizer, device="cpu")
    try:
        policy.model.train()
        await policy.generate(token_ids=tokenizer.encode("hello"), sampling=SamplingParams(max_new_tokens=3, seed=0))
        assert policy.engine_stats()["fast_forwards"] == 0
        policy.model.eval()
        await policy.generate(token_ids=tokenizer.encode("hello"), sampling=SamplingParams(max_new_tokens=3, seed=0))
        assert policy.engine_stats()["fast_forwards"] > 0
    finally:
        policy.close()


def test_fast_forward_setting_is_checked(model: Any) -> None:
    with pytest.raises(ValueError, match="fast_forward"):
        HFPolicy(model, tiny_model(seed=5)[1], device="cpu", engine_config=EngineConfig(fast_forward="always"))
