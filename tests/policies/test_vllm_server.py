"""VLLMServer: config checks, clear errors for a missing venv, a down URL, a slow server, and the real session
server (``vllm_server`` in tests/conftest.py): health, serving, connect mode. kill -9 and the restart on the same
URL are tested once per session, with the trainer (tests/test_trainer_vllm.py): each restart costs a server start."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from taskrl.policies import vllm_server as vs
from taskrl.policies.vllm_server import VLLMServer, VLLMServerConfig, VLLMServerError, usable_cores


# -- config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"threads": "all"}, "threads must name CPU cores"),
        ({"threads": "1-0"}, "threads must name CPU cores"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"port": 70000}, "port must be <= 65535"),
        ({"kv_cache_gib": 0}, "kv_cache_gib must be > 0"),
        ({"logprobs_mode": "final"}, "logprobs_mode must be one of"),
        ({"url": "localhost:8000"}, r"url must be an http\(s\) base URL"),
        ({"model": ""}, "model must name the model directory"),
        ({"extra_args": "--foo"}, "extra_args must be a list of strings"),
    ],
)
def test_config_refuses_bad_fields_by_name(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VLLMServerConfig(**{"model": "/m", **fields})


def test_default_threads_name_the_usable_cores() -> None:
    cores = usable_cores()
    assert vs._valid_threads(cores) and cores != "all"
    server = VLLMServer(VLLMServerConfig(model="/m"))
    assert server.environment()["VLLM_CPU_OMP_THREADS_BIND"] == cores
    assert server.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert "--enable-lora" in server.command(Path("/py"))


def test_one_worker_runs_in_the_engine_process_unless_extra_args_ask_for_more() -> None:
    argv = VLLMServer(VLLMServerConfig(model="/m")).command(Path("/py"))
    assert argv[argv.index("--distributed-executor-backend") + 1] == "uni"
    for extra in (["--tensor-parallel-size", "2"], ["-tp=2"], ["--distributed-executor-backend", "mp"]):
        argv = VLLMServer(VLLMServerConfig(model="/m", extra_args=extra)).command(Path("/py"))
        assert "uni" not in argv and argv[-len(extra):] == extra


@pytest.mark.parametrize(("flags", "expected"), [({"avx2", "avx512_bf16"}, "bfloat16"), ({"avx2"}, "float32")])
def test_auto_dtype_is_taskrls_rule_not_the_checkpoints(monkeypatch, flags: set, expected: str) -> None:
    from taskrl.policies import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: False)
    server = VLLMServer(VLLMServerConfig(model="/m"))  # dtype "auto" by default
    argv = server.command(Path("/py"))
    assert server.dtype == expected and argv[argv.index("--dtype") + 1] == expected
    fixed = VLLMServer(VLLMServerConfig(model="/m", dtype="bfloat16"))
    assert fixed.dtype == "bfloat16" and "bfloat16" in fixed.command(Path("/py"))


def test_a_cpu_server_prefills_prompts_whole_unless_extra_args_say_otherwise(monkeypatch) -> None:
    monkeypatch.setattr(vs, "_on_cpu", lambda: True)
    argv = VLLMServer(VLLMServerConfig(model="/m", max_model_len=4096)).command(Path("/py"))
    assert "--no-enable-chunked-prefill" in argv and argv[argv.index("--max-num-batched-tokens") + 1] == "4096"
    own = VLLMServer(VLLMServerConfig(model="/m", extra_args=["--max-num-batched-tokens=512"])).command(Path("/py"))
    assert "--no-enable-chunked-prefill" not in own and own[-1] == "--max-num-batched-tokens=512"
    monkeypatch.setattr(vs, "_on_cpu", lambda: False)  # CUDA generators rewind: vLLM's defaults stay
    cuda = VLLMServer(VLLMServerConfig(model="/m", dtype="bfloat16")).command(Path("/py"))
    assert "--no-enable-chunked-prefill" not in cuda


# -- clear errors ------------------------------------------------------------------------------------
def test_missing_vllm_venv_names_the_variable_and_the_paths(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(vs.PYTHON_ENV, raising=False)
    monkeypatch.setattr(vs, "repo_root", lambda: tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(VLLMServerError) as info:
        VLLMServer(VLLMServerConfig(model=str(tmp_path))).start()
    text = str(info.value)
    assert vs.PYTHON_ENV in text and "make vllm-setup" in text
    assert str(tmp_path / "repo" / ".venv-vllm" / "bin" / "python") in text
    assert str(tmp_path / ".venv-vllm" / "bin" / "python") in text
    monkeypatch.setenv(vs.PYTHON_ENV, str(tmp_path / "nope" / "python"))
    with pytest.raises(VLLMServerError, match=r"\$TASKRL_VLLM_PYTHON = .*nope/python.* not an executable"):
        vs.vllm_python()


def test_model_that_is_no_directory_is_refused_before_starting(monkeypatch, tmp_path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    monkeypatch.setenv(vs.PYTHON_ENV, str(python))
    with pytest.raises(VLLMServerError, match="not a model directory"):
        VLLMServer(VLLMServerConfig(model=str(tmp_path / "missing"))).start()


def test_down_url_gives_a_clear_error() -> None:
    url = f"http://127.0.0.1:{vs.free_port()}/v1"
    server = VLLMServer(VLLMServerConfig(url=url, served_name="base", startup_timeout_s=1.0))
    with pytest.raises(VLLMServerError, match=rf"{url} did not answer .*/health within 1s"):
        server.start()
    assert not server.alive()
    with pytest.raises(VLLMServerError, match="not started by taskrl and cannot be restarted"):
        server.restart()


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A TCP server that accepts connections and never answers: a hung server."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    sock.close()


def test_hung_url_times_out_with_a_clear_error(silent_listener: int) -> None:
    config = VLLMServerConfig(url=f"http://127.0.0.1:{silent_listener}/v1", served_name="base",
                              startup_timeout_s=1.5, request_timeout_s=0.5)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"did not answer .*/health within 1.5s"):
        VLLMServer(config).start()
    assert time.monotonic() - started < 10


def test_slow_start_times_out_and_leaves_no_process(vllm_server: VLLMServer) -> None:
    """A real vLLM that cannot be up in 2 s: stopped, with its log's tail in the error."""
    config = VLLMServerConfig(model=str(vllm_server.model_dir), served_name="slow", startup_timeout_s=2.0)
    server = VLLMServer(config)
    with pytest.raises(VLLMServerError) as info:
        server.start()
    assert "did not answer" in str(info.value) and "within 2s" in str(info.value)
    assert "startup_timeout_s" in str(info.value) and "log ends" in str(info.value)
    assert server.pid is None and not server.alive()
    server.stop()


