"""``minimal_edit``: the expert's short edit_file call applies exactly the mined gold fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskrl.envs.code.tasks import BUILTIN_BUGS, load_bug_tasks, minimal_edit

SETS = sorted((Path(__file__).parents[3] / "benchmarks/learning/data/code").glob("*.json"))


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
