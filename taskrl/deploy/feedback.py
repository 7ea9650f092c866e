"""User feedback on served interactions and the reward map that turns it into per-interaction rewards.

``FeedbackIn`` is the ``POST /v1/feedback`` body (schema-validated: a bad body is a 422 naming the field).
``RewardMap`` maps each signal to a reward (Cursor's named signals: edits kept, dissatisfied follow-ups);
``RewardMap.reward(feedback)`` is the mean over an interaction's signals, None when it has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from taskrl.deploy.store import Feedback

FeedbackKind = Literal["accepted", "rejected", "edit_kept", "dissatisfied_followup", "rating"]
FEEDBACK_KINDS: tuple[str, ...] = ("accepted", "rejected", "edit_kept", "dissatisfied_followup", "rating")


class FeedbackIn(BaseModel):
    """One signal: ``value`` is the rating (1-5) for ``rating`` and the minutes the edit survived for ``edit_kept``."""

    model_config = {"extra": "forbid", "allow_inf_nan": False}

    interaction_id: str = Field(min_length=1, max_length=64)
    kind: FeedbackKind
    value: float | None = None

    @model_validator(mode="after")
    def _check_value(self) -> FeedbackIn:
        if self.kind == "rating" and (self.value is None or not 1 <= self.value <= 5):
            raise ValueError("value: a rating needs a value between 1 and 5")
        if self.kind == "edit_kept" and (self.value is None or self.value < 0):
            raise ValueError("value: edit_kept needs the minutes the edit was kept (>= 0)")
        return self


@dataclass
class RewardMap:
    """Reward of each feedback signal; an interaction's reward is the mean over its signals."""

    accepted: float = 1.0
    """The user accepted the answer (e.g. applied the suggested edit)."""
    rejected: float = -1.0
    """The user rejected it."""
    edit_kept: float = 1.0
    """The edit was still in place ``edit_kept_min_minutes`` later."""
    edit_kept_min_minutes: float = 10.0
    """An edit counts as kept only after this many minutes; earlier reports are ignored."""
    dissatisfied_followup: float = -0.5
    """The user's next message showed dissatisfaction ("that's wrong", a repeated request)."""
    rating_scale: float = 0.5
    """An explicit 1-5 rating r gives (r - 3) * rating_scale, so 1 -> -1 and 5 -> +1 by default."""

    def __post_init__(self) -> None:
        if self.edit_kept_min_minutes < 0:
            raise ValueError(f"RewardMap.edit_kept_min_minutes must be >= 0, got {self.edit_kept_min_minutes}")
        if self.rating_scale < 0:
            raise ValueError(f"RewardMap.rating_scale must be >= 0, got {self.rating_scale}")

    def signal_reward(self, feedback: Feedback) -> float | None:
        """One signal's reward; None when it does not count (an edit not kept long enough)."""
        if feedback.kind == "rating":
            return (float(feedback.value or 3.0) - 3.0) * self.rating_scale
        if feedback.kind == "edit_kept":
            return self.edit_kept if (feedback.value or 0.0) >= self.edit_kept_min_minutes else None
        if feedback.kind == "accepted":
            return float(self.accepted)
        if feedback.kind == "rejected":
            return float(self.rejected)
        if feedback.kind == "dissatisfied_followup":
            return float(self.dissatisfied_followup)
        raise ValueError(f"unknown feedback kind {feedback.kind!r}; expected one of {', '.join(FEEDBACK_KINDS)}")

    def reward(self, feedback: list[Feedback]) -> float | None:
        """Mean reward over the signals that count; None when none does (the interaction is not trained on)."""
        values = [v for v in (self.signal_reward(f) for f in feedback) if v is not None]
        return sum(values) / len(values) if values else None
