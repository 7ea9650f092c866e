"""Summary and curves of a production-loop run (issue 22), read back from its store and event stream.

``summarize(run_dir, model)`` joins RUN_DIR/events.jsonl (what the production process reported) with the
interaction store (what actually happened: every decision with its evidence, every served interaction with its
version and arm) into per-cycle rows, traffic shares per version over time, and the acceptance checks.
``plot_production(summary, path)`` draws held-out success per cycle and the traffic shares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EVIDENCE_KINDS = ("block", "gate_pass", "advance", "promote", "rollback")
"""Decisions that must carry evidence (add_version / start_canary only name versions and shares)."""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def traffic_shares(rows: list[Any], start: float, bucket_s: float) -> list[dict[str, Any]]:
    """Per time bucket: interactions served and each version's share of them (non-shadow traffic)."""
    buckets: dict[int, dict[int, int]] = {}
    for row in rows:
        if not row.shadow:
            slot = int((row.created_at - start) // bucket_s)
            versions = buckets.setdefault(slot, {})
            versions[row.policy_version] = versions.get(row.policy_version, 0) + 1
    out = []
    for slot in sorted(buckets):
        total = sum(buckets[slot].values())
        shares = {str(v): n / total for v, n in sorted(buckets[slot].items())}
        out.append({"t": slot * bucket_s, "n": total, "share": shares})
    return out


def _cycle_row(event: dict[str, Any]) -> dict[str, Any]:
    report = event["report"]
    gate = report.get("gate") or {}
    evidence = (gate.get("evidence") or {}).get("val/success") or {}
    canary = event.get("canary") or {}
    return {
        "cycle": event["index"],
        "t": event["t"],
        "outcome": report.get("outcome"),
        "trained_on": (report.get("data") or {}).get("used"),
        "trained_by_version": (report.get("data") or {}).get("by_version"),
        "trained_trajectories": (report.get("train") or {}).get("charts/trained_trajectories"),
        "dropped_groups": (report.get("train") or {}).get("charts/dropped_groups"),
        "gate": {
            "promote": gate.get("promote"),
            "reason": gate.get("reason"),
            "val_stable": evidence.get("baseline_mean"),
            "val_candidate": evidence.get("candidate_mean"),
            "diff_ci": evidence.get("ci"),
        },  # fmt: skip
        "candidate": report.get("version"),
        "canary": canary.get("outcome"),
        "canary_highest_stage": canary.get("highest_stage"),
        "deployed": event["held_out"]["version"],
        "held_out": {k: event["held_out"][k] for k in ("value", "low", "high", "n")},
        "trust_excluded": (event.get("trust") or {}).get("excluded"),
    }


def summarize(
    run_dir: Path, model: str, *, adversary: str = "mallory", bucket_s: float | None = None
) -> dict[str, Any]:
    """The run's per-cycle table, traffic shares, decisions (from the store) and acceptance checks."""
    from taskrl.deploy.store import InteractionStore

    events = _events(run_dir)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_kind.setdefault(event["event"], []).append(event)
    ready = by_kind.get("ready", [{}])[0]
    start = ready.get("time", 0.0)
    with InteractionStore(f"sqlite:///{run_dir / 'interactions.db'}") as store:
        rows = store.interactions(model=model)
        feedback = store.feedback()
        decisions = store.decisions(model=model)
    span = (max(r.created_at for r in rows) - start) if rows else 0.0
    bucket = bucket_s or max(5.0, round(span / 40.0))
    baseline = by_kind.get("baseline", [{}])[0].get("held_out")
    cycles = [_cycle_row(e) for e in by_kind.get("cycle", [])]
    for cycle, event in zip(cycles, by_kind.get("cycle", []), strict=True):
        # what the store holds for this cycle: every decision made between its start and its report
        cycle["store_decisions"] = [
            {"kind": d.kind, "from": d.from_version, "to": d.to_version, "t": round(d.created_at - start, 2),
             "evidence": d.evidence}  # fmt: skip
            for d in decisions
            if event["started"] - 1.0 <= d.created_at <= event["time"] + 1.0
        ]
        if cycle["candidate"] is not None:  # the canary's end as the store has it (the event may have missed it)
            ends = [d.kind for d in decisions if ends_canary(d, cycle["candidate"])]
            cycle["canary"] = ends[-1] if ends else None
    degraded_versions = {e["version"] for e in by_kind.get("degraded_canary", []) if e.get("version") is not None}
    degraded_report = by_kind.get("degraded_cycle", [{}])[0].get("report", {})
    if degraded_report.get("version") is not None:
        degraded_versions.add(degraded_report["version"])
    decision_rows = [
        {
            "kind": d.kind,
            "from": d.from_version,
            "to": d.to_version,
            "t": round(d.created_at - start, 2),
            "evidence": d.evidence,
        }  # fmt: skip
        for d in decisions
    ]
    served_by_degraded = [r for r in rows if r.policy_version in degraded_versions]
    tenant_of = {r.id: r.tenant for r in rows}
    last = cycles[-1] if cycles else None
    final_trust = by_kind.get("cycle", [{}])[-1].get("trust") if cycles else None
    acceptance = {
        "improved": bool(
            baseline
            and last
            and last["held_out"]["low"] is not None
            and baseline["high"] is not None
            and last["held_out"]["low"] > baseline["high"]
        ),  # fmt: skip
        "first_held_out": baseline,
        "last_held_out": last["held_out"] if last else None,
        "degraded_versions": sorted(degraded_versions),
        "degraded_gate": degraded_report.get("outcome"),
        "degraded_never_beyond_first_stage": not any(
            d.kind in ("advance", "promote") and d.to_version in degraded_versions for d in decisions
        ),
        "degraded_served": {
            "interactions": len(served_by_degraded),
            "routes": sorted({r.route for r in served_by_degraded}),
        },  # fmt: skip
        "degraded_canary_outcome": [e.get("outcome") for e in by_kind.get("degraded_canary", [])],
        "decisions_with_evidence": all(d.evidence for d in decisions if d.kind in EVIDENCE_KINDS),
        "every_cycle_decision_in_store": _cycles_in_store(cycles, decisions),
        "adversary_excluded_from_training": bool(final_trust and adversary in final_trust.get("excluded", [])),
        "adversary_agreement": (final_trust or {}).get("tenants", {}).get(adversary),
        "adversary_feedback_signals": sum(1 for f in feedback if f.tenant == adversary),
        "feedback_signals": len(feedback),
        "feedback_by_tenant": _count(tenant_of.get(f.interaction_id, "?") for f in feedback),
    }
    return {
        "model": model,
        "baseline": baseline,
        "cycles": cycles,
        "degraded": {"cycle": degraded_report, "canary": by_kind.get("degraded_canary", [])},
        "traffic": {
            "bucket_s": bucket,
            "buckets": traffic_shares(rows, start, bucket),
            "by_version": _count(r.policy_version for r in rows if not r.shadow),
            "by_route": _count(r.route for r in rows),
        },  # fmt: skip
        "decisions": decision_rows,
        "spec": ready.get("spec"),
        "acceptance": acceptance,
    }


def ends_canary(decision: Any, version: int) -> bool:
    """A promotion of ``version`` or a rollback away from it."""
    return (decision.kind == "promote" and decision.to_version == version) or (
        decision.kind == "rollback" and decision.from_version == version
    )


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[str(value)] = out.get(str(value), 0) + 1
    return dict(sorted(out.items()))


def _cycles_in_store(cycles: list[dict[str, Any]], decisions: list[Any]) -> bool:
    """Each cycle that trained left its verdict in the store: a block, or a gate_pass and a canary start."""
    for cycle in cycles:
        if cycle["outcome"] == "blocked":
            continue  # counted below: blocks carry no version, so check their number
        if cycle["outcome"] == "canary":
            kinds = {d.kind for d in decisions if d.to_version == cycle["candidate"]}
            if not {"gate_pass", "start_canary"} <= kinds:
                return False
    blocked = sum(1 for c in cycles if c["outcome"] == "blocked")
    return sum(1 for d in decisions if d.kind == "block") >= blocked


def plot_production(summary: dict[str, Any], path: Path) -> None:
    """Held-out success of the deployed version per cycle (with CIs) and the traffic share per version."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2))
    points = [("start", summary["baseline"])] + [(str(c["cycle"]), c["held_out"]) for c in summary["cycles"]]
    points = [(name, p) for name, p in points if p]
    xs = list(range(len(points)))
    values = [p["value"] for _, p in points]
    low = [p["value"] - (p["low"] if p["low"] is not None else p["value"]) for _, p in points]
    high = [(p["high"] if p["high"] is not None else p["value"]) - p["value"] for _, p in points]
    left.errorbar(xs, values, yerr=[low, high], marker="o", capsize=4, color="tab:red")
    left.set_xticks(xs, [name for name, _ in points])
    left.set_xlabel("after cycle")
    left.set_ylabel("deployed version: held-out greedy success (95% CI)")
    left.set_ylim(-0.02, 1.02)
    left.grid(alpha=0.3)
    buckets = summary["traffic"]["buckets"]
    versions = sorted({v for b in buckets for v in b["share"]}, key=int)
    degraded = {str(v) for v in summary["acceptance"]["degraded_versions"]}
    times = [b["t"] / 60 for b in buckets]
    stacks = [[b["share"].get(v, 0.0) for b in buckets] for v in versions]
    labels = [f"v{v}" + (" (degraded)" if v in degraded else "") for v in versions]
    if buckets:
        right.stackplot(times, stacks, labels=labels, step="post")
    right.set_xlabel("minutes since the server started")
    right.set_ylabel("share of served interactions")
    right.set_ylim(0, 1)
    right.legend(loc="upper left", fontsize=7, ncol=2)
    for decision in summary["decisions"]:
        if decision["kind"] in ("promote", "rollback", "block"):
            color = {"promote": "tab:green", "rollback": "tab:red", "block": "black"}[decision["kind"]]
            right.axvline(decision["t"] / 60, color=color, lw=0.8, ls="--")
    right.set_title("traffic per version (dashed: promote green, rollback red, block black)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
