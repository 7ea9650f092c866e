"""A lean inference forward for Llama-family decoders, for the continuous engine on CPU.

On a 2-core CPU a SmolLM2-135M decode step is bound by per-op overhead, not by arithmetic: transformers' forward
makes ~50 tensor ops and ~15 module calls per layer (peft's LoRA wrappers add ~35 more), each costing several
microseconds of Python and dispatch, so a one-token forward took 44 ms of which the matrix products were ~16.
``FastDecoder`` computes the same function with ~20 ops per layer and no module calls: the query/key/value and
gate/up projections fused into one matrix each, LoRA adapters merged into those matrices, torch's fused RMSNorm,
grouped-query attention on the engine's ``RowKV`` as it lies (``[B, H, q, D] -> [B, KV, G*q, D]``, as
``taskrl.policies.attention`` does), and the mask expanded once per forward instead of once per layer.

Its weights are a snapshot: ``FastDecoder.build(model)`` merges and fuses them from the model as it is, so the
engine rebuilds it whenever the weights may have changed (the same check that empties its KV). It costs one copy
of the projection weights, which is why ``HFPolicy(fast_forward="auto")`` uses it on CPU only (an accelerator's
memory is better spent on KV, and its overhead is a kernel-launch problem). Results equal transformers' forward
to float precision (the tests compare logits on ragged cached rows, with and without LoRA); in bfloat16 the
fused products round differently, within the float noise the learner's ``losses/mismatch_kl`` already measures.

``FastDecoder.build`` returns ``(None, reason)`` for anything it does not reproduce exactly (another
architecture, biases, DoRA, LoRA on the embeddings, rope scaling that needs a dynamic update), and the engine
keeps transformers' forward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.functional import scaled_dot_product_attention

from taskrl.policies.kvcache import RowKV

logger = logging.getLogger(__name__)

SUPPORTED = ("llama",)
"""``config.model_type`` values whose decoder layer this module reproduces."""
_STATIC_ROPE = ("default", "linear", "llama3")
"""Rope types whose inverse frequencies do not depend on the sequence (no ``dynamic_rope_update`` at run time)."""


@dataclass
class _Layer:
    norm_in: torch.Tensor
    qkv: torch.Tensor  # [(H + 2 KV) * D, hidden]
    o: torch.Tensor
    norm_post: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor


def _base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _merged(linear: Any) -> tuple[torch.Tensor | None, str]:
    """``linear``'s effective weight (LoRA deltas of its active adapters added), or ``(None, why not)``."""
    if type(linear) is torch.nn.Linear:
        return (linear.weight.detach(), "") if linear.bias is None else (None, "a projection has a bias")
    base = getattr(linear, "base_layer", None)
    if base is None or type(base) is not torch.nn.Linear or base.bias is not None:
        return None, f"unsupported projection {type(linear).__name__}"
    if getattr(linear, "merged", False) or getattr(linear, "disable_adapters", False):
        return None, "peft adapters merged or disabled"
    if any(getattr(linear, "use_dora", {}).values()):
        return None, "DoRA adapters"
    if any(getattr(linear, "lora_bias", {}).values()):
        return None, "LoRA adapters with a bias"
    weight = base.weight.detach()
    active = [name for name in linear.active_adapters if name in getattr(linear, "lora_A", {})]
    if not active:
        return weight, ""
    weight = weight.clone()
    for name in active:
        weight += linear.get_delta_weight(name).to(weight.dtype)
    return weight, ""


