"""``minimal_edit`` and ``line_edit``: the expert's short edit_file call, and its replace_lines call, apply
exactly the mined gold fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskrl.envs.code.env import CodeBugsEnv
from taskrl.envs.code.tasks import BUILTIN_BUGS, line_edit, load_bug_tasks, minimal_edit
from taskrl.envs.code.tools import numbered, replace_line_range, split_lines
from taskrl.parsing import parse_hermes
from taskrl.types import Message

SETS = sorted((Path(__file__).parents[3] / "experiments/data/code").glob("*.json"))


def test_a_one_line_fix_drops_the_indentation_and_the_newline() -> None:
    text = "def f(x):\n    if x > 1:\n        return 1\n    return 0\n"
    assert minimal_edit(text, "    if x > 1:\n", "    if x >= 1:\n") == ("if x > 1:", "if x >= 1:")


def test_shared_lines_at_either_end_are_dropped_and_a_pure_insertion_keeps_an_anchor() -> None:
    text = "a = 1\nb = 2\nc = 3\n"
    assert minimal_edit(text, "a = 1\nb = 2\nc = 3\n", "a = 1\nb = 20\nc = 3\n") == ("b = 2", "b = 20")
    text = "a = 1\nc = 3\n"
    old, new = minimal_edit(text, "a = 1\nc = 3\n", "a = 1\nx = 0\nc = 3\n")
    assert text.replace(old, new, 1) == "a = 1\nx = 0\nc = 3\n" and text.count(old) == 1


def test_an_ambiguous_line_is_widened_until_it_is_unique() -> None:
    text = "def f():\n    x = 1\n    return x\n\ndef g():\n    x = 1\n    return x + 1\n"
    old, new = minimal_edit(text, "    x = 1\n    return x + 1\n", "    x = 2\n    return x + 1\n")
    assert text.count(old) == 1 and "x = 1" in old
    assert text.replace(old, new, 1) == text.replace("x = 1\n    return x + 1", "x = 2\n    return x + 1")


@pytest.mark.parametrize("path", [BUILTIN_BUGS, *SETS], ids=lambda p: Path(p).stem)
def test_every_mined_task_gets_a_unique_minimal_edit_equal_to_its_gold_fix(path: Path) -> None:
    for task in load_bug_tasks(path).tasks:
        edit = task.info["gold"]["edit"]
        text = task.info["files"][edit["path"]]
        old, new = minimal_edit(text, edit["old"], edit["new"])
        assert text.count(old) == 1, task.id
        assert text.replace(old, new, 1) == text.replace(edit["old"], edit["new"], 1), task.id


def test_a_one_line_fix_is_one_line_without_its_indentation() -> None:
    text = "def f(x):\n    if x > 1:\n        return 1\n    return 0\n"
    assert line_edit(text, "    if x > 1:\n", "    if x >= 1:\n") == (2, 2, "if x >= 1:")


def test_an_insertion_less_indented_than_the_line_above_takes_a_line_that_indents_it_right() -> None:
    text = "def f(a):\n    if a:\n        b()\n    c = 1\n"
    fixed = "def f(a):\n    if a:\n        b()\n    return 2\n    c = 1\n"
    start, end, new = line_edit(text, "        b()\n", "        b()\n    return 2\n")
    assert (start, end, new) == (4, 4, "return 2\nc = 1")  # line 3 would indent `return` under the if
    assert replace_line_range(text, start, end, new) == fixed
    at_end = text.removesuffix("    c = 1\n")
    start, end, new = line_edit(at_end, "        b()\n", "        b()\n    return 2\n")
    assert (start, end, new) == (2, 3, "if a:\n    b()\nreturn 2")  # nothing below: up to the header
    assert replace_line_range(at_end, start, end, new) == at_end + "    return 2\n"
    deleted = line_edit(text, "        b()\n", "")
    assert replace_line_range(text, *deleted) == text.replace("        b()\n", "")


@pytest.mark.parametrize("path", [BUILTIN_BUGS, *SETS], ids=lambda p: Path(p).stem)
def test_the_line_experts_call_fixes_every_mined_task(path: Path) -> None:
    """The expert's replace_lines call on each task, read from what it sends, applied with the tool's own
    function: exactly the gold fix, and at most 4 lines replaced."""
    env = CodeBugsEnv(str(path), hint_lines=6, edit_tool="replace_lines")
    for task in env.tasks("all"):
        edit = task.info["gold"]["edit"]
        text = task.info["files"][edit["path"]]
        read = parse_hermes(env.scripted_rule([Message("user", task.prompt)], None), env.tools).tool_calls
        window = read[0].arguments["start_line"], read[0].arguments["end_line"]
        shown = numbered(split_lines(text)[window[0] - 1 : window[1]], window[0])  # what read_file shows
        history = [Message("user", task.prompt), Message("assistant", "", read), Message("tool", shown)]
        call = json.loads(env.scripted_rule(history, None).split("<tool_call>")[1].split("</tool_call>")[0])
        assert call["name"] == "replace_lines", task.id
        args = call["arguments"]
        assert replace_line_range(text, args["start_line"], args["end_line"], args["new"]) == text.replace(
            edit["old"], edit["new"], 1
        ), task.id
        assert args["end_line"] - args["start_line"] < 4 and args["path"] == edit["path"], task.id
        # on what it read (a blank line just past the window may be replaced with it: pathspec's
        # register_pattern-32 re-inserts a statement between the trailing blank lines of a function)
        assert window[0] <= args["start_line"] <= window[1] and args["end_line"] <= window[1] + 1, task.id
