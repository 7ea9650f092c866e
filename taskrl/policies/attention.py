"""Grouped-query attention that never copies keys and values, for queries of any length.

transformers' SDPA path packs the query heads that share a key/value head only for a one-token query; for
longer ones it repeats every key/value head ``num_key_value_groups`` times, copying a row's whole KV in every
layer of every forward. The continuous engine's prefill chunks and draft windows are short queries over long
cached contexts, so that copy cost more than the attention itself (SmolLM2: 3 KV heads shared by 9). Here the
heads of a group are stacked along the query axis instead (``[B, H, q, D] -> [B, KV, G*q, D]``, the 4-D mask
repeated to match): the same product, on the cached KV as it lies.

``use_grouped_attention(model)`` switches a model using "sdpa" to this function (registered as
``"taskrl_sdpa"``, with SDPA's own mask builder); every call it does not cover (training, dropout, no 4-D mask,
per-head masks, one-token queries) goes to transformers' SDPA function unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "taskrl_sdpa"


def grouped_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ``([B, q, H, D], None)`` as SDPA's function does."""
    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, q_len, dim = query.shape
    covered = (
        groups > 1
        and q_len > 1
        and not module.training
        and dropout == 0.0
        and attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and attention_mask.shape[2] == q_len
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and key.shape[1] * groups == heads
    )
    if not covered:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    kv_heads = key.shape[1]
    # head h reads KV head h // groups (repeat_kv's order), so a group's heads are consecutive
    packed = query.reshape(batch, kv_heads, groups * q_len, dim)
    mask_batch, attended = attention_mask.shape[0], attention_mask.shape[-1]
    mask = attention_mask.unsqueeze(2).expand(mask_batch, 1, groups, q_len, attended)
    mask = mask.reshape(mask_batch, 1, groups * q_len, attended)
    out = scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_sdpa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_grouped_attention(model: Any) -> bool:
    """Switch ``model`` from "sdpa" to ``NAME`` (same results, no KV copies); False when it uses another
    implementation or has sub-models with configs of their own (left as they are)."""
    config = model.config
    if config._attn_implementation != "sdpa" or getattr(config, "sub_configs", None):
        return False
    config._attn_implementation_internal = NAME
    return True
