"""Bug mining: golden mutations, unique snippets, the shipped task set re-verified, the CLI end to end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from taskrl.datagen.codebugs import (
    MineConfig,
    MiningError,
    candidate_mutations,
    describe,
    fetch_sdist,
    snippet_pair,
)
from taskrl.envs.code.env import CodeBugsEnv, CodeEnvConfig
from taskrl.envs.code.sandbox import Sandbox, SandboxConfig
from taskrl.envs.code.tasks import BUILTIN_DATA, TaskSetError, load_bug_tasks
from taskrl.envs.code.testrun import PASSED, run_pytest
from taskrl.envs.code.workspace import WorkspaceConfig, pool_for
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode

SOURCE = '''def f(a, b):
    """Doc with 1 < 2."""
    if a < b and not a:
        x = a + 1
        g(a, b)
    return x


def untested(y):
    return y * 2
'''


def mutated_lines(source: str, covered: set[int]) -> set[tuple[str, str]]:
    data = source.encode()
    out = set()
    for m in candidate_mutations("m.py", source, covered):
        new = m.apply(data).decode()
        changed = [line for line in new.splitlines() if line not in source.splitlines()]
        out.add((m.kind, changed[0].strip() if changed else "<line removed>"))
    return out


def test_candidate_mutations_golden() -> None:
    assert mutated_lines(SOURCE, covered={1, 2, 3, 4, 5, 6}) == {
        ("flip comparison", "if a <= b and not a:"),
        ("swap boolean operator", "if a < b or not a:"),
        ("drop negation", "if a < b and a:"),
        ("negate condition", "if not (a < b and not a):"),
        ("swap operator", "x = a - 1"),
        ("off by one", "x = a + 2"),
        ("swap arguments", "g(b, a)"),
        ("drop statement", "<line removed>"),
    }
    assert all(m.function == "f" for m in candidate_mutations("m.py", SOURCE, {1, 2, 3, 4, 5, 6}))
    assert mutated_lines(SOURCE, covered={10}) == {("swap operator", "return y // 2"), ("off by one", "return y * 3")}
    assert candidate_mutations("m.py", SOURCE, covered=set()) == []


def test_snippet_pair_grows_until_unique() -> None:
    original = "a = 1\nb = 1\nx = 0\nb = 1\nc = 2\n"
    buggy = "a = 1\nb = 1\nx = 1\nb = 1\nc = 2\n"
    assert snippet_pair(original, buggy, 3) == ("x = 0\n", "x = 1\n")
    removed = "a = 1\nb = 1\nb = 1\nc = 2\n"
    old, new = snippet_pair(original, removed, 3)
    assert original.count(old) == 1 and removed.count(new) == 1 and original.replace(old, new) == removed


def test_descriptions_are_vague() -> None:
    from random import Random

    (mutation,) = [m for m in candidate_mutations("pkg/core.py", SOURCE, {4}) if m.kind == "swap operator"]
    text = describe(mutation, ["tests.test_core::test_f[1-2]"], Random(0))
    assert "a - 1" not in text and "swap" not in text and "+" not in text  # a symptom, never the fix
    assert any(s in text for s in ("f", "test_f", "pkg.core"))


async def test_shipped_task_set_fails_with_each_bug_and_passes_without() -> None:
    task_set = load_bug_tasks()
    meta = task_set.meta
    sandbox = Sandbox(SandboxConfig())
    pool = pool_for(task_set.repo, WorkspaceConfig(pool_size=0))
    baseline = set(meta["baseline_passed"])

    async def outcomes(files: dict[str, str]) -> dict[str, str]:
        with await asyncio.to_thread(pool.acquire) as ws:
            for path, text in files.items():
                ws.write_file(path, text.encode())
            run, _ = await run_pytest(sandbox, ws.path, meta["test_files"])
            return run.outcomes

    clean, *buggy = await asyncio.gather(outcomes({}), *(outcomes(t.info["files"]) for t in task_set.tasks))
    assert {t for t, o in clean.items() if o == PASSED} == baseline  # the gold (original) code passes
    for task, seen in zip(task_set.tasks, buggy, strict=True):
        broken = {t for t in baseline if seen.get(t) != PASSED}
        assert broken == set(task.info["fail_to_pass"]), task.id


def test_task_set_refuses_a_different_sdist(tmp_path: Path) -> None:
    data = json.loads((BUILTIN_DATA / "inflection-0.5.1.json").read_text())
    (tmp_path / "set.json").write_text(json.dumps(data))
    (tmp_path / "inflection-0.5.1.tar.gz").write_bytes(b"not the mined sdist")
    with pytest.raises(TaskSetError, match="does not match the sha256"):
        load_bug_tasks(tmp_path / "set.json")
    with pytest.raises(TaskSetError, match="not found; make one with `taskrl datagen codebugs`"):
        load_bug_tasks(tmp_path / "missing.json")


def test_fetch_sdist_spec_and_local_copies() -> None:
    with pytest.raises(MiningError, match="--sdist must look like NAME==VERSION"):
        fetch_sdist("inflection>=0.5")
    assert fetch_sdist("Inflection==0.5.1") == BUILTIN_DATA / "inflection-0.5.1.tar.gz"


def test_fetch_sdist_downloads_with_pip_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKRL_CACHE", str(tmp_path))
    path = fetch_sdist("six==1.17.0")
    assert path == tmp_path / "code" / "sdists" / "six-1.17.0.tar.gz" and path.stat().st_size > 10_000
    assert fetch_sdist("six==1.17.0") == path  # cached now
    with pytest.raises(MiningError, match="pip download six==0.0.0.404 failed"):
        fetch_sdist("six==0.0.0.404")


def test_cli_mines_verified_tasks_that_the_env_can_play(tmp_path: Path) -> None:
    from taskrl.cli import app

    out = tmp_path / "mined" / "inflection.json"
    args = ["datagen", "codebugs", "--sdist", "inflection==0.5.1", "--n", "1", "--seed", "3", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "kept 1/1 tasks" in result.output
    data = json.loads(out.read_text())
    (spec,) = data["tasks"]
    assert (out.parent / "inflection-0.5.1.tar.gz").is_file()
    assert spec["fail_to_pass"] and set(spec["fail_to_pass"]) <= set(data["baseline_passed"])
    assert spec["original"] != spec["buggy"] and spec["prompt"].startswith("Issue #")
    env = CodeBugsEnv(str(out), CodeEnvConfig(workspace=WorkspaceConfig(pool_size=0)))
    (task,) = env.tasks("all")
    traj = asyncio.run(run_episode(env, ScriptedPolicy(env.scripted_rule), task, RolloutConfig(), seed=0))
    env.close()
    assert traj.rewards == {"tests": 1.0}


@pytest.mark.parametrize(("field", "value"), [("n", 0), ("concurrency", 0), ("test_timeout_s", 0)])
def test_config_errors_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"MineConfig.{field}"):
        MineConfig(**{field: value})


LIB = "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n"
TESTS = (
    "from mylib.core import clamp\n\n\nclass TestClamp:\n"
    "    def test_inside(self):\n        assert clamp(5, 0, 10) == 5\n\n"
    "    def test_low(self):\n        assert clamp(-1, 0, 10) == 0\n\n\n"
    "def test_high():\n    assert clamp(11, 0, 10) == 10\n"
)
LAYOUTS = {  # (where the package lives, where the tests live)
    "src": ("src/mylib", "tests/test_core.py"),
    "flat": ("mylib", "test_core.py"),
    "root package, tests in test/": ("mylib", "test/test_core.py"),
    "root package, tests in tests/": ("mylib", "tests/test_core.py"),
}


def _sdist(tmp_path: Path, package: str, tests: str, extra: dict[str, str] | None = None) -> Path:
    import tarfile

    root = tmp_path / "mylib-1.0"
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "core.py").write_text(LIB)
    for path, text in {tests: TESTS, **(extra or {})}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    sdist = tmp_path / "mylib-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(root, arcname="mylib-1.0")
    return sdist


@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_mines_every_common_layout_and_prompts_name_real_files(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import tempfile

    from taskrl.datagen.codebugs import mine_bugs
    from taskrl.envs.code.workspace import remove_tree

    roots = Path(tempfile.mkdtemp(prefix="taskrl-mine-"))  # searchable by the sandbox uid (pytest's is 0700)
    os.chmod(roots, 0o755)
    request_cleanup = roots
    workspace_config = WorkspaceConfig(root=str(roots / "ws"), pool_size=0)

    monkeypatch.setenv("TASKRL_CACHE", str(tmp_path / "cache"))
    package, tests = LAYOUTS[layout]
    config = MineConfig(n=1, max_candidates=20, cpu_seconds=120, workspace=workspace_config)
    meta, report = await mine_bugs(_sdist(tmp_path, package, tests), config)
    assert meta["test_files"] == [tests] and report.baseline_passed == 3 and report.kept == 1, report
    for spec in meta["tasks"]:
        named = [w.strip("`,.") for w in spec["prompt"].split() if w.strip("`,.").endswith(".py")]
        assert all(name == tests for name in named), spec["prompt"]
        assert spec["fail_to_pass"] and spec["path"] == f"{package}/core.py"
    remove_tree(request_cleanup)


SHUFFLED_TESTS = (  # ids like "c-obj0": the order, hence the index, changes from run to run (8! orders)
    "import random\n\nimport pytest\n\nfrom mylib.core import clamp\n\n"
    "CASES = [(name, object()) for name in 'abcdefgh']\nrandom.shuffle(CASES)\n\n\n"
    "@pytest.mark.parametrize('name,obj', CASES)\ndef test_shuffled(name, obj):\n    assert clamp(5, 0, 10) == 5\n"
)


def test_unstable_tests_drop_the_whole_parametrised_family() -> None:
    from taskrl.datagen.codebugs import unstable_tests

    first = {"t::a[x-obj0]", "t::a[y-obj1]", "t::a[z-obj2]", "t::b", "t::c[1]"}
    second = {"t::a[y-obj0]", "t::a[x-obj1]", "t::a[z-obj2]", "t::b", "t::c[1]"}
    assert unstable_tests(first, second) == {"t::a[x-obj0]", "t::a[y-obj1]", "t::a[z-obj2]", "t::a[y-obj0]",
                                             "t::a[x-obj1]"}  # fmt: skip
    assert unstable_tests(first, set(first)) == set()


async def test_tests_with_run_dependent_ids_stay_out_of_the_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gold fix must score 1: a test id that changes between runs would count as failing after it."""
    import os
    import tempfile

    from taskrl.datagen.codebugs import mine_bugs
    from taskrl.envs.code.workspace import remove_tree

    roots = Path(tempfile.mkdtemp(prefix="taskrl-mine-"))
    os.chmod(roots, 0o755)
    monkeypatch.setenv("TASKRL_CACHE", str(tmp_path / "cache"))
    config = MineConfig(n=1, max_candidates=20, cpu_seconds=120,
                        workspace=WorkspaceConfig(root=str(roots / "ws"), pool_size=0))  # fmt: skip
    sdist = _sdist(tmp_path, "mylib", "tests/test_core.py", {"tests/test_shuffled.py": SHUFFLED_TESTS})
    try:
        meta, report = await mine_bugs(sdist, config)
    finally:
        remove_tree(roots)
    assert report.unstable >= 8 and meta["unstable_tests"] == report.unstable, report
    assert report.baseline_passed == 3 and not any("shuffled" in t for t in meta["baseline_passed"])
    assert report.kept == 1 and not any("shuffled" in t for t in meta["tasks"][0]["fail_to_pass"])


def test_a_test_file_is_named_only_when_it_exists() -> None:
    from random import Random

    from taskrl.datagen.codebugs import test_file_of

    files = ["tests/test_core.py", "test_other.py"]
    assert test_file_of("tests.test_core.TestClamp::test_low", files) == "tests/test_core.py"
    assert test_file_of("test_other::test_x", files) == "test_other.py"
    assert test_file_of("mylib.core::mylib.core.clamp", files) is None  # a doctest: no test file
    (mutation,) = [m for m in candidate_mutations("pkg/core.py", SOURCE, {4}) if m.kind == "swap operator"]
    for seed in range(20):
        text = describe(mutation, ["pkg.core::pkg.core.f"], Random(seed), files)
        assert ".py" not in text


def test_cli_has_the_cpu_limit(tmp_path: Path) -> None:
    from taskrl.cli import app

    result = CliRunner().invoke(app, ["datagen", "codebugs", "--help"])
    assert "--cpu-seconds" in result.output and "--test-timeout" in result.output
    assert MineConfig(cpu_seconds=500).sandbox.cpu_seconds == 500
    with pytest.raises(ValueError, match="MineConfig.cpu_seconds"):
        MineConfig(cpu_seconds=0)
