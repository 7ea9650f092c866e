"""The seven coding tools through the env contract: results, errors that say what to do, refused paths."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taskrl.envs.code.env import CodeEnvConfig, HumanEvalEnv
from taskrl.envs.code.sandbox import SandboxConfig
from taskrl.envs.code.tasks import SOLUTION_FILE
from taskrl.envs.code.workspace import WorkspaceConfig
from taskrl.types import ToolCall, ToolResult


@pytest.fixture
async def env(small_limits: SandboxConfig, workspace_config: WorkspaceConfig) -> AsyncIterator[HumanEvalEnv]:
    env = HumanEvalEnv(CodeEnvConfig(sandbox=small_limits, workspace=workspace_config))
    await env.reset(env.tasks("all")[0])
    yield env
    env.close()


async def call(env: HumanEvalEnv, name: str, **arguments: object) -> ToolResult:
    results, terminated, truncated, _ = await env.step([ToolCall("call_0", name, dict(arguments))])
    assert (terminated, truncated) == (False, False)
    return results[0]


async def test_the_env_has_the_seven_tools(env: HumanEvalEnv) -> None:
    assert sorted(env.tools.names) == sorted(
        ["read_file", "write_file", "edit_file", "list_dir", "search_code", "run_command", "run_tests"]
    )


async def test_read_write_and_line_ranges(env: HumanEvalEnv) -> None:
    stub = await call(env, "read_file", path=SOLUTION_FILE)
    assert not stub.is_error and "def has_close_elements" in stub.content
    written = await call(env, "write_file", path="notes/a.txt", content="one\ntwo\nthree\n")
    assert written.content == "wrote 14 bytes to notes/a.txt" and not written.is_error
    assert (await call(env, "read_file", path="notes/a.txt", start_line=2, end_line=3)).content == "two\nthree\n"
    assert (await call(env, "read_file", path="notes/a.txt", start_line=3)).content == "three\n"
    bad = await call(env, "read_file", path="notes/a.txt", start_line=3, end_line=1)
    assert bad.is_error and "bad line range" in bad.content
    assert "is a directory; use list_dir" in (await call(env, "read_file", path="notes")).content
    missing = await call(env, "read_file", path="nope.py")
    assert missing.is_error and "'nope.py' does not exist" in missing.content


async def test_edit_file_needs_exactly_one_match(env: HumanEvalEnv) -> None:
    await call(env, "write_file", path="m.py", content="x = 1\ny = 1\n")
    missing = await call(env, "edit_file", path="m.py", old="z = 1", new="z = 2")
    assert missing.is_error and "`old` was not found in 'm.py'" in missing.content
    ambiguous = await call(env, "edit_file", path="m.py", old=" = 1", new=" = 2")
    assert ambiguous.is_error and "occurs 2 times in 'm.py'; include more surrounding lines" in ambiguous.content
    empty = await call(env, "edit_file", path="m.py", old="", new="x")
    assert empty.is_error and "use write_file" in empty.content
    done = await call(env, "edit_file", path="m.py", old="y = 1", new="y = 2\nw = 3")
    assert not done.is_error and done.content == "edited m.py: replaced 1 line(s) with 2 line(s)"
    assert (await call(env, "read_file", path="m.py")).content == "x = 1\ny = 2\nw = 3\n"
    assert env.edits == 2


async def test_paths_out_of_the_workspace_are_refused(env: HumanEvalEnv, tmp_path: Path) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("host")
    for name, args in [
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "../../../etc/passwd"}),
        ("write_file", {"path": str(canary), "content": "pwned"}),
        ("list_dir", {"path": ".."}),
        ("search_code", {"pattern": "root", "path": "/etc"}),
    ]:
        result = await call(env, name, **args)
        assert result.is_error and ("absolute" in result.content or "'..'" in result.content), result.content
    made = await call(env, "run_command", command=f"ln -s {tmp_path} out && ln -s /etc etc")
    assert "exit code 0" in made.content
    for name, args in [
        ("read_file", {"path": "out/canary.txt"}),
        ("write_file", {"path": "out/canary.txt", "content": "pwned"}),
        ("edit_file", {"path": "out/canary.txt", "old": "host", "new": "pwned"}),
        ("list_dir", {"path": "etc"}),
    ]:
        result = await call(env, name, **args)
        assert result.is_error and "points outside the workspace" in result.content, result.content
    assert canary.read_text() == "host"


async def test_special_files_are_refused_instead_of_hanging(env: HumanEvalEnv) -> None:
    await call(env, "run_command", command="mkfifo pipe && head -c 100 /dev/urandom > bin.dat")
    fifo = await call(env, "read_file", path="pipe")
    assert fifo.is_error and "not a regular file" in fifo.content
    binary = await call(env, "read_file", path="bin.dat")
    assert binary.is_error and "binary file" in binary.content or not binary.is_error


async def test_list_dir_and_search_code(env: HumanEvalEnv) -> None:
    await call(env, "write_file", path="pkg/mod.py", content="def hello():\n    return 'hi'\n")
    assert (await call(env, "list_dir")).content == f"pkg/\n{SOLUTION_FILE}"
    assert (await call(env, "list_dir", recursive=True)).content == f"pkg/\npkg/mod.py\n{SOLUTION_FILE}"
    found = await call(env, "search_code", pattern="def (hello|has_close_elements)")
    assert sorted(found.content.splitlines()) == [
        "./pkg/mod.py:1:def hello():",
        f"./{SOLUTION_FILE}:4:def has_close_elements(numbers: List[float], threshold: float) -> bool:",
    ]
    assert (await call(env, "search_code", pattern="nothing_like_this")).content == "no matches"
    bad = await call(env, "search_code", pattern="(unclosed")
    assert "exit code 2" in bad.content


async def test_run_command_and_run_tests(env: HumanEvalEnv) -> None:
    out = await call(env, "run_command", command="echo hi; echo oops >&2; exit 3")
    assert out.content == "exit code 3\n[stdout]\nhi\n[stderr]\noops"
    doctests = await call(env, "run_tests")  # the stub fails the docstring's examples
    assert doctests.content.startswith("1 failed\nFAILED solution::solution.has_close_elements")
    mine = "def test_ok():\n    assert True\n\n\ndef test_bad():\n    assert 1 == 2\n"
    await call(env, "write_file", path="test_mine.py", content=mine)
    report = await call(env, "run_tests")
    assert report.content.startswith("1 passed, 2 failed\nFAILED solution::solution.has_close_elements")
    assert "FAILED test_mine::test_bad: assert 1 == 2" in report.content
    only = await call(env, "run_tests", path="test_mine.py::test_ok")
    assert only.content == "1 passed"
    assert env.commands == 1 and env.test_runs == 3


async def test_unknown_tools_and_bad_arguments_are_error_results(env: HumanEvalEnv) -> None:
    results, *_ = await env.step(
        [ToolCall("a", "rm_rf", {}), ToolCall("b", "read_file", {"path": 3}), ToolCall("c", "write_file", {})]
    )
    assert all(r.is_error for r in results)
    assert "Unknown tool 'rm_rf'" in results[0].content
    assert "argument 'path' must be string" in results[1].content
    assert "missing required argument 'path'" in results[2].content


async def test_tools_before_reset_say_so(small_limits: SandboxConfig, workspace_config: WorkspaceConfig) -> None:
    env = HumanEvalEnv(CodeEnvConfig(sandbox=small_limits, workspace=workspace_config))
    results, *_ = await env.step([ToolCall("a", "list_dir", {})])
    assert results[0].is_error and "no workspace: the episode has not been reset" in results[0].content


@pytest.fixture
async def line_env(small_limits: SandboxConfig, workspace_config: WorkspaceConfig) -> AsyncIterator[HumanEvalEnv]:
    env = HumanEvalEnv(CodeEnvConfig(sandbox=small_limits, workspace=workspace_config), edit_tool="replace_lines")
    await env.reset(env.tasks("all")[0])
    await call(env, "write_file", path="m.py", content=MODULE)
    yield env
    env.close()


MODULE = "def f(x):\n    if x > 1:\n        return 1\n    return 0\n"


async def test_a_line_addressed_env_offers_replace_lines_instead_of_edit_file(line_env: HumanEvalEnv) -> None:
    assert "replace_lines" in line_env.tools.names and "edit_file" not in line_env.tools.names
    assert len(line_env.tools.names) == 7
    with pytest.raises(ValueError, match="edit_tool must be one of"):
        HumanEvalEnv(edit_tool="sed")  # type: ignore[arg-type]


async def test_read_file_numbers_the_lines_where_edits_go_by_number(line_env: HumanEvalEnv) -> None:
    whole = await call(line_env, "read_file", path="m.py")
    assert whole.content == "1\tdef f(x):\n2\t    if x > 1:\n3\t        return 1\n4\t    return 0\n"
    assert (await call(line_env, "read_file", path="m.py", start_line=3, end_line=4)).content == (
        "3\t        return 1\n4\t    return 0\n"
    )
    await call(line_env, "write_file", path="long.py", content="".join(f"x{i} = {i}\n" for i in range(1, 12)))
    assert (await call(line_env, "read_file", path="long.py", start_line=9, end_line=10)).content == (
        " 9\tx9 = 9\n10\tx10 = 10\n"
    )


async def test_replace_lines_applies_at_the_lines_indentation(line_env: HumanEvalEnv) -> None:
    done = await call(line_env, "replace_lines", path="m.py", start_line=2, end_line=2, new="if x >= 1:")
    assert not done.is_error and done.content == "replaced lines 2-2 of m.py with 1 line(s) now:\n2\t    if x >= 1:\n"
    again = await call(line_env, "replace_lines", path="m.py", start_line=2, end_line=2, new="    if x >= 2:")
    assert not again.is_error and (line_env.workspace.path / "m.py").read_text() == MODULE.replace("> 1", ">= 2")
    block = "if x >= 2:\n    y = x * 2\n    return y\n"
    await call(line_env, "replace_lines", path="m.py", start_line=2, end_line=3, new=block)
    expected = "def f(x):\n    if x >= 2:\n        y = x * 2\n        return y\n    return 0\n"
    assert (line_env.workspace.path / "m.py").read_text() == expected
    deleted = await call(line_env, "replace_lines", path="m.py", start_line=3, end_line=3, new="")
    assert deleted.content == "replaced lines 3-3 of m.py with 0 line(s)"
    assert (line_env.workspace.path / "m.py").read_text() == expected.replace("        y = x * 2\n", "")
    assert line_env.edits == 4 + 1  # the fixture's write_file, then four replacements


async def test_replace_lines_keeps_a_file_without_a_final_newline_so(line_env: HumanEvalEnv) -> None:
    await call(line_env, "write_file", path="n.py", content="a = 1\nb = 2")
    await call(line_env, "replace_lines", path="n.py", start_line=2, end_line=2, new="b = 3\nc = 4\n")
    assert (line_env.workspace.path / "n.py").read_text() == "a = 1\nb = 3\nc = 4"


async def test_replace_lines_refuses_bad_ranges_and_paths(line_env: HumanEvalEnv, tmp_path: Path) -> None:
    for start, end, message in [(0, 1, "lines are numbered from 1"), (3, 2, "end_line must be >= start_line"),
                                (4, 5, "the file has 4 line(s)"), (9, 9, "the file has 4 line(s)")]:  # fmt: skip
        bad = await call(line_env, "replace_lines", path="m.py", start_line=start, end_line=end, new="x = 1")
        assert bad.is_error and f"bad line range {start}..{end}" in bad.content and message in bad.content
    typed = await call(line_env, "replace_lines", path="m.py", start_line="2", end_line=2, new="x")
    assert typed.is_error and "argument 'start_line' must be integer" in typed.content
    (tmp_path / "canary.py").write_text("host\n")
    await call(line_env, "run_command", command=f"ln -s {tmp_path} out && mkdir pkg")
    for path, message in [("nope.py", "'nope.py' does not exist"), ("pkg", "is a directory"),
                          ("/etc/passwd", "is absolute"), ("../m.py", "'..'"),
                          ("out/canary.py", "points outside the workspace")]:  # fmt: skip
        bad = await call(line_env, "replace_lines", path=path, start_line=1, end_line=1, new="pwned")
        assert bad.is_error and message in bad.content, (path, bad.content)
    assert (tmp_path / "canary.py").read_text() == "host\n"
    assert (line_env.workspace.path / "m.py").read_text() == MODULE and line_env.edits == 1
