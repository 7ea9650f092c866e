"""The experimental standard (issue 40): golden intervals (honest at 0 and 1), seed-level summaries and paired
deltas, run records never overwritten, the val/test discipline, the 64-task check and the index."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.stats import (
    betainc,
    clopper_pearson,
    over_seeds,
    paired_seeds,
    proportion,
    t_quantile,
    verdict,
    wilson,
)  # fmt: skip
from experiments.study import StandardError, Study, index_markdown, main


def test_wilson_golden_values_are_honest_at_zero_and_one() -> None:
    assert wilson(0, 24) == pytest.approx((0.0, 0.137976), abs=1e-6)  # not [0, 0]
    assert wilson(24, 24) == pytest.approx((0.862024, 1.0), abs=1e-6)  # not [1, 1]
    assert wilson(12, 24) == pytest.approx((0.314274, 0.685726), abs=1e-6)
    assert wilson(1, 10, confidence=0.9)[1] < wilson(1, 10)[1]


def test_clopper_pearson_golden_values() -> None:
    assert clopper_pearson(0, 24) == pytest.approx((0.0, 1 - 0.025 ** (1 / 24)), abs=1e-9)  # closed form at 0
    assert clopper_pearson(24, 24) == pytest.approx((0.025 ** (1 / 24), 1.0), abs=1e-9)
    assert clopper_pearson(7, 64) == pytest.approx((0.045121, 0.212457), abs=1e-6)  # scipy.stats.beta.ppf
    exact, score = clopper_pearson(7, 64), wilson(7, 64)
    assert exact[1] - exact[0] > score[1] - score[0]  # exact is the conservative one
    record = proportion(0, 64)
    assert record["value"] == 0.0 and record["wilson"][1] > 0.05 and record["exact"][1] > 0.05


def test_quantiles_and_incomplete_beta_golden_values() -> None:
    assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
    assert t_quantile(0.975, 1) == pytest.approx(12.706205, abs=1e-5)
    assert t_quantile(0.025, 9) == pytest.approx(-2.262157, abs=1e-6)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 - sum_{k<2} C(4,k) .4^k .6^(4-k)
    for bad in ((25, 24), (-1, 5), (1.5, 4), (0, 0)):
        with pytest.raises(ValueError, match="successes"):
            wilson(*bad)  # type: ignore[arg-type]


def test_seed_level_mean_and_intervals() -> None:
    out = over_seeds([0.6, 0.7, 0.9, 0.5, 0.8])
    assert out["mean"] == pytest.approx(0.7) and out["sd"] == pytest.approx(math.sqrt(0.025))
    half = 2.776445 * math.sqrt(0.025) / math.sqrt(5)
    assert out["t"] == pytest.approx([0.7 - half, 0.7 + half], abs=1e-6)
    assert out["bootstrap"][0] < 0.7 < out["bootstrap"][1]
    assert over_seeds([0.4])["t"] is None  # one seed: no interval, never a zero-width one
    with pytest.raises(ValueError, match="NaN"):
        over_seeds([0.1, float("nan")])


def test_intervals_of_a_proportion_stay_within_its_range() -> None:
    """The tool-use ladder's GRPO arm (0.95, 1.00, 0.89 over 3 seeds) had a t interval up to 1.08 unclipped."""
    values = [0.953125, 1.0, 0.890625]
    assert over_seeds(values)["t"][1] > 1.0
    low, high = over_seeds(values, bounds=(0.0, 1.0))["t"]
    assert high == 1.0 and low == pytest.approx(over_seeds(values)["t"][0])
    a, b = {0: 0.0, 1: 1.0, 2: 0.0}, {0: 1.0, 1: 0.0, 2: 1.0}
    assert paired_seeds(a, b)["t"][0] < -1.0  # unclipped, a delta of two proportions claims below -1
    low, high = paired_seeds(a, b, bounds=(0.0, 1.0))["t"]
    assert low >= -1.0 and high <= 1.0


def test_paired_seed_deltas_and_the_verdict() -> None:
    a, b = {0: 0.5, 1: 0.6, 2: 0.4, 3: 0.5, 4: 0.6}, {0: 0.7, 1: 0.7, 2: 0.6, 3: 0.6, 4: 0.8, 5: 0.9}
    out = paired_seeds(a, b)
    assert out["n"] == 5 and out["unpaired"] == ["5"] and (out["wins"], out["ties"], out["losses"]) == (5, 0, 0)
    assert out["deltas"]["0"] == pytest.approx(0.2) and out["t"][0] > 0
    assert verdict(out, "rft", "grpo").startswith("grpo beats rft at the seed level")
    mixed = paired_seeds({0: 0.5, 1: 0.5}, {0: 0.6, 1: 0.4})
    assert "not shown" in verdict(mixed, "rft", "grpo")
    with pytest.raises(ValueError, match="share no seed"):
        paired_seeds({0: 1.0}, {1: 1.0})