def test_crash_while_starting_reports_the_exit_and_log(vllm_server: VLLMServer) -> None:
    bad = VLLMServerConfig(model=str(vllm_server.model_dir), extra_args=["--no-such-flag"], startup_timeout_s=300)
    server = VLLMServer(bad)
    with pytest.raises(VLLMServerError, match=r"exited with code \d+ while starting(.|\n)*no-such-flag"):
        server.start()
    server.stop()


# -- the real server ---------------------------------------------------------------------------------
def _complete(server: VLLMServer) -> dict:
    body = {"model": server.served_model, "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0,
            "return_token_ids": True, "logprobs": 0}  # fmt: skip
    response = httpx.post(f"{server.base_url}/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_session_server_is_healthy_and_serves_token_ids(vllm_server: VLLMServer) -> None:
    assert vllm_server.alive() and not vllm_server.exited()
    assert not vllm_server.ensure_up()  # up: nothing to do
    choice = _complete(vllm_server)["choices"][0]
    assert len(choice["token_ids"]) == 4 and len(choice["logprobs"]["token_logprobs"]) == 4
    served = httpx.get(f"{vllm_server.base_url}/models", timeout=10).json()["data"]
    assert vllm_server.served_model in [m["id"] for m in served]


def test_connect_mode_checks_health_and_the_served_name(vllm_server: VLLMServer) -> None:
    remote = VLLMServer(VLLMServerConfig(url=vllm_server.base_url, served_name="base", startup_timeout_s=5))
    remote.start()
    assert remote.alive() and remote.pid is None and not remote.ensure_up()
    remote.stop()  # starts nothing, stops nothing
    assert vllm_server.alive()
    wrong = VLLMServer(VLLMServerConfig(url=vllm_server.base_url, served_name="other", startup_timeout_s=5))
    with pytest.raises(VLLMServerError, match=r"'other' is not served at .*\(served: base[,)]"):
        wrong.start()
