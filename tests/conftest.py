"""Session-wide fixtures: a real vLLM CPU server over SmolLM2 (started once per test session, on loopback).

The server runs from its own virtualenv (vLLM pins other transformers/fastapi versions than ours): the python in
``$TASKRL_VLLM_PYTHON``, else ``<repo>/.venv-vllm/bin/python`` (what ``make`` installs). Tests that need it skip,
naming both, only when neither python exists; a python that exists but cannot serve fails the tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
VLLM_START_TIMEOUT_S = 600.0  # tens of seconds on a quiet 2-core machine; minutes when it is shared


@dataclass(frozen=True)
class VLLMServerInfo:
    """A running vLLM server: where it answers and what it serves."""

    base_url: str
    """OpenAI base URL, e.g. ``http://127.0.0.1:41234/v1``."""
    model_dir: Path
    """The SmolLM2 directory it serves (safetensors + tokenizer): the learner loads the same weights."""
    served_model: str
    """The base model's served name."""
    dtype: str
    """The server's weight dtype (``--dtype``)."""
    max_model_len: int
    """Its context size (``--max-model-len``)."""
    log_path: Path
    """Its stdout/stderr."""


def vllm_python() -> Path | None:
    """The python that has vLLM installed, or None when this machine has none."""
    configured = os.environ.get("TASKRL_VLLM_PYTHON")
    candidates = [Path(configured)] if configured else [REPO / ".venv-vllm" / "bin" / "python"]
    return next((p for p in candidates if p.is_file()), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server's whole process group (the API server, its engine core and their workers)."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VLLMServerInfo]:
    """A vLLM CPU server over SmolLM2 with runtime LoRA loading, once per session; killed (process group) at the end."""
    python = vllm_python()
    if python is None:
        pytest.skip(f"no vLLM python: set TASKRL_VLLM_PYTHON or install it at {REPO / '.venv-vllm'} (make installs it)")
    from taskrl.policies.models import smollm2_cache_path

    model_dir = smollm2_cache_path()
    port = _free_port()
    # float32 by default: vLLM's logprobs then equal the fp32 learner's to ~1e-5, so any token or convention slip
    # shows; bfloat16 (what GPUs run; ~0.04 nats mean, ~0.3 max off the fp32 learner) via TASKRL_VLLM_DTYPE.
    dtype, max_model_len = os.environ.get("TASKRL_VLLM_DTYPE", "float32"), 2048
    log_path = Path(tempfile.mkdtemp(prefix="taskrl-vllm-")) / "server.log"
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))  # "all" fails in vLLM 0.32 (int parse)
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", cores),
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
        "HF_HUB_OFFLINE": "1",
    }
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", "base", "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(max_model_len), "--enable-lora", "--max-lora-rank", "16", "--max-loras", "4",
        "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + VLLM_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                pytest.fail(f"vLLM server exited with {process.returncode} while starting; log {log_path}:\n{tail}")
            try:
                if httpx.get(f"{base_url}/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server not up after {VLLM_START_TIMEOUT_S:g}s; log {log_path}")
            time.sleep(1.0)
        print(f"vLLM server {base_url} ({dtype}), log {log_path}", file=sys.stderr)
        yield VLLMServerInfo(base_url, model_dir, "base", dtype, max_model_len, log_path)
    finally:
        _stop(process)
