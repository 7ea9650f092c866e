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


MOVED_NAMES = [
    ("taskrl.rewards", "CurriculumSampler", "taskrl.training.curriculum"),
    ("taskrl.rewards.formulas", "context1_clamp", "taskrl.scoring"),
    ("taskrl.datagen.multihop", "read_tasks", "taskrl.types"),
    ("taskrl.datagen.multihop", "write_tasks", "taskrl.types"),
    ("taskrl.datagen.multihop", "multihop_command", "taskrl.commands.datagen"),
    ("taskrl.datagen.widesearch", "widesearch_command", "taskrl.commands.datagen"),
    ("taskrl.datagen.widesearch", "ensure_default_swarm_tasks", "taskrl.datagen.defaults"),
    ("taskrl.datagen.codebugs", "codebugs_command", "taskrl.commands.datagen"),
    ("taskrl.envs.search.build", "ensure_default_corpus", "taskrl.datagen.defaults"),
    ("taskrl.envs.search", "make_search_env", "taskrl.recipes"),
    ("taskrl.envs.swarm", "make_swarm_env", "taskrl.recipes"),
    ("taskrl.eval", "eval_command", "taskrl.commands.eval"),
]


@pytest.mark.parametrize(("module", "name", "new"), MOVED_NAMES)
def test_a_moved_name_raises_an_error_naming_where_it_lives_now(module: str, name: str, new: str) -> None:
    with pytest.raises(MovedError, match=f"{module}.{name} moved to {new}.{name}"):
        getattr(importlib.import_module(module), name)
    assert callable(getattr(importlib.import_module(new), name))


def test_a_name_that_left_a_package_names_its_new_module() -> None:
    with pytest.raises(ImportError, match=r"taskrl\.training\.curriculum\.CurriculumSampler"):
        from taskrl.rewards import CurriculumSampler  # noqa: F401
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        import taskrl.rewards

        taskrl.rewards.no_such_name  # noqa: B018
