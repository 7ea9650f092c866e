"""How often a ladder arm's first turn (the lookups) ran into the per-turn token cap instead of ending itself.

Reads the greedy held-out trajectories a ``tool_use.py`` seed directory keeps (``ARM/trajectories/heldout-*``) and
counts, per arm and evaluation set, the episodes whose first sampled run of tokens (the ``loss_mask`` ones) is as
long as the cap and does not end with the end-of-turn token. No model is loaded; the numbers come from the saved
token ids.

    python experiments/turn_caps.py runs/ladder_g_test/seed_5 [more seed dirs ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

END_OF_TURN = 2
"""SmolLM2's ``<|im_end|>`` id: a turn that ends itself samples it last."""


def first_turn(segment: dict[str, Any]) -> list[int]:
    """The token ids of the first sampled run (the first assistant turn) of a trajectory segment."""
    ids, mask = segment["token_ids"], segment["loss_mask"]
    start = mask.index(1) if 1 in mask else len(mask)
    end = start
    while end < len(mask) and mask[end]:
        end += 1
    return ids[start:end]


def capped(path: Path, cap: int) -> dict[str, float]:
    """Episodes of one trajectory file, how many first turns hit ``cap`` without ending, and their success."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    turns = [first_turn(r["segments"][0]) for r in rows]
    hit = [len(t) >= cap and (not t or t[-1] != END_OF_TURN) for t in turns]
    success = [float(next(iter(r["rewards"].values())) or 0.0) >= 1.0 for r in rows]
    return {"episodes": len(rows), "capped": sum(hit), "success": sum(success),
            "success_when_capped": sum(s for s, h in zip(success, hit, strict=True) if h)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--caps", default="greedy=96,gen4=160,novel=160",
                    help="evaluation set = its per-turn token cap (the ladder's: 96, and 160 for --generalise)")
    args = ap.parse_args(argv)
    caps = {k: int(v) for k, v in (item.split("=") for item in args.caps.split(","))}
    print("| seed | arm | set | episodes | first turn capped | success | success when capped |")
    print("|---|---|---|---|---|---|---|")
    for seed_dir in args.seed_dirs:
        for arm_dir in sorted(p for p in seed_dir.iterdir() if (p / "trajectories").is_dir()):
            for name, cap in caps.items():
                path = arm_dir / "trajectories" / f"heldout-{name}-policy_000000.jsonl"
                if path.exists():
                    c = capped(path, cap)
                    print(f"| {seed_dir.name} | {arm_dir.name} | {name} | {c['episodes']} | {c['capped']} "
                          f"| {c['success']} | {c['success_when_capped']} |")


if __name__ == "__main__":
    main()
