"""Reward and curriculum toolkit: formulas, composable weighted terms, anti-cheating terms, loop guard, presets.

``formulas`` holds the pure closed forms (F-beta, effort penalty, PARL terms, Context-1 penalties);
``compose`` stage-wise credit (``multi_stage``) and the errors naming what replaced removed names (the reward
itself is a ``taskrl.scoring.Rubric``); ``terms``/``cheating`` the terms;
``loops`` the ``LoopGuard`` env wrapper; ``curriculum`` the task sampler; ``presets`` the recipes' rewards;
``cli`` the ``taskrl rewards list|score`` commands (not imported here, so this package stays light).
"""

from typing import Any

from taskrl.rewards.cheating import BusyWork, FinishCredit, Grounding, ParallelCredit, TrivialTests
from taskrl.rewards.compose import REMOVED, Stage, multi_stage, removed_name_error
from taskrl.rewards.curriculum import CurriculumExhaustedError, CurriculumSampler, Phase
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
    "PRESETS", "AnswerMatch", "BusyWork", "CurriculumExhaustedError", "CurriculumSampler", "EffortPenalty",
    "ExplorationBonus", "FinishCredit", "Grounding", "InfoFlag", "LoopConfig", "LoopDetector", "LoopGuard",
    "LoopPenalty", "OutputAgreement", "ParallelCredit", "Phase", "RewardTermError", "Rubric", "Stage",
    "SummaryUsefulness", "TestPassRate", "ToolCostPenalty", "TrivialTests", "ValidToolUse", "composer", "context1",
    "effort_penalty", "f_beta", "f_beta_sets", "make_reward", "multi_stage", "parl", "r_finish", "r_parallel",
    "seed_weighted",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in REMOVED:
        raise removed_name_error("taskrl.rewards", name)
    raise AttributeError(f"module 'taskrl.rewards' has no attribute {name!r}")
