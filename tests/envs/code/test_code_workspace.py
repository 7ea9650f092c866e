"""Copy-on-write workspaces: the base is never changed, snapshots restore exactly, the pool, cleanup, path safety."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.envs.code.sandbox import Sandbox
from taskrl.envs.code.workspace import (
    BaseTree,
    PathOutsideWorkspaceError,
    Workspace,
    WorkspaceConfig,
    WorkspaceError,
    WorkspacePool,
    overlay_available,
    sweep_stale,
)

ROOT = os.geteuid() == 0
MODES = (
    ["copy"] + (["hardlink"] if ROOT else []) + (["overlay"] if overlay_available(Path(tempfile.gettempdir())) else [])
)


def tree(root: Path) -> dict[str, str]:
    """Every file under root with its content (symlinks as '-> target')."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_text()
    return out


def mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.fixture(params=MODES)
def pool(request: pytest.FixtureRequest, base_tree: Path, workspace_config: WorkspaceConfig) -> WorkspacePool:
    config = WorkspaceConfig(root=workspace_config.root, mode=request.param, pool_size=0)
    pool = WorkspacePool(BaseTree(base_tree), config)
    yield pool
    pool.close()


async def test_writes_never_reach_the_base(pool: WorkspacePool, base_tree: Path, sandbox: Sandbox) -> None:
    before = tree(base_tree)
    with pool.acquire() as ws:
        assert tree(ws.path) == before
        ws.write_file("pkg/calc.py", b"def add(a, b):\n    return a - b\n")
        ws.write_file("new/dir/file.txt", b"new\n")
        commands = (
            "sed -i 's/deep/DEEP/' pkg/sub/deep.txt; rm test_calc.py; echo more >> fresh.txt; mv pkg/__init__.py x.py"
        )
        result = await sandbox.run(commands, ws.path)
        assert result.ok, result.format()
        appended = await sandbox.run("echo more >> pkg/calc.py", ws.path)  # in place, into a file we replaced
        assert appended.ok
        shared = await sandbox.run("echo more >> pkg/sub/deep.txt", ws.path)  # a file still shared with the base
        assert shared.ok == (pool.mode != "hardlink")  # hardlink mode refuses in-place writes to shared files
        view = tree(ws.path)
        assert view["pkg/calc.py"] == "def add(a, b):\n    return a - b\nmore\n"
        assert view["new/dir/file.txt"] == "new\n" and "test_calc.py" not in view and "x.py" in view
        assert view["pkg/sub/deep.txt"].startswith("DEEP")
    assert tree(base_tree) == before


async def test_snapshot_and_restore_are_exact(pool: WorkspacePool, sandbox: Sandbox) -> None:
    with pool.acquire() as ws:
        ws.write_file("pkg/calc.py", b"v1\n")
        (ws.path / "test_calc.py").unlink()
        os.symlink("pkg/calc.py", ws.path / "link")
        at_checkpoint = tree(ws.path)
        ws.snapshot("step-1")
        ws.write_file("pkg/calc.py", b"v2\n")
        ws.write_file("later.txt", b"later\n")
        await sandbox.run("rm -r pkg/sub; echo back > test_calc.py", ws.path)
        ws.restore("step-1")
        assert tree(ws.path) == at_checkpoint
        result = await sandbox.run("cat pkg/calc.py; ls pkg/sub", ws.path)  # the sandbox sees the restored tree
        assert result.stdout == "v1\ndeep.txt\n"
        ws.write_file("again.txt", b"x")
        ws.restore("step-1")  # a snapshot can be restored more than once
        assert tree(ws.path) == at_checkpoint
        assert ws.snapshots == ["step-1"]
        with pytest.raises(WorkspaceError, match="no snapshot named 'nope' \\(snapshots: step-1\\)"):
            ws.restore("nope")
        with pytest.raises(WorkspaceError, match="snapshot name"):
            ws.snapshot("../evil")


def test_destroy_unmounts_and_removes_everything(pool: WorkspacePool) -> None:
    ws = pool.acquire()
    ws.write_file("x", b"y")
    ws.destroy()
    assert not ws.dir.exists() and not mounted(ws.path) and not ws.alive
    ws.destroy()  # idempotent


