"""The experimental standard as code (issue 40): run records that are never overwritten, the val/test
discipline, the held-out size check and the index of every run and design.

    study = Study("reverse_text")                       # experiments/runs/reverse_text/
    study.check_held_out(tasks)                         # >= 64 distinct held-out tasks, else StandardError
    study.record(design="d1", arm="grpo", seed=0, split="val", outcome={"reward": 0.41}, primary="reward")
    study.freeze("d1", reason="best val reward of 3 designs")   # designs are chosen on val ...
    study.claim_test("d1", "grpo", 0)                   # ... and test is used once per reported number
    python experiments/study.py index           # writes experiments/runs/INDEX.md
    python experiments/study.py plot prices prices3 test --out docs/learning_tool_use_ladder.png  # seed-level figure
    python experiments/study.py plot prices prices3g test --metric gen4_greedy_success --out gen4.png
    python experiments/study.py compare prices test prices3g:grpo prices3c:grpo --metric "" gen4_greedy_success
    python experiments/study.py release reverse_text cpu128 grpo 2 --reason "killed by the OOM killer at step 6"

Each run is one JSON file, created exclusively under a new unique name (time, design, arm, seed, split and a
random suffix); a second test evaluation of the same (design, arm, seed) is refused, not overwritten. A test run
that ended before its evaluation (killed, out of memory) may give its claim back with a reason, never once its
record exists; the index lists every release and every claim still without a record.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from experiments.stats import over_seeds, paired_seeds, verdict  # noqa: E402

RUNS_DIR = ROOT / "experiments" / "runs"
SPLITS = ("val", "test")
MIN_HELD_OUT = 64
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class StandardError(ValueError):
    """A study broke the experimental standard (test reused, design not chosen on val, too few tasks ...)."""


def _name(kind: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise StandardError(f"{kind} must be 1-64 characters of letters, digits, '_', '.', '-', got {value!r}")
    return value


def _seed(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StandardError(f"seed must be an integer >= 0, got {value!r}")
    return value


def machine_info(engine: str = "") -> dict[str, Any]:
    """What a run ran on: CPU model, cores, load average at the time, torch threads, whether bf16 is accelerated
    (what ``dtype = "auto"`` resolves to), the rollout engine, commit."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        commit = ""
    info: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "loadavg": list(os.getloadavg()),
                            "python": platform.python_version(), "engine": engine, "commit": commit}  # fmt: skip
    try:
        import torch

        from taskrl.policies.precision import bf16_accelerated

        info.update(torch=torch.__version__, threads=torch.get_num_threads(),
                    cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
                    bf16=bf16_accelerated(torch.device("cuda" if torch.cuda.is_available() else "cpu"))[1])  # fmt: skip
    except ImportError:
        pass
    return info


