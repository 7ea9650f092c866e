"""Reverse-text (issue 40 item 3): prime-rl's published result, reproduced on CPU with SmolLM2-135M.

prime-rl: an SFT warm-up, then RL on reversing text, about 0.05 -> 0.8 LCS-ratio reward in 20 steps (Qwen3-0.6B on
GPUs). Here: random lowercase strings (``reverse_text`` env: train/test disjoint by construction, prime-rl's reward),
a warm start of ``--warm-steps`` x ``--warm-tasks`` expert demonstrations, then from that same start, each for
``--minutes`` of training: ``sft_more`` (more expert SFT), ``rft`` (SFT on the policy's own samples: each prompt's best
of its ``--group-size`` samples when above its group's mean, GRPO's prompts and sample budget; a fixed threshold
such as 0.9 kept no sample of the warm start's in a pilot on val) and ``grpo``. Each arm is evaluated greedily on
``--eval-tasks`` held-out strings (mean reward, exact-reversal success with Wilson/exact intervals) and recorded as
a new JSON in experiments/runs/reverse_text/ (``study.py index`` tabulates them, the seed as the unit).

    python experiments/reverse_text.py --seeds 0 1 2 3 4 --split val --minutes 30 --design d1
    python experiments/study.py freeze reverse_text d1 --reason "..."   # after comparing designs on val
    python experiments/reverse_text.py --seeds 0 1 2 3 4 --split test --minutes 30 --design d1
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.ladder import LadderSpec, main  # noqa: E402

SPEC = LadderSpec(study="reverse_text", env="reverse_text", arms=("sft_more", "rft", "grpo"), warm_start=True,
                  primary="reward", eval_samples=1, eval_temperature=0.0, rft_min_reward=0.0, rft_keep="best",
                  max_new_tokens=48)  # fmt: skip


if __name__ == "__main__":
    main(SPEC, description=__doc__)
