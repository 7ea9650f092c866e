"""Reward toolkit: formulas, composable weighted terms, anti-cheating terms, loop guard, presets.

``formulas`` holds the pure closed forms (F-beta, effort penalty, PARL terms, Context-1 penalties);
``compose`` stage-wise credit (``multi_stage``) and the errors naming what replaced removed names (the reward
itself is a ``taskrl.scoring.Rubric``); ``terms``/``cheating`` the terms;
``loops`` the ``LoopGuard`` env wrapper; ``presets`` the recipes' rewards;
``cli`` the ``taskrl rewards list|score`` commands (not imported here, so this package stays light).
"""

from typing import Any

from taskrl.moved import moved_names
from taskrl.rewards.cheating import BusyWork, FinishCredit, Grounding, ParallelCredit, TrivialTests
from taskrl.rewards.compose import REMOVED, Stage, multi_stage, removed_name_error
from taskrl.rewards.formulas import effort_penalty, f_beta, f_beta_sets, r_finish, r_parallel
from taskrl.rewards.loops import LoopConfig, LoopDetector, LoopGuard, LoopPenalty
from taskrl.rewards.presets import PRESETS, composer, context1, make_reward, parl, seed_weighted
from taskrl.rewards.terms import (
    AnswerMatch,
    EffortPenalty,
    ExplorationBonus,
    InfoFlag,
    OutputAgreement,
    SummaryUsefulness,
    TestPassRate,
    ToolCostPenalty,
    ValidToolUse,
)
from taskrl.scoring import RewardTermError, Rubric

__all__ = [
    "PRESETS", "AnswerMatch", "BusyWork", "EffortPenalty",
    "ExplorationBonus", "FinishCredit", "Grounding", "InfoFlag", "LoopConfig", "LoopDetector", "LoopGuard",
    "LoopPenalty", "OutputAgreement", "ParallelCredit", "RewardTermError", "Rubric", "Stage",
    "SummaryUsefulness", "TestPassRate", "ToolCostPenalty", "TrivialTests", "ValidToolUse", "composer", "context1",
    "effort_penalty", "f_beta", "f_beta_sets", "make_reward", "multi_stage", "parl", "r_finish", "r_parallel",
    "seed_weighted",
]  # fmt: skip

_moved = moved_names(__name__, dict.fromkeys(  # the curriculum is a task sampler: it moved beside EpochSampler
    ("CurriculumSampler", "CurriculumExhaustedError", "Phase"), "taskrl.training.curriculum"))


def __getattr__(name: str) -> Any:
    """Removed reward names raise an error naming their replacement; moved names one naming their new module."""
    if name in REMOVED:
        raise removed_name_error("taskrl.rewards", name)
    return _moved(name)
