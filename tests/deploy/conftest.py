"""Store URLs for the deploy tests: a SQLite file, and a real PostgreSQL server started for the session.

The PostgreSQL server is the distribution's own binaries (``initdb``/``pg_ctl``; the Makefile's ``sysdeps``
installs them), run in a temporary directory on a Unix socket with trust auth, as the ``postgres`` user when
the tests run as root (PostgreSQL refuses to run as root). On a dev machine without PostgreSQL the postgresql
cases skip; under CI=true they fail instead, so CI cannot pass without having tested the PostgreSQL path.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Postgres:
    """A throwaway PostgreSQL server in ``root`` on a Unix socket; ``stop()``/``start()`` simulate an outage."""

    def __init__(self, root: Path) -> None:
        initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if initdb is None or self.pg_ctl is None:
            message = "PostgreSQL binaries (initdb, pg_ctl) not found; `make sysdeps` installs them"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        pytest.importorskip("psycopg")
        self.root = root
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(root, "postgres")
        self.data, self.sock = root / "data", root / "sock"
        for d in (self.data, self.sock):
            d.mkdir()
            if self.as_user:
                shutil.chown(d, "postgres")
        subprocess.run([*self.as_user, initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"],
                       **_RUN)  # fmt: skip
        self.port = _free_port()

    def start(self) -> None:
        options = f"-k {self.sock} -p {self.port} -h '' -c fsync=off"  # Unix socket only; fsync off: tests
        log = str(self.root / "log")
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-o", options, "-w", "-l", log, "start"],
                       **_RUN)  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"],
                       capture_output=True, timeout=120)  # fmt: skip

    def new_database(self) -> str:
        return _new_database(str(self.sock), self.port)


_RUN: dict = {"check": True, "capture_output": True, "timeout": 120}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[tuple[str, int]]:
    """(socket directory, port) of a PostgreSQL server that lives for the test session."""
    server = Postgres(Path(tempfile.mkdtemp(prefix="taskrl-pg-")))
    server.start()
    try:
        yield str(server.sock), server.port
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    """A PostgreSQL server of this test alone (it may stop and restart it)."""
    server = Postgres(Path(tempfile.mkdtemp(prefix="taskrl-pg-own-")))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database for one test: a SQLite file, or a new database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    sock, port = request.getfixturevalue("postgres_server")
    return _new_database(sock, port)


def _new_database(sock: str, port: int) -> str:
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(host=sock, port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://postgres@/{name}?host={sock}&port={port}"


@pytest.fixture
def new_postgres_url(postgres_server: tuple[str, int]) -> Callable[[], str]:
    return lambda: _new_database(*postgres_server)
