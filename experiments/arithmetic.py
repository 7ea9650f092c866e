"""Arithmetic (issue 40 item 4 at a size SmolLM2-135M can start on): a task with no demonstrations at all.

``What is a op b?`` for a, b in 1..20 and op in + - * (``arithmetic`` env: the reply's last integer must be the
exact result; held-out (unordered pair, operator) items disjoint from training). Countdown, the issue's example,
gives the 135M model no reward at all (docs/experiments/countdown.md); here its T=1 samples solve a few percent,
enough for a verifier to teach. No expert exists, so there is no warm start: ``start`` is the base model, then from
it, each for ``--max-steps`` steps (``--minutes`` caps the wall time), ``rft`` (SFT on the policy's own correct
samples, GRPO's prompts and sample budget) and ``grpo``. Each arm is evaluated on ``--eval-tasks`` held-out tasks
with 16 samples at T=1: pass@1 (the primary outcome) and pass@16.

    python experiments/arithmetic.py --seeds 0 --start-seeds 0 --split val --design d1 ...
    python experiments/study.py freeze arithmetic d1 --reason "..."
    python experiments/arithmetic.py --seeds 0 1 2 3 4 --split test --design d1 ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.ladder import LadderSpec, main  # noqa: E402

SPEC = LadderSpec(study="arithmetic", env="arithmetic", arms=("rft", "grpo"), warm_start=False, primary="pass@1",
                  eval_samples=16, eval_temperature=1.0, pass_ks=(1, 16), rft_min_reward=1.0,
                  max_new_tokens=32)  # fmt: skip


if __name__ == "__main__":
    main(SPEC, description=__doc__)