def test_records_are_never_overwritten_and_test_is_used_once(tmp_path: Path) -> None:
    study = Study("toy", tmp_path)
    first = study.record(design="d1", arm="grpo", seed=0, split="val", outcome={"reward": 0.5}, primary="reward")
    second = study.record(design="d1", arm="grpo", seed=0, split="val", outcome={"reward": 0.6}, primary="reward")
    assert first != second and json.loads(first.read_text())["outcome"]["reward"] == 0.5
    assert {"cpu", "loadavg", "engine", "commit"} <= set(json.loads(first.read_text())["machine"])
    with pytest.raises(StandardError, match="without a claim"):
        study.record(design="d1", arm="grpo", seed=0, split="test", outcome={"reward": 0.7}, primary="reward")
    with pytest.raises(StandardError, match="not frozen"):
        study.claim_test("d1", "grpo", 0)
    with pytest.raises(StandardError, match="has no val run"):
        study.freeze("d2", reason="never tried on val")
    study.freeze("d1", reason="best on val")
    with pytest.raises(StandardError, match="already frozen"):
        study.freeze("d1", reason="again")
    study.claim_test("d1", "grpo", 0)
    study.record(design="d1", arm="grpo", seed=0, split="test", outcome={"reward": 0.7}, primary="reward")
    with pytest.raises(StandardError, match="test was already used"):
        study.claim_test("d1", "grpo", 0)
    with pytest.raises(StandardError, match="design must be"):
        study.record(design="../x", arm="grpo", seed=0, split="val", outcome={"r": 1}, primary="r")
    with pytest.raises(StandardError, match="no primary metric"):
        study.record(design="d1", arm="grpo", seed=0, split="val", outcome={"r": 1}, primary="reward")


def test_a_run_that_ended_before_evaluation_gives_its_claim_back_on_the_record(tmp_path: Path) -> None:
    study = Study("toy", tmp_path)
    study.record(design="d1", arm="grpo", seed=0, split="val", outcome={"reward": 0.5}, primary="reward")
    study.freeze("d1", reason="the only design")
    for seed in (1, 2):
        study.claim_test("d1", "grpo", seed)
    study.record(design="d1", arm="grpo", seed=2, split="test", outcome={"reward": 0.7}, primary="reward")
    assert study.open_claims() == ["d1__grpo__s1"]  # seed 1 was killed before its evaluation
    assert "no record (running, or ended before evaluation): d1__grpo__s1" in index_markdown(tmp_path)
    with pytest.raises(StandardError, match="has a test record"):  # seed 2 used test: it stays used
        study.release_claim("d1", "grpo", 2, reason="would like another try")
    with pytest.raises(StandardError, match="needs a reason"):
        study.release_claim("d1", "grpo", 1, reason=" ")
    with pytest.raises(StandardError, match="no test claim"):
        study.release_claim("d1", "rft", 1, reason="never claimed")
    main(["release", "toy", "d1", "grpo", "1", "--reason", "killed by the OOM killer at step 6", "--runs-dir",
          str(tmp_path)])  # fmt: skip
    study.claim_test("d1", "grpo", 1)  # it may run again, and the release is on the record
    (released,) = study.released_claims()
    assert released["seed"] == 1 and released["reason"] == "killed by the OOM killer at step 6"
    text = index_markdown(tmp_path)
    assert "Test claims released" in text and "| d1 | grpo | 1 |" in text and "killed by the OOM killer" in text


def test_held_out_needs_64_distinct_tasks() -> None:
    tasks = [SimpleNamespace(prompt=f"p{i % 40}") for i in range(80)]
    with pytest.raises(StandardError, match="40 distinct tasks \\(80 drawn\\)"):
        Study.check_held_out(tasks)
    assert Study.check_held_out([SimpleNamespace(prompt=f"p{i}") for i in range(64)]) == 64


def test_the_index_lists_every_design_and_run_with_seed_level_verdicts(tmp_path: Path) -> None:
    study = Study("toy", tmp_path)
    for seed, (rft, grpo) in enumerate([(0.5, 0.7), (0.6, 0.7), (0.4, 0.6), (0.5, 0.6), (0.6, 0.8)]):
        for arm, value in (("rft", rft), ("grpo", grpo)):
            study.record(design="d1", arm=arm, seed=seed, split="val", primary="success",
                         outcome={"success": {"value": value, "wilson": [value - 0.1, value + 0.1]}},
                         extra={"baseline_arm": "rft"})  # fmt: skip
    study.record(design="failed", arm="grpo", seed=0, split="val", outcome={"success": 0.0}, primary="success")
    study.freeze("d1", reason="the only design that learned on val")
    text = index_markdown(tmp_path)
    assert "| d1 | yes | the only design that learned on val |" in text and "| failed | no |  |" in text
    assert text.count("-d1-") == 10 and "0.700 [0.600, 0.800]" in text
    assert "| grpo | 5 | 0.680 |" in text and "grpo beats rft at the seed level" in text
    assert "| grpo | 1 | 0.000 | none (1 seed) |" in text
    main(["index", "--runs-dir", str(tmp_path)])
    assert (tmp_path / "INDEX.md").read_text() == text


