"""Reward toolkit: formulas, composable weighted terms, anti-cheating terms, loop guard, presets.

``formulas`` holds the pure closed forms (F-beta, effort penalty, PARL terms, Context-1 penalties);
``compose`` the ``ComposedReward``/``MultiStageReward`` machinery; ``terms``/``cheating`` the terms;
``loops`` the ``LoopGuard`` env wrapper; ``presets`` the recipes' rewards;
``cli`` the ``taskrl rewards list|score`` commands (not imported here, so this package stays light).
"""

from taskrl.moved import moved_names
from taskrl.rewards.cheating import BusyWork, FinishCredit, Grounding, ParallelCredit, TrivialTests
from taskrl.rewards.compose import (
    ComposedReward,
    Gate,
    MultiStageReward,
    PenaltyClamp,
    RewardBreakdown,
    RewardClock,
    RewardTermError,
    Stage,
    WeightedTerm,
    reward_metrics,
)
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

__all__ = [
    "PRESETS", "AnswerMatch", "BusyWork", "ComposedReward",
    "EffortPenalty", "ExplorationBonus", "FinishCredit", "Gate", "Grounding", "InfoFlag", "LoopConfig",
    "LoopDetector", "LoopGuard", "LoopPenalty", "MultiStageReward", "OutputAgreement", "ParallelCredit",
    "PenaltyClamp", "RewardBreakdown", "RewardClock", "RewardTermError", "Stage", "SummaryUsefulness",
    "TestPassRate", "ToolCostPenalty", "TrivialTests", "ValidToolUse", "WeightedTerm", "composer", "context1",
    "effort_penalty", "f_beta", "f_beta_sets", "make_reward", "parl", "r_finish", "r_parallel", "seed_weighted",
    "reward_metrics",
]  # fmt: skip

__getattr__ = moved_names(__name__, dict.fromkeys(  # the curriculum is a task sampler: it moved beside EpochSampler
    ("CurriculumSampler", "CurriculumExhaustedError", "Phase"), "taskrl.training.curriculum"))
