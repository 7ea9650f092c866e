"""Fixtures of the code-env tests: a sandbox with small limits, and workspace roots in a temp dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from taskrl.envs.code.sandbox import Sandbox, SandboxConfig, host_uid
from taskrl.envs.code.workspace import WorkspaceConfig, remove_tree

SMALL_LIMITS = dict(
    timeout_s=5.0,
    cpu_seconds=2,
    memory_bytes=1 << 30,
    max_processes=32,
    max_file_bytes=4 << 20,
    tmp_bytes=16 << 20,
    max_output_bytes=4000,
    kill_output_bytes=1 << 20,
)


@pytest.fixture(scope="session")
def small_limits() -> SandboxConfig:
    return SandboxConfig(**SMALL_LIMITS)


@pytest.fixture(scope="session")
def sandbox(small_limits: SandboxConfig) -> Sandbox:
    return Sandbox(small_limits)


def searchable(path: Path) -> Path:
    """Let the sandbox uid (as root: an unprivileged one) pass through a test's temp directory."""
    os.chmod(path, os.stat(path).st_mode | 0o755)
    return path


def agent_owned(path: Path) -> Path:
    """A directory the sandboxed commands may write in, as their host uid."""
    uid = host_uid()
    for sub in [path, *path.rglob("*")]:
        os.lchown(sub, uid, uid)
    return path


@pytest.fixture
def agent_tmp() -> Path:
    """A temp directory the sandbox uid can pass through (as root it is an unprivileged uid, and pytest's own
    temp directories live under a 0700 /tmp/pytest-of-root that every pytest session resets)."""
    path = Path(tempfile.mkdtemp(prefix="taskrl-test-"))
    yield searchable(path)
    remove_tree(path)


@pytest.fixture
def workspace_config(agent_tmp: Path) -> WorkspaceConfig:
    return WorkspaceConfig(root=str(agent_tmp / "workspaces"), pool_size=0)


@pytest.fixture
def base_tree(tmp_path: Path) -> Path:
    """A small project: two modules, a test file, a nested package."""
    base = tmp_path / "base"
    (base / "pkg" / "sub").mkdir(parents=True)
    (base / "pkg" / "__init__.py").write_text("")
    (base / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (base / "pkg" / "sub" / "deep.txt").write_text("deep\n")
    (base / "test_calc.py").write_text("from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    return base
