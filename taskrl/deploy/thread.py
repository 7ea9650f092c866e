"""Running an ASGI app: ``DrainingServer`` (uvicorn with a graceful drain on SIGTERM, what ``server.serve`` runs in
the foreground) and ``ServerThread`` / ``running_server`` (a background server for tests). A leaf: it knows nothing
of the app it runs.

On the first SIGTERM ``DrainingServer`` stops admitting requests (``/ready`` answers 503 so a load balancer stops
routing; chat answers 503 ``server_draining`` with ``Retry-After``, and every response closes its connection), lets
the requests in flight finish (at most ``ServeConfig.drain_timeout_s``), then closes the listener (new connections
are refused), answers what still arrives on open connections with 503 until they close (at most
``CLOSE_GRACE_S``), and exits normally, so the caller can flush the store. Closing a kept-alive connection while a
client sends on it would cut that request; the grace lets each connection end on a response instead. A second
signal, or SIGINT, exits at once as uvicorn does.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import httpx
import uvicorn

logger = logging.getLogger(__name__)
KEEP_ALIVE_S = 75
"""Idle keep-alive of the server, longer than clients' (httpx: 5 s), so a client never reuses a connection the
server is closing at that very moment (uvicorn's 5 s default races httpx's 5 s: a sporadic ReadError under load)."""


CLOSE_GRACE_S = 2.0
"""After the listener closes, how long open connections get to end on a response before the server exits."""


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain phase on SIGTERM (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, state: Any) -> None:
        super().__init__(config)
        self.state = state
        self._drain_deadline: float | None = None
        self._closed_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._drain_deadline is None:
            self.start_drain()
            return
        super().handle_exit(sig, frame)

    def start_drain(self) -> None:
        """Stop admitting requests; exit once the in-flight ones are done (or the drain timeout passes)."""
        self.state.draining = True
        self.state.metrics.draining.set(1)
        timeout = float(self.state.config.drain_timeout_s)
        self._drain_deadline = time.monotonic() + timeout
        logger.warning("draining: %d requests in flight, exit when done (at most %gs)", self.state.in_flight, timeout)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_deadline is None or self.should_exit:
            return await super().on_tick(counter)
        now = time.monotonic()
        late = now > self._drain_deadline
        if self._closed_at is None and (self.state.in_flight == 0 or late):
            if self.state.in_flight:
                logger.error("drain timeout: exiting with %d requests still in flight", self.state.in_flight)
            for server in self.servers:  # new connections are refused from here on
                server.close()
            self._closed_at = now
        if self._closed_at is not None:
            open_connections = len(self.server_state.connections)
            if not open_connections or now - self._closed_at > CLOSE_GRACE_S or late:
                self.should_exit = True
        return await super().on_tick(counter)


# -- background server (tests, notebooks) -----------------------------------------------------
class ServerThread:
    """Runs an ASGI app with uvicorn in a daemon thread; ``start()`` returns once /health answers."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        startup_timeout_s: float = 30.0,
        log_level: str = "warning",
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:41234`` (``/health`` lives here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI base URL, e.g. ``http://127.0.0.1:41234/v1`` (what ``OpenAIPolicy`` takes)."""
        return self.url + "/v1"

    def start(self) -> str:
        if self._thread is not None:
            raise RuntimeError("ServerThread already started")
        # Binding here (port 0 = any free port) and handing uvicorn the socket avoids the race of
        # picking a free port and having something else take it before uvicorn binds.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((self.host, self.port))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level=self.log_level, timeout_graceful_shutdown=5, timeout_keep_alive=KEEP_ALIVE_S
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name=f"taskrl-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.base_url

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        last_error = "not started"
        while time.monotonic() < deadline:
            assert self._thread is not None and self._server is not None
            if not self._thread.is_alive():
                raise RuntimeError(f"server thread for {self.url} exited during startup; see its log above")
            if self._server.started:
                try:
                    status = httpx.get(self.url + "/health", timeout=2.0, trust_env=False).status_code
                except httpx.HTTPError as exc:
                    last_error = f"{type(exc).__name__}: {exc}"
                else:
                    if status == 200:
                        return
                    if status == 404:
                        raise RuntimeError(f"{self.url} has no /health route; give the app one")
                    last_error = f"/health returned HTTP {status}"
            time.sleep(0.05)
        raise TimeoutError(
            f"server at {self.url} not healthy after {self.startup_timeout_s:g}s ({last_error}); "
            "raise startup_timeout_s or check the app's startup"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True  # abandon in-flight requests rather than hang the caller
            self._thread.join(5.0)
        if self._socket is not None:
            self._socket.close()
        if self._thread.is_alive():
            raise RuntimeError(f"server thread for {self.url} did not stop within {timeout_s + 5:g}s")
        self._server = self._thread = self._socket = None

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_server(
    app: Any, host: str = "127.0.0.1", port: int = 0, *, startup_timeout_s: float = 30.0
) -> Iterator[str]:
    """Run ``app`` on loopback for the duration of the block; yields the ``/v1`` base URL."""
    server = ServerThread(app, host, port, startup_timeout_s=startup_timeout_s)
    server.start()
    try:
        yield server.base_url
    finally:
        server.stop()