class FastDecoder:
    """One Llama-family model's weights, fused and merged, and the forward the engine runs on them."""

    def __init__(self, base: Any, layers: list[_Layer], dims: tuple[int, int, int]) -> None:
        self.embed = base.model.embed_tokens  # a module call: forward hooks on the embeddings still fire
        self.rotary = base.model.rotary_emb
        self.norm = base.model.norm.weight.detach()
        self.eps = float(base.config.rms_norm_eps)
        self.lm_head = base.lm_head.weight.detach()
        self.layers = layers
        self.heads, self.kv_heads, self.head_dim = dims
        self.scaling = self.head_dim**-0.5

    @classmethod
    def build(cls, model: Any) -> tuple[FastDecoder | None, str]:
        """A ``FastDecoder`` of ``model``'s current weights, or ``(None, the reason it cannot reproduce it)``."""
        base = _base_model(model)
        config = getattr(base, "config", None)
        if config is None or getattr(config, "model_type", None) not in SUPPORTED:
            return None, f"architecture {getattr(config, 'model_type', None)!r} (supported: {', '.join(SUPPORTED)})"
        rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
        problems = {
            "attention or MLP biases": getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False),
            f"activation {getattr(config, 'hidden_act', None)!r}": getattr(config, "hidden_act", None) != "silu",
            "pretraining_tp > 1": getattr(config, "pretraining_tp", 1) != 1,
            f"rope type {rope!r}": rope not in _STATIC_ROPE,
        }
        for problem, present in problems.items():
            if present:
                return None, problem
        if type(getattr(base.model, "embed_tokens", None)) is not torch.nn.Embedding:
            return None, "embed_tokens is wrapped (LoRA or modules_to_save on the embeddings)"
        if type(base.lm_head) is not torch.nn.Linear or base.lm_head.bias is not None:
            return None, "lm_head is wrapped or has a bias"
        norms = [base.model.norm] + [n for layer in base.model.layers
                                     for n in (layer.input_layernorm, layer.post_attention_layernorm)]  # fmt: skip
        if any(not type(norm).__name__.endswith("RMSNorm") for norm in norms):
            return None, "a norm layer is wrapped (modules_to_save) or is not an RMSNorm"
        heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        layers = []
        with torch.no_grad():
            for layer in base.model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                weights = {}
                for key, linear in (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj), ("o", attn.o_proj),
                                    ("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj)):  # fmt: skip
                    weight, why = _merged(linear)
                    if weight is None:
                        return None, why
                    weights[key] = weight
                layers.append(_Layer(
                    norm_in=layer.input_layernorm.weight.detach(),
                    qkv=torch.cat([weights["q"], weights["k"], weights["v"]]),
                    o=weights["o"],
                    norm_post=layer.post_attention_layernorm.weight.detach(),
                    gate_up=torch.cat([weights["gate"], weights["up"]]),
                    down=weights["down"],
                ))  # fmt: skip
        return cls(base, layers, (heads, kv_heads, head_dim)), ""

    @property
    def nbytes(self) -> int:
        """Memory of the fused q/k/v and gate/up copies (o and down are copies too when a LoRA adapter is merged
        into them; norms, embeddings and the LM head are always the model's own tensors)."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.qkv, layer.gate_up))

    @torch.no_grad()
    def __call__(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, kv: RowKV, keep: int
    ) -> torch.Tensor:
        """Logits ``[rows, keep, vocab]`` of the last ``keep`` positions; ``mask``/``positions`` from ``kv.plan``."""
        batch, q_len = ids.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        groups = heads // kv_heads
        hidden = self.embed(ids)
        cos, sin = self.rotary(hidden, positions)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, q, D]: broadcast over heads
        # Each query head of a group is stacked along the query axis, so the mask repeats per group, once here.
        attended = mask.shape[-1]
        mask = mask.unsqueeze(2).expand(batch, 1, groups, q_len, attended).reshape(batch, 1, groups * q_len, attended)
        width = hidden.shape[-1]
        split = (heads * dim, kv_heads * dim, kv_heads * dim)
        for index, layer in enumerate(self.layers):
            x = F.rms_norm(hidden, (width,), layer.norm_in, self.eps)
            query, key, value = F.linear(x, layer.qkv).split(split, dim=-1)
            query = _rotate(query.view(batch, q_len, heads, dim).transpose(1, 2), cos, sin)
            key = _rotate(key.view(batch, q_len, kv_heads, dim).transpose(1, 2), cos, sin)
            value = value.view(batch, q_len, kv_heads, dim).transpose(1, 2)
            keys, values = kv._write(index, key, value)
            packed = query.reshape(batch, kv_heads, groups * q_len, dim)
            out = scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=self.scaling)
            out = out.reshape(batch, heads, q_len, dim).transpose(1, 2).reshape(batch, q_len, heads * dim)
            hidden = hidden + F.linear(out, layer.o)
            x = F.rms_norm(hidden, (width,), layer.norm_post, self.eps)
            gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.down)
        hidden = F.rms_norm(hidden[:, -keep:], (width,), self.norm, self.eps)
        return F.linear(hidden, self.lm_head)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding as transformers' ``apply_rotary_pos_emb`` computes it."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FastForward:
    """The engine's switch for the fast forward: a ``FastDecoder`` of the current weights, built at the first
    forward after ``invalidate`` (every weight change), or None where it does not apply (disabled, training mode,
    or a model it declined: the reason is logged once and kept in ``unsupported``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.decoder: FastDecoder | None = None
        self.unsupported: tuple[int, str] = (0, "")
        """(id of the model, why it cannot take the fast forward); another model is tried afresh."""

    def invalidate(self) -> None:
        self.decoder = None  # a snapshot of the old weights

    def get(self, model: Any) -> FastDecoder | None:
        if not self.enabled or model.training or self.unsupported[0] == id(model):
            return None
        if self.decoder is None:
            self.decoder, why = FastDecoder.build(model)
            if self.decoder is None:
                self.unsupported = (id(model), why)
                logger.info("continuous engine: transformers' forward (no fast forward: %s)", why)
        return self.decoder