def test_warm_pool_hands_out_distinct_clean_workspaces(base_tree: Path, workspace_config: WorkspaceConfig) -> None:
    pool = WorkspacePool(BaseTree(base_tree), WorkspaceConfig(root=workspace_config.root, pool_size=2))
    deadline = time.monotonic() + 10
    while len(pool._ready) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(pool._ready) == 2
    warm = list(pool._ready)
    first, second = pool.acquire(), pool.acquire()
    assert [first, second] == warm and first.path != second.path
    first.write_file("pkg/calc.py", b"changed")
    assert (second.path / "pkg/calc.py").read_text().startswith("def add")
    first.destroy()
    second.destroy()
    while len(pool._ready) < 2 and time.monotonic() < deadline:  # refilled in the background
        time.sleep(0.01)
    refill = list(pool._ready)
    pool.close()
    assert all(not ws.alive and not ws.dir.exists() for ws in refill)
    with pytest.raises(WorkspaceError, match="closed"):
        pool.acquire()


CRASH = """
import os, sys
from taskrl.envs.code.workspace import BaseTree, WorkspaceConfig, WorkspacePool
pool = WorkspacePool(BaseTree(sys.argv[1]), WorkspaceConfig(root=sys.argv[2], mode=sys.argv[3], pool_size=0))
ws = pool.acquire()
ws.write_file("crash.txt", b"left behind")
print(ws.dir, flush=True)
if sys.argv[4] == "crash":
    os._exit(1)  # no atexit, no finally: like SIGKILL
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ending", ["crash", "exit"])
def test_cleanup_on_exit_and_sweep_after_a_crash(base_tree: Path, agent_tmp: Path, mode: str, ending: str) -> None:
    root = agent_tmp / "root"
    args = [sys.executable, "-c", CRASH, str(base_tree), str(root), mode, ending]
    done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == (1 if ending == "crash" else 0), done.stderr
    left = Path(done.stdout.strip())
    if ending == "exit":  # atexit removed it
        assert not left.exists() and list(root.iterdir()) == []
        return
    try:
        assert left.exists() and (left / "view" / "crash.txt").exists()
    finally:  # even when the check fails, no mount may outlive the test
        removed = sweep_stale(root)
    assert removed >= 1 and not left.exists() and not mounted(left / "view")


@pytest.mark.parametrize("mode", MODES)
def test_paths_that_leave_the_workspace_are_refused(
    base_tree: Path, workspace_config: WorkspaceConfig, mode: str
) -> None:
    root = Path(workspace_config.root_dir())
    with Workspace(BaseTree(base_tree), root, mode) as ws:  # type: ignore[arg-type]
        os.symlink("/etc", ws.path / "etc_link")
        os.symlink("pkg", ws.path / "inside_link")
        for bad, why in [
            ("/etc/passwd", "is absolute"),
            ("../outside", "uses '..'"),
            ("pkg/../../x", "uses '..'"),
            ("etc_link/passwd", "symlink"),
            ("etc_link", "symlink"),
        ]:
            with pytest.raises(PathOutsideWorkspaceError, match=why):
                ws.resolve(bad)
        assert ws.resolve("inside_link/calc.py") == ws.path / "pkg" / "calc.py"
        assert ws.resolve(".") == ws.path
        with pytest.raises(FileNotFoundError, match="'missing.py' does not exist"):
            ws.resolve("missing.py", must_exist=True)


@pytest.fixture(scope="module")
def property_ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("property")
    (root / "base" / "pkg").mkdir(parents=True)
    (root / "base" / "pkg" / "calc.py").write_text("x")
    ws = Workspace(BaseTree(root / "base"), root / "ws", "hardlink")
    os.symlink("/etc", ws.path / "etc_link")
    os.symlink("pkg", ws.path / "inside_link")
    yield ws
    ws.destroy()


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.sampled_from(["a", "pkg", "..", ".", "", "/", "etc_link", "inside_link", "calc.py"]), max_size=6)
)
def test_resolve_never_returns_a_path_outside(property_ws: Workspace, parts: list[str]) -> None:
    relpath = "/".join(parts)
    try:
        resolved = property_ws.resolve(relpath)
    except PathOutsideWorkspaceError:
        return
    assert resolved == property_ws.path or property_ws.path in resolved.parents


@pytest.mark.parametrize(("field", "value"), [("mode", "zfs"), ("pool_size", -1), ("root", "/tmp/a,b")])
def test_config_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"WorkspaceConfig.{field}"):
        WorkspaceConfig(**{field: value})


def test_tree_bytes_counts_each_inode_once_and_refuses_what_it_cannot_measure(tmp_path: Path) -> None:
    from taskrl.envs.code.trees import MAX_TREE_DEPTH, tree_bytes

    (tmp_path / "a").write_bytes(b"x" * (1 << 20))
    os.link(tmp_path / "a", tmp_path / "b")  # a hard link is no second copy
    with open(tmp_path / "sparse", "wb") as f:  # 1 GiB long, holding one block
        f.seek(1 << 30)
        f.write(b"x")
    (tmp_path / "sub").mkdir()
    os.symlink("/usr", tmp_path / "sub" / "link")  # never followed
    total = tree_bytes(tmp_path)
    assert total is not None and (1 << 20) <= total < (1 << 20) + (1 << 18)
    st = os.stat(tmp_path / "a")  # a base's inode, shared by every workspace, costs nothing
    assert tree_bytes(tmp_path, exclude=frozenset({(st.st_dev, st.st_ino)})) < (1 << 18)  # type: ignore[operator]
    deep = tmp_path / "deep"
    path = deep
    for _ in range(MAX_TREE_DEPTH + 2):
        path = path / "d"
    path.mkdir(parents=True)
    assert tree_bytes(tmp_path) is None


@pytest.mark.parametrize("mode", [m for m in MODES if m != "overlay"])  # an overlay's quota is its tmpfs: not walked
def test_a_workspace_its_walk_cannot_measure_counts_as_full(
    base_tree: Path, workspace_config: WorkspaceConfig, mode: str
) -> None:
    # it read as empty (the walk's error was swallowed), so every next command got the whole quota again
    from taskrl.envs.code.trees import MAX_TREE_DEPTH

    pool = WorkspacePool(BaseTree(base_tree), WorkspaceConfig(root=workspace_config.root, mode=mode, pool_size=0))
    ws = pool.acquire()
    try:
        assert ws.mode == mode
        assert ws.disk_usage() < ws.disk_quota_bytes and ws.quota_note() is None
        path = ws.path / "deep"
        for _ in range(MAX_TREE_DEPTH + 2):
            path = path / "d"
        path.mkdir(parents=True)
        (path / "data").write_bytes(b"x" * (1 << 20))
        assert ws.disk_usage() == ws.disk_quota_bytes and ws.disk_budget() == 0
        assert "cannot be measured" in (ws.quota_note() or "")
    finally:
        ws.destroy()
        pool.close()


@pytest.mark.parametrize("mode", ["copy", *(["hardlink"] if ROOT else [])])
def test_the_quota_reading_follows_host_writes_without_a_walk(
    base_tree: Path, workspace_config: WorkspaceConfig, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each command walked the tree twice (77 ms each at 20,000 files): the reading kept between commands must
    # stay exactly what a walk would say, or the quota drifts
    import taskrl.envs.code.workspace as workspace_module
    from taskrl.envs.code.trees import tree_bytes

    walks: list[str] = []
    monkeypatch.setattr(workspace_module, "tree_bytes", lambda *a, **k: walks.append("walk") or tree_bytes(*a, **k))
    pool = WorkspacePool(BaseTree(base_tree), WorkspaceConfig(root=workspace_config.root, mode=mode, pool_size=0))
    ws = pool.acquire()
    try:
        shared = ws._shared_inodes()
        walked = lambda: tree_bytes(ws.path, exclude=shared)  # noqa: E731
        assert ws.disk_budget() == ws.disk_quota_bytes - walked() and walks == ["walk"]  # the first: one walk
        base_file = next(p.relative_to(ws.path) for p in ws.path.rglob("*.py"))
        for relpath, data in (("new.txt", b"a" * 10_000), ("new.txt", b"b" * 100), (str(base_file), b"x" * 50_000),
                              ("sub/dir/more.bin", b"\0" * 200_000), (str(base_file), b"")):  # fmt: skip
            ws.write_file(relpath, data)
            assert ws.disk_budget() == ws.disk_quota_bytes - walked(), relpath
        assert walks == ["walk"]  # every write above was kept exactly, without walking
        growth = ws.disk_growth()
        assert growth is not None and growth() == 0
        (ws.path / "by-a-command").write_bytes(b"c" * 8192)
        assert growth() == walked() - (ws.disk_quota_bytes - ws.disk_budget()) >= 8192
        os.link(ws.path / "new.txt", ws.path / "second-link")  # two links: only a walk can tell what a write frees
        ws.write_file("new.txt", b"d")
        walks.clear()
        assert ws.disk_budget() == ws.disk_quota_bytes - walked() and walks == ["walk"]
        ws.snapshot("s")
        ws.write_file("after.txt", b"e" * 40_000)
        ws.restore("s")  # the tree changed wholesale: the next budget walks again
        walks.clear()
        assert ws.disk_budget() == ws.disk_quota_bytes - walked() and walks == ["walk"]
    finally:
        ws.destroy()
        pool.close()