def test_the_seed_level_figure_draws_every_seed_in_ladder_order(tmp_path: Path) -> None:
    from experiments.study_plots import plot_seeds, seed_values

    study = Study("toy", tmp_path)
    for seed in range(3):
        for arm, value in (("grpo", (7 + seed) / 10), ("rft", 0.5), ("start", 0.1)):
            study.record(design="d1", arm=arm, seed=seed, split="val", primary="success",
                         outcome={"success": {"value": value}}, extra={"baseline_arm": "rft"})  # fmt: skip
    study.record(design="d1", arm="grpo", seed=3, split="val", primary="success", outcome={"success": 1.0},
                 extra={"baseline_arm": "rft"})  # an unpaired seed: plotted, never paired
    arms, primary, baseline = seed_values(study.runs(), "d1", "val")
    assert list(arms) == ["start", "rft", "grpo"] and (primary, baseline) == ("success", "rft")
    assert arms["grpo"] == {0: 0.7, 1: 0.8, 2: 0.9, 3: 1.0}
    out = tmp_path / "fig" / "seeds.png"
    main(["plot", "toy", "d1", "val", "--out", str(out), "--runs-dir", str(tmp_path)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no run of design 'd2' on split 'val'"):
        plot_seeds(study.runs(), "d2", "val", out)


def test_secondary_outcomes_get_their_own_seed_level_tables_and_figures(tmp_path: Path) -> None:
    from experiments.study_plots import seed_values

    study = Study("toy", tmp_path)
    for seed in range(3):
        for arm, main_value, gen in (("grpo", 0.9, seed / 10), ("rft", 0.8, 0.5)):
            study.record(design="g", arm=arm, seed=seed, split="val", primary="success",
                         outcome={"success": main_value, "gen4_success": {"value": gen}},
                         extra={"baseline_arm": "rft", "secondary": ["gen4_success"]})  # fmt: skip
    text = index_markdown(tmp_path)
    assert "### g on val\n" in text and "### g on val: gen4_success (secondary)" in text
    primary_table, secondary_table = text.split("### g on val")[1:]
    assert "| grpo | 3 | 0.900 |" in primary_table and "| grpo | 3 | 0.100 |" in secondary_table
    assert "rft beats grpo at the seed level" in secondary_table  # -0.4 on every seed
    arms, metric, _ = seed_values(study.runs(), "g", "val", "gen4_success")
    assert metric == "gen4_success" and arms["grpo"] == {0: 0.0, 1: 0.1, 2: 0.2}
    out = tmp_path / "gen4.png"
    main(["plot", "toy", "g", "val", "--metric", "gen4_success", "--out", str(out), "--runs-dir", str(tmp_path)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="with novel_success"):
        seed_values(study.runs(), "g", "val", "novel_success")


def test_compare_pairs_one_design_arm_with_another_by_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.study import compare_markdown

    study = Study("toy", tmp_path)
    for seed in range(4):  # an ablation: design "f" is design "g" with one flag changed, the same seeds
        for design, grpo, gen in (("g", 0.8, 0.1), ("f", 0.9, 0.1 + seed / 10)):
            outcome = {"success": grpo, "gen4_success": gen}
            study.record(design=design, arm="grpo", seed=seed, split="val", primary="success", outcome=outcome)
    study.record(design="g", arm="sft3", seed=0, split="val", primary="success", outcome={"success": 1.0})
    text = compare_markdown(study.runs(), "val", "g:grpo", "f:grpo", ["", "gen4_success"])
    assert "## success" in text and "| 3 | 0.800 | 0.900 | +0.100 |" in text
    assert "f:grpo beats g:grpo at the seed level (mean delta +0.100" in text
    assert "f:grpo vs g:grpo: not shown" in text.split("## gen4_success")[1]  # 0, .1, .2, .3: the CI covers 0
    one = compare_markdown(study.runs(), "val", "g:sft3", "f:grpo")
    assert "| 1 | unpaired |" not in one and "| 1 | - | 0.900 | unpaired |" in one and "one seed, no claim" in one
    assert "no val runs of g:rft" in compare_markdown(study.runs(), "val", "g:rft", "f:grpo")
    with pytest.raises(ValueError, match="design:arm"):
        compare_markdown(study.runs(), "test", "grpo", "f:grpo")
    main(["compare", "toy", "val", "g:grpo", "f:grpo", "--runs-dir", str(tmp_path)])
    assert capsys.readouterr().out.strip() == compare_markdown(study.runs(), "val", "g:grpo", "f:grpo").strip()