class Study:
    """One study's directory of run records, frozen designs and test claims."""

    def __init__(self, name: str, runs_dir: str | Path = RUNS_DIR) -> None:
        self.name = _name("study", name)
        self.dir = Path(runs_dir) / name
        self.dir.mkdir(parents=True, exist_ok=True)

    # -- held-out tasks ----------------------------------------------------------------------------
    @staticmethod
    def check_held_out(tasks: Sequence[Any], minimum: int = MIN_HELD_OUT) -> int:
        """The number of distinct held-out tasks (by prompt); StandardError below ``minimum``."""
        distinct = len({getattr(t, "prompt", t) for t in tasks})
        if distinct < minimum:
            raise StandardError(f"held-out evaluation has {distinct} distinct tasks ({len(tasks)} drawn); the "
                                f"standard needs >= {minimum}: raise the evaluation's task count")  # fmt: skip
        return distinct

    # -- records -----------------------------------------------------------------------------------
    def record(self, *, design: str, arm: str, seed: int, split: str, outcome: dict[str, Any], primary: str,
               config: dict[str, Any] | None = None, budget: dict[str, Any] | None = None, engine: str = "",
               extra: dict[str, Any] | None = None) -> Path:  # fmt: skip
        """Write one run's JSON under a new unique name (exclusive create: nothing is ever overwritten).
        ``outcome[primary]`` is the number the index reports (a float, or a dict with ``value``)."""
        _name("design", design), _name("arm", arm), _seed(seed)
        if split not in SPLITS + ("train",):
            raise StandardError(f"split must be one of val, test, train, got {split!r}")
        if primary not in outcome:
            raise StandardError(f"outcome has no primary metric {primary!r} (keys: {', '.join(outcome)})")
        if split == "test" and not self._claimed(design, arm, seed):
            raise StandardError(f"test run of {design}/{arm}/seed {seed} without a claim: call claim_test first")
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = self.dir / f"{stamp}-{design}-{arm}-s{seed}-{split}-{uuid.uuid4().hex[:8]}.json"
        data = {"study": self.name, "design": design, "arm": arm, "seed": seed, "split": split, "primary": primary,
                "outcome": outcome, "config": config or {}, "budget": budget or {}, "argv": sys.argv,
                "created_utc": stamp, "machine": machine_info(engine), **(extra or {})}  # fmt: skip
        with path.open("x", encoding="utf-8") as f:
            json.dump(data, f, indent=1, default=str)
        return path

    def runs(self) -> list[dict[str, Any]]:
        """Every run record of this study, oldest first, each with its ``file`` name."""
        return [{**json.loads(p.read_text()), "file": p.name} for p in sorted(self.dir.glob("*.json"))]

    # -- val / test discipline ---------------------------------------------------------------------
    def freeze(self, design: str, reason: str) -> Path:
        """Mark ``design`` as chosen (on val): it needs a val run, and a frozen design is never re-chosen."""
        _name("design", design)
        if not any(r["design"] == design and r["split"] == "val" for r in self.runs()):
            raise StandardError(f"design {design!r} has no val run: designs are chosen on val before test is used")
        (self.dir / "designs").mkdir(exist_ok=True)
        path = self.dir / "designs" / f"{design}.json"
        try:
            with path.open("x", encoding="utf-8") as f:
                json.dump({"design": design, "reason": reason, "frozen_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                         time.gmtime())}, f)
        except FileExistsError:
            raise StandardError(f"design {design!r} is already frozen ({path})") from None
        return path

    def frozen(self, design: str) -> bool:
        return (self.dir / "designs" / f"{_name('design', design)}.json").exists()

    def _claim_path(self, design: str, arm: str, seed: int) -> Path:
        return self.dir / "test_claims" / f"{design}__{arm}__s{seed}"

    def _claimed(self, design: str, arm: str, seed: int) -> bool:
        return self._claim_path(design, arm, seed).exists()

    def claim_test(self, design: str, arm: str, seed: int) -> Path:
        """Reserve the one test evaluation of (design, arm, seed); refused if the design was not frozen on val or
        the test was already used for it. The claim stays on disk: a crashed test run is not silently redone."""
        _name("design", design), _name("arm", arm), _seed(seed)
        if not self.frozen(design):
            raise StandardError(f"design {design!r} is not frozen: pick it on val and Study.freeze it before test")
        (self.dir / "test_claims").mkdir(exist_ok=True)
        path = self._claim_path(design, arm, seed)
        try:
            with path.open("x", encoding="utf-8") as f:
                f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        except FileExistsError:
            raise StandardError(f"test was already used for {design}/{arm}/seed {seed} ({path}); a reported number "
                                "uses test once: report that run, or freeze a new design") from None  # fmt: skip
        return path

    def release_claim(self, design: str, arm: str, seed: int, reason: str) -> Path:
        """Give back the test claim of a run that ended before its evaluation (killed, out of memory), so that it
        can run again; refused once a test record of (design, arm, seed) exists (that run used test). The release
        is appended, with its reason and the claim's time, to ``test_claims/released.jsonl``, which the index
        lists: a rerun is never silent."""
        _name("design", design), _name("arm", arm), _seed(seed)
        if not reason.strip():
            raise StandardError("a released test claim needs a reason (what stopped the run before evaluation)")
        path = self._claim_path(design, arm, seed)
        if not path.exists():
            raise StandardError(f"no test claim of {design}/{arm}/seed {seed} to release ({path})")
        if any((r["design"], r["arm"], int(r["seed"]), r["split"]) == (design, arm, seed, "test")
               for r in self.runs()):  # fmt: skip
            raise StandardError(f"{design}/{arm}/seed {seed} has a test record: that run used test, report it")
        log = self.dir / "test_claims" / "released.jsonl"
        entry = {"design": design, "arm": arm, "seed": seed, "claimed_utc": path.read_text().strip(),
                 "released_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reason": reason.strip()}
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        path.unlink()
        return log

    def released_claims(self) -> list[dict[str, Any]]:
        """Every released test claim (``release_claim``), oldest first."""
        log = self.dir / "test_claims" / "released.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []

    def open_claims(self) -> list[str]:
        """Test claims with no test record yet: runs in progress, or ones that ended before their evaluation."""
        recorded = {self._claim_path(r["design"], r["arm"], int(r["seed"])).name
                    for r in self.runs() if r["split"] == "test"}  # fmt: skip
        return sorted(p.name for p in (self.dir / "test_claims").glob("*__*__s*") if p.name not in recorded)


def _value(outcome: Any) -> float | None:
    value = outcome.get("value") if isinstance(outcome, dict) else outcome
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _number(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _cell(outcome: Any) -> str:
    value = _value(outcome)
    if value is None:
        return "-"
    interval = outcome.get("wilson") or outcome.get("ci") if isinstance(outcome, dict) else None
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else f"{value:.3f}"


PROPORTIONS = ("greedy_success", "success", "pass@1", "pass@16")
"""Primary outcomes that are proportions: their seed-level intervals are clipped to ``PROPORTION``."""
PROPORTION = (0.0, 1.0)


def is_proportion(metric: str) -> bool:
    """Whether an outcome is a proportion (its seed-level intervals are clipped to ``PROPORTION``)."""
    return metric in PROPORTIONS or metric.endswith("_success")


def seed_table(runs: Sequence[dict[str, Any]],
               metric: str = "") -> dict[tuple[str, str], tuple[dict[str, dict[int, float]], str, str]]:  # fmt: skip
    """Per (design, split) of ``runs``: ``{arm: {seed: value}}`` of each record's primary outcome, or of
    ``metric`` where a record has it (a later run of a seed wins), the outcome's name and the baseline arm (""
    when no run names one). The index and ``study_plots`` read this."""
    table: dict[tuple[str, str], tuple[dict[str, dict[int, float]], str, str]] = {}
    for r in runs:
        name = metric or r["primary"]
        value = _value(r["outcome"].get(name))
        if value is None:
            continue
        arms, _, baseline = table.get((r["design"], r["split"]), ({}, "", ""))
        arms.setdefault(r["arm"], {})[int(r["seed"])] = value
        table[(r["design"], r["split"])] = (arms, name, r.get("baseline_arm") or baseline)
    return table


def _seed_rows(arms: dict[str, dict[int, float]], metric: str, base: str) -> list[str]:
    """Markdown rows: each arm's mean and t CI over seeds, and its paired per-seed verdict against ``base``."""
    bounds = PROPORTION if is_proportion(metric) else None
    rows = []
    for arm, seeds in arms.items():
        summary = over_seeds(list(seeds.values()), bounds=bounds)
        ci = f"[{summary['t'][0]:.3f}, {summary['t'][1]:.3f}]" if summary["t"] else "none (1 seed)"
        versus = verdict(paired_seeds(arms[base], seeds, bounds=bounds), base, arm) if (
            base and arm != base and base in arms) else ""  # fmt: skip
        rows.append(f"| {arm} | {summary['n']} | {summary['mean']:.3f} | {ci} | {versus} |")
    return rows


def index_markdown(runs_dir: str | Path = RUNS_DIR) -> str:
    """Markdown listing every study's designs (frozen or not), every run with its outcome, and per design and
    split the seed-level mean and CI of each arm with paired per-seed deltas against the baseline arm."""
    lines = ["# Learning runs: every design and run", "",
             "Generated by `python experiments/study.py index`; the seed is the unit of every interval.", ""]
    for study_dir in sorted(p for p in Path(runs_dir).iterdir() if p.is_dir()):
        study = Study(study_dir.name, runs_dir)
        runs = study.runs()
        lines += [f"## {study.name}", ""]
        designs = sorted({r["design"] for r in runs})
        frozen = {p.stem: json.loads(p.read_text()) for p in sorted((study.dir / "designs").glob("*.json"))}
        lines += ["| design | frozen on val | reason |", "|---|---|---|"]
        lines += [f"| {d} | {'yes' if d in frozen else 'no'} | {frozen.get(d, {}).get('reason', '')} |"
                  for d in designs]  # fmt: skip
        lines += ["", "| file | design | arm | seed | split | primary | outcome | steps | episodes | train s | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in runs:
            outcome, budget = r["outcome"].get(r["primary"]), r.get("budget") or {}
            spent = " | ".join(_number(budget.get(key), 0) for key in ("steps", "episodes", "train_s"))
            load = ((r.get("machine") or {}).get("loadavg") or [None])[0]
            lines.append(f"| {r['file']} | {r['design']} | {r['arm']} | {r['seed']} | {r['split']} | {r['primary']} "
                         f"| {_cell(outcome)} | {spent} | {_number(load, 1)} |")  # fmt: skip
        released, open_claims = study.released_claims(), study.open_claims()
        if released:
            lines += ["", "Test claims released (runs that ended before their evaluation, then run again):", "",
                      "| design | arm | seed | claimed | released | reason |", "|---|---|---|---|---|---|"]
            lines += [f"| {c['design']} | {c['arm']} | {c['seed']} | {c['claimed_utc']} | {c['released_utc']} "
                      f"| {c['reason']} |" for c in released]  # fmt: skip
        if open_claims:
            lines += ["", f"Test claims with no record (running, or ended before evaluation): {', '.join(open_claims)}"]
        header = ["| arm | seeds | mean | 95% t CI | vs baseline |", "|---|---|---|---|---|"]
        for (design, split), (arms, primary, base) in sorted(seed_table(runs).items()):
            lines += ["", f"### {design} on {split}", "", *header, *_seed_rows(arms, primary, base)]
            secondary = sorted({m for r in runs if (r["design"], r["split"]) == (design, split)
                                for m in r.get("secondary") or ()})  # fmt: skip
            for metric in secondary:
                found = seed_table(runs, metric).get((design, split))
                if found and found[1] == metric:
                    lines += ["", f"### {design} on {split}: {metric} (secondary)", "", *header,
                              *_seed_rows(found[0], metric, base)]  # fmt: skip
        lines.append("")
    return "\n".join(lines) + "\n"


def compare_markdown(runs: Sequence[dict[str, Any]], split: str, a: str, b: str,
                     metrics: Sequence[str] = ("",)) -> str:  # fmt: skip
    """Markdown of ``b`` against ``a`` (each ``design:arm``) on ``split``, paired by seed, per outcome in
    ``metrics`` ("" = the primary): each seed's values and delta, and the seed-level verdict. Across designs this
    is an ablation (e.g. one flag changed, the same seeds and warm starts); a seed only one side ran is listed."""
    sides = []
    for side in (a, b):
        design, sep, arm = side.partition(":")
        if not sep or not design or not arm:
            raise ValueError(f"compare: name each side as design:arm (e.g. prices3g:grpo), got {side!r}")
        sides.append((design, arm))
    lines = [f"# {b} vs {a} on {split}", ""]
    for metric in metrics:
        values, names = [], set()
        for design, arm in sides:
            arms, name, _ = seed_table(runs, metric).get((design, split), ({}, metric, ""))
            values.append(arms.get(arm, {}) if not metric or name == metric else {})
            names.add(name)
        label = " / ".join(sorted(n for n in names if n)) or "primary"
        if not values[0] or not values[1]:
            missing = [s for s, v in zip((a, b), values, strict=True) if not v]
            lines += [f"## {label}", "", f"no {split} runs of {', '.join(missing)} with this outcome", ""]
            continue
        if len(names) > 1:
            raise ValueError(f"compare: {a} and {b} have different primary outcomes ({label}); name one with --metric")
        bounds = PROPORTION if is_proportion(label) else None
        paired = paired_seeds(values[0], values[1], bounds=bounds)
        lines += [f"## {label}", "", f"| seed | {a} | {b} | delta |", "|---|---|---|---|"]
        for seed in sorted(set(values[0]) | set(values[1])):
            x, y = values[0].get(seed), values[1].get(seed)
            delta = f"{y - x:+.3f}" if x is not None and y is not None else "unpaired"
            lines.append(f"| {seed} | {_number(x, 3)} | {_number(y, 3)} | {delta} |")
        lines += ["", verdict(paired, a, b), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    index = sub.add_parser("index", help="write the markdown index of every run and design")
    index.add_argument("--runs-dir", default=str(RUNS_DIR))
    index.add_argument("--out", default=None, help="default: RUNS_DIR/INDEX.md")
    freeze = sub.add_parser("freeze", help="mark a design chosen on val (before any test run)")
    freeze.add_argument("study")
    freeze.add_argument("design")
    freeze.add_argument("--reason", required=True)
    freeze.add_argument("--runs-dir", default=str(RUNS_DIR))
    plot = sub.add_parser("plot", help="draw a design's seed-level figure on one split (study_plots.py)")
    plot.add_argument("study")
    plot.add_argument("design")
    plot.add_argument("split", choices=("val", "test"))
    plot.add_argument("--out", required=True, help="PNG path")
    plot.add_argument("--title", default="")
    plot.add_argument("--metric", default="", help="an outcome other than the primary (e.g. gen4_greedy_success)")
    plot.add_argument("--runs-dir", default=str(RUNS_DIR))
    release = sub.add_parser("release", help="give back the test claim of a run that ended before evaluation")
    release.add_argument("study")
    release.add_argument("design")
    release.add_argument("arm")
    release.add_argument("seed", type=int)
    release.add_argument("--reason", required=True, help="what stopped the run before its evaluation")
    release.add_argument("--runs-dir", default=str(RUNS_DIR))
    compare = sub.add_parser("compare", help="one design:arm against another, paired by seed (an ablation)")
    compare.add_argument("study")
    compare.add_argument("split", choices=("val", "test"))
    compare.add_argument("a", help="the reference, design:arm (e.g. prices3g:grpo)")
    compare.add_argument("b", help="the other, design:arm (e.g. prices3f:grpo)")
    compare.add_argument("--metric", nargs="*", default=[""], help="outcomes (default: the primary)")
    compare.add_argument("--runs-dir", default=str(RUNS_DIR))
    args = parser.parse_args(argv)
    runs_dir = Path(args.runs_dir)
    if args.command == "index":
        out = Path(args.out) if args.out else runs_dir / "INDEX.md"
        out.write_text(index_markdown(runs_dir) if runs_dir.exists() else "# Learning runs\n\nNo runs yet.\n")
        print(out)
    elif args.command == "plot":
        from experiments.study_plots import plot_seeds

        print(plot_seeds(Study(args.study, runs_dir).runs(), args.design, args.split, Path(args.out), title=args.title,
                         metric=args.metric))  # fmt: skip
    elif args.command == "release":
        print(Study(args.study, runs_dir).release_claim(args.design, args.arm, args.seed, args.reason))
    elif args.command == "compare":
        print(compare_markdown(Study(args.study, runs_dir).runs(), args.split, args.a, args.b, args.metric or [""]))
    else:
        print(Study(args.study, runs_dir).freeze(args.design, args.reason))


if __name__ == "__main__":
    main()
