"""Mixed-precision choices: which compute dtype the learner and the rollout copy use, and why.

``resolve(choice, device)`` turns a config value (float32, bfloat16, auto) into a dtype and a one-line reason;
``auto`` picks bfloat16 only where the hardware accelerates it: CUDA with ``torch.cuda.is_bf16_supported()``,
a CPU whose /proc/cpuinfo flags include ``amx_bf16`` or ``avx512_bf16`` (elsewhere bf16 is emulated and slower).
``weights_dtype(choice, device)`` resolves the model's weights dtype the same way (``TrainConfig.dtype``);
``torch_dtype(name)`` maps a configured dtype name to torch's.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from taskrl.policies.models import resolve_device

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes a config may name (``TrainConfig.dtype``, ``learner_precision``, ``rollout_dtype``)."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a config names; a ``ValueError`` listing the choices for any other name."""
    if name not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def bf16_accelerated(device: torch.device) -> tuple[bool, str]:
    """Whether bfloat16 math is hardware-accelerated on ``device``, and the evidence."""
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, f"CUDA bf16 {'supported' if ok else 'not supported'} ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        found = [flag for flag in BF16_CPU_FLAGS if flag in cpu_flags()]
        if found:
            return True, f"CPU has {'/'.join(found)}"
        return False, f"CPU lacks {'/'.join(BF16_CPU_FLAGS)}"
    return False, f"no bf16 acceleration known for {device.type}"


def resolve(choice: str, device: torch.device, *, same: torch.dtype = torch.float32) -> tuple[torch.dtype, str]:
    """(dtype, reason) of a config value: float32 | bfloat16 | float16 | auto | same (-> ``same``)."""
    if choice == "same":
        return same, "same as the learner's weights"
    if choice == "auto":
        ok, why = bf16_accelerated(device)
        return (torch.bfloat16, f"auto: {why}") if ok else (torch.float32, f"auto: {why}, so float32")
    return torch_dtype(choice), "as configured"


def weights_dtype(choice: str, device: str | torch.device | None) -> tuple[torch.dtype, str]:
    """(dtype, reason) of the model's weights for a configured ``dtype`` (float32 | bfloat16 | float16 | auto) on
    ``device`` (a config value such as "auto" or "cuda:1", resolved as the policy loader resolves it)."""
    return resolve(choice, resolve_device(device))


def learner_autocast(choice: str, device: torch.device) -> tuple[torch.dtype | None, str]:
    """The learner's autocast dtype (None = plain float32 math) and a log line saying which and why."""
    dtype, why = resolve(choice, device)
    if dtype == torch.float32:
        return None, f"learner float32 ({why})"
    return dtype, f"learner {str(dtype).removeprefix('torch.')} autocast over fp32 master weights ({why})"
