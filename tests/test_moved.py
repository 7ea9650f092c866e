"""A moved module or name fails loudly at its old import path, naming the new place (issue 39: nothing a user
relies on breaks silently); every new place exists, and no old file is left behind to shadow the move."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

import taskrl
from taskrl.moved import MOVED_MODULES, MovedError

ROOT = Path(taskrl.__file__).parent


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_module_path_raises_an_error_naming_the_new_one(old: str, new: str) -> None:
    with pytest.raises(ImportError, match=f"{old} moved to {new}") as info:
        importlib.import_module(old)
    assert isinstance(info.value, MovedError)
    assert importlib.util.find_spec(new) is not None, f"{new} (the new place of {old}) does not exist"
    assert not ROOT.parent.joinpath(*old.split(".")).with_suffix(".py").exists(), f"{old} is still a file"


def test_the_old_from_import_of_the_trainer_names_the_new_path() -> None:
    with pytest.raises(ImportError, match=r"taskrl\.trainer moved to taskrl\.training\.trainer"):
        from taskrl.trainer import Trainer  # noqa: F401
    from taskrl.training.trainer import Trainer

    assert Trainer.__module__ == "taskrl.training.trainer"


def test_a_name_that_left_a_package_names_its_new_module() -> None:
    with pytest.raises(ImportError, match=r"taskrl\.training\.curriculum\.CurriculumSampler"):
        from taskrl.rewards import CurriculumSampler  # noqa: F401
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        import taskrl.rewards

        taskrl.rewards.no_such_name  # noqa: B018
