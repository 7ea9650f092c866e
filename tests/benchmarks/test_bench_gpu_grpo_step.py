"""benchmarks/gpu_grpo_step.py: the trainer's GRPO step on a random Qwen3-shaped model, run for real on CPU (tiny)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from taskrl.policies.models import smollm2_tokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_grpo_step as bench  # noqa: E402


def test_tiny_cpu_run_prints_and_writes_every_measurement(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cmd = [sys.executable, "benchmarks/gpu_grpo_step.py", "--device", "cpu", "--model-size", "tiny",
           "--steps", "1", "--warmup", "0", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    for field in ("CPU (lscpu):", "GPU (nvidia-smi):", "learner tokens/s (trained):", "learner forward tokens/s:",
                  "prime-rl: 11,900", "rollout tokens/s:", "MFU (learner): n/a"):  # fmt: skip
        assert field in done.stdout, (field, done.stdout)
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["gpu"] is None and result["mfu"] is None
    assert result["model_size"] == "tiny" and result["finetune"] == "full" and result["timed_steps"] == 1
    assert result["rollouts_per_step"] == 4 and len(result["steps"]) == 1
    (step,) = result["steps"]
    # The trainer trained on every sampled token (no group dropped) and its forward saw at least those.
    assert step["trained_tokens"] == step["sampled_tokens"] > 0
    assert step["forward_tokens"] >= step["trained_tokens"]
    for key in ("learner_tokens_per_s", "learner_forward_tokens_per_s", "rollout_tokens_per_s", "step_tokens_per_s"):
        assert result[key] > 0, key
    assert result["learner_tokens_per_s"] == pytest.approx(step["trained_tokens"] / step["update_s"])
    assert result["vs_prime_rl"] == pytest.approx(result["learner_forward_tokens_per_s"] / 11_900)


def test_half_billion_shape_is_qwen3_06b_with_smollm2_vocabulary() -> None:
    from transformers import Qwen3ForCausalLM

    config = bench.model_config("0.5b", smollm2_tokenizer())
    with torch.device("meta"):  # counted without allocating 2 GB
        params = sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim) == (28, 1024, 128)
    assert 0.45e9 < params < 0.55e9


def test_peak_table_and_mfu() -> None:
    assert bench.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert bench.peak_tflops("NVIDIA H200") == 989.0
    assert bench.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert bench.peak_tflops("NVIDIA H100 PCIe") == 756.0 and bench.peak_tflops("NVIDIA H200 NVL") == 835.0
    assert bench.peak_tflops("NVIDIA GeForce RTX 4090") is None and bench.peak_tflops(None) is None
    # 6 x 0.5B params x 10k tokens/s = 3e13 FLOP/s of 989e12 -> 3.03%
    assert bench.mfu(500_000_000, 10_000.0, 1.0, 989.0) == pytest.approx(3e13 / 989e12)
    assert bench.mfu(500_000_000, 10_000.0, 1.0, None) is None


def test_bad_flags_name_the_flag() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--samples", "1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--model-size", "7b"])
    args = bench.parse_args(["--model-size", "tiny"])
    assert (args.prompts, args.samples, args.max_new_tokens) == (2, 2, 16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_cuda_asked_for_without_cuda_is_a_clear_error() -> None:
    from taskrl.policies.base import PolicyError

    with pytest.raises(PolicyError, match="CUDA is not available; use 'auto' or 'cpu'"):
        bench.run(bench.parse_args(["--device", "cuda", "--model-size", "tiny"]))
