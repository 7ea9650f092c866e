"""Session-wide fixtures: ONE real vLLM CPU server over SmolLM2 per test session (``vllm_server``), on loopback.

It is a supervised ``taskrl.policies.vllm_server.VLLMServer`` (started once, stopped at the end of the session;
a test that kills it leaves it restarted on the same URL). vLLM runs from its own virtualenv: ``$TASKRL_VLLM_PYTHON``
or ``<repo>/.venv-vllm/bin/python`` (``make vllm-setup``). Without one the tests that need it skip, naming both,
unless ``TASKRL_REQUIRE_VLLM=1`` (``make test`` sets it): then they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from taskrl.policies.vllm_server import VLLMServer, VLLMServerConfig, VLLMServerError, vllm_python

VLLM_START_TIMEOUT_S = 900.0  # about a minute on a quiet 2-core machine; several when it is shared


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the server may be the one that waits for its start: its time limit covers one.

    Under pytest-xdist (``make test`` runs two workers, ``--dist loadgroup``) every test of the server runs on one
    worker, so the session starts one vLLM server, not one per worker; the Ray tests share one worker too (one local
    Ray cluster at a time)."""
    for item in items:
        if "vllm_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("vllm"))
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(VLLM_START_TIMEOUT_S + 300))
        elif item.path.name.startswith("test_ray_"):
            item.add_marker(pytest.mark.xdist_group("ray"))


def require_vllm() -> None:
    """Skip (or, with ``TASKRL_REQUIRE_VLLM=1``, fail) the calling test where no vLLM virtualenv is found."""
    try:
        vllm_python()
    except VLLMServerError as exc:
        if os.environ.get("TASKRL_REQUIRE_VLLM") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VLLMServer]:
    """A vLLM CPU server over SmolLM2 (served as "base", runtime LoRA loading, processed logprobs); the attributes
    tests read: ``base_url``, ``served_model``, ``model_dir``, ``dtype``, ``max_model_len``, ``log_path``."""
    require_vllm()
    from taskrl.policies.models import smollm2_cache_path

    # float32 by default: vLLM's logprobs then equal the fp32 learner's to ~1e-5, so any token or convention slip
    # shows; bfloat16 (what GPUs run) via TASKRL_VLLM_DTYPE.
    config = VLLMServerConfig(
        model=str(smollm2_cache_path()), served_name="base", dtype=os.environ.get("TASKRL_VLLM_DTYPE", "float32"),
        max_model_len=2048,
        kv_cache_gib=2, max_lora_rank=16, max_loras=4, startup_timeout_s=VLLM_START_TIMEOUT_S,
        weight_updates=True,  # full-weight reloads (tests/test_trainer_vllm_full.py); loopback only
    )  # fmt: skip
    server = VLLMServer(config)
    try:
        server.start()
        yield server
    finally:
        pid = server.pid
        server.stop()
        if pid is not None:  # the whole process group is gone, the engine core included
            with pytest.raises(ProcessLookupError):
                os.killpg(pid, 0)
