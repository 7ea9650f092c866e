"""Countdown (issue 40 item 4): a task with no demonstrations at all, where only the verifier can teach.

Three numbers and a target (``countdown`` env: exact ast checker, each number at most once, held-out number sets
disjoint from training). No expert exists, so there is no warm start: ``start`` is the base model, then from it,
each for ``--minutes`` of training, ``rft`` (SFT on the policy's own verified solutions, GRPO's prompts and sample
budget) and ``grpo``. Each arm is evaluated on ``--eval-tasks`` held-out tasks with 16 samples at T=1: pass@1 (the
primary outcome) and pass@16, beside the chance rates of a uniform random expression (computed by enumeration).

    python experiments/countdown.py --seeds 0 1 2 3 4 --split val --minutes 30 --design d1
    python experiments/study.py freeze countdown d1 --reason "..."
    python experiments/countdown.py --seeds 0 1 2 3 4 --split test --minutes 30 --design d1
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.ladder import LadderSpec, main  # noqa: E402

SPEC = LadderSpec(study="countdown", env="countdown", arms=("rft", "grpo"), warm_start=False, primary="pass@1",
                  eval_samples=16, eval_temperature=1.0, pass_ks=(1, 16), rft_min_reward=1.0,
                  max_new_tokens=128)  # fmt: skip


if __name__ == "__main__":
    main(SPEC, description=__doc__)
