"""The production process of the issue-22 loop: ``taskrl serve``'s app and ``ProductionCycle`` in one process.

This is what ``taskrl cycle`` runs (the server of ``create_app`` on a real socket, the cycle training from the
store in the same process, so a promoted candidate is served at once) with what the CLI cannot set yet: the
router's canary stages and sample counts, the benchmark's eval suite, a ``TrustedFeedbackStore`` between the
store and the learner, and one deliberately degraded cycle. Started by ``production.py`` as a child process:

    python experiments/production_service.py --spec RUN_DIR/spec.json

It writes RUN_DIR/events.jsonl (one JSON object per line, flushed as it goes): ``ready`` (the URL), ``baseline``,
then per cycle the cycle report, the canary's outcome and the deployed version's held-out success, and ``done``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.production_report import ends_canary  # noqa: E402
from experiments.production_task import answer_number, evaluate, make_tasks, suite  # noqa: E402


class Events:
    """Append-only JSONL of what the production process did (the driver tails it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.time()

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        row = {"event": event, "t": round(time.time() - self.started, 2), "time": time.time(), **fields}
        with self.path.open("a") as out:
            out.write(json.dumps(row, default=str) + "\n")
        return row


def _ci(values: list[float], seed: int) -> dict[str, Any]:
    from taskrl.eval import bootstrap_ci

    interval = bootstrap_ci(values, seed=seed)
    return {"value": sum(values) / len(values), "low": interval[0] if interval else None,
            "high": interval[1] if interval else None, "n": len(values)}  # fmt: skip


def _policy(spec: dict[str, Any]) -> Any:
    from taskrl.policies.hf import HFPolicy
    from taskrl.policies.models import tiny_model

    if spec["tiny"]:
        model, tokenizer = tiny_model(seed=spec["seed"])
        return HFPolicy(model, tokenizer, name=spec["name"], device="cpu")
    return HFPolicy.from_pretrained("smollm2", device=spec["device"], name=spec["name"])


def _train_config(spec: dict[str, Any], run_dir: Path) -> Any:
    from taskrl.training.config import config_from_dict

    return config_from_dict({
        "run_dir": str(run_dir / "learner"), "seed": spec["seed"], "model": "smollm2", "device": spec["device"],
        "finetune": "lora", "lora.rank": 16, "lora.alpha": 32.0, "algo.name": "grpo", "lr": spec["lr"],
        "algo.normalize_std": True, "rollout.max_staleness": spec["max_staleness"], "progress": False,
        # 1024, not 4096: a 4096-token fp32 micro-batch of SmolLM2 (activations + 49k-vocab logits) took the
        # service past 17 GB RSS and it was OOM-killed beside another job; accumulation gives the same gradient.
        "micro_batch_tokens": 1024,
    })  # fmt: skip


class Service:
    """The served model, its router, the learner and the cycle loop."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import torch

        from taskrl.deploy.config import ServeConfig
        from taskrl.deploy.cycle import CycleConfig, ProductionCycle
        from taskrl.deploy.feedback import RewardMap
        from taskrl.deploy.feedback_trust import TrustedFeedbackStore
        from taskrl.deploy.gate import GateConfig
        from taskrl.deploy.router import RouterConfig
        from taskrl.deploy.server import create_app
        from taskrl.deploy.store import InteractionStore
        from taskrl.policies.hf import HFPolicy
        from taskrl.training.learner import Learner
        from taskrl.training.model import prepare_model

        torch.manual_seed(spec["seed"])
        torch.set_num_threads(spec["threads"])
        self.spec = spec
        self.run_dir = Path(spec["run_dir"])
        self.events = Events(self.run_dir / "events.jsonl")
        base = _policy(spec)
        self.tokenizer = base.tokenizer
        served = HFPolicy(copy.deepcopy(base.model), base.tokenizer, name=spec["name"], device=base.device)
        self.train_config = _train_config(spec, self.run_dir)
        self.learner = Learner(prepare_model(base.model, self.train_config), self.train_config, pad_id=base._pad_id)
        self.store = InteractionStore(spec["store"])
        router = RouterConfig(
            stages=tuple(spec["stages"]), min_samples=spec["stage_sessions"], holdout=spec["holdout"],
            rollback_min_samples=spec["rollback_sessions"], salt=spec["salt"], max_tenant_share=spec["tenant_share"],
            advance_margin=spec.get("advance_margin", 0.1), max_stage_samples=spec.get("max_stage_sessions", 0),
        )  # fmt: skip
        config = ServeConfig(api_keys=dict(spec["api_keys"]), admin_keys=(spec["admin_key"],), router=router,
                             default_max_tokens=spec["max_tokens"])  # fmt: skip
        self.app = create_app({spec["name"]: served}, store=self.store, config=config)
        self.router = self.app.state.routers[spec["name"]]
        self.trusted = TrustedFeedbackStore(self.store, min_overlap=spec["trust_min_overlap"],
                                            answer_key=answer_number, model=spec["name"],
                                            unjudged=spec.get("trust_unjudged", "keep"))  # fmt: skip
        self.trusted.max_fresh = spec["max_fresh"]
        self.val = make_tasks(spec["val_tasks"], "val")
        self.test = make_tasks(spec["test_tasks"], "test")
        gate = GateConfig(n_boot=spec["n_boot"], seed=spec["seed"])
        common = {"min_trajectories": spec["min_trajectories"], "max_staleness": spec["max_staleness"],
                  "group_by": "prompt", "gate": gate}  # fmt: skip
        suites = {"val": suite(self.val, spec["max_tokens"])}
        self.cycle = ProductionCycle(
            self.learner, self.tokenizer, self.router, self.trusted,
            CycleConfig(updates_per_cycle=spec["updates_per_cycle"], **common), suites,
        )  # fmt: skip
        inverted = RewardMap(accepted=-1.0, rejected=1.0, edit_kept=-1.0, dissatisfied_followup=0.5)
        self.degraded_config = CycleConfig(updates_per_cycle=spec["degraded_updates"], reward_map=inverted, **common)
        self.suites = suites
        self.held_out: dict[int, dict[str, Any]] = {}

    # -- pieces of a cycle ---------------------------------------------------------------------------
    async def deployed_success(self) -> dict[str, Any]:
        """Held-out (test split) greedy success of the stable version, with a bootstrap CI over tasks."""
        version = self.router.stable
        if version not in self.held_out:
            scores = await evaluate(self.router.policy(version), self.test, self.spec["max_tokens"])
            self.held_out[version] = {"version": version, **_ci(scores, self.spec["seed"])}
        return self.held_out[version]

    async def wait_for_feedback(self, since: int, deadline: float) -> int:
        """Wait until ``fresh_feedback`` new signals arrived since ``since`` (or the deadline); returns the count."""
        while True:
            count = await asyncio.to_thread(self.store.count, "feedback")
            if count - since >= self.spec["fresh_feedback"] or time.monotonic() > deadline:
                return count
            await asyncio.sleep(1.0)

    async def wait_for_canary(self, version: int) -> dict[str, Any]:
        """Wait until the router promotes or rolls back ``version``; a canary past its time limit is rolled back."""
        deadline = time.monotonic() + self.spec["canary_timeout_s"]
        highest_stage = 0
        last_trust = time.monotonic()
        while self.router.candidate == version and time.monotonic() < deadline:
            highest_stage = max(highest_stage, self.router.stage)
            if time.monotonic() - last_trust > 20:  # keep a contradicting tenant out of the live evidence
                await self.cycle.refresh_trust()
                last_trust = time.monotonic()
            await asyncio.sleep(0.5)
        if self.router.candidate == version:
            self.router.rollback({"reason": f"canary not resolved in {self.spec['canary_timeout_s']:g}s"})
        outcome = None
        for _ in range(50):  # the decision may still be on its way from the server thread
            outcome = next((d for d in reversed(self.router.decisions) if ends_canary(d, version)), None)
            if outcome is not None:
                break
            await asyncio.sleep(0.1)
        return {
            "version": version,
            "outcome": outcome.kind if outcome else None,
            "evidence": outcome.evidence if outcome else None,
            "highest_stage": highest_stage,
            "stable": self.router.stable,
        }

    async def degraded_cycle(self) -> None:
        """Train a copy of the learner on inverted feedback and send it through the same gate; if the gate blocks
        it, push it to a canary anyway (an operator's mistake) to show the live rollback stops it at stage 0."""
        from taskrl.deploy.cycle import ProductionCycle
        from taskrl.deploy.store import Decision
        from taskrl.training.learner import Learner

        learner = Learner(copy.deepcopy(self.learner.model), self.train_config, pad_id=self.learner.pad_id)
        cycle = ProductionCycle(learner, self.tokenizer, self.router, self.trusted, self.degraded_config, self.suites)
        cycle.step = 900  # names its candidate taskrl-cycle900: apart from the honest cycles' versions
        report = await cycle.run_once()
        self.events.emit("degraded_cycle", report=report)
        if report.get("outcome") == "canary":  # the cycle stored the gate_pass decision with its evidence
            self.events.emit("degraded_canary", forced=False, **await self.wait_for_canary(report["version"]))
            return
        if report.get("outcome") != "blocked" or not self.spec["force_degraded_canary"]:
            return
        policy = cycle._candidate()
        version = self.router.add_version(policy)
        reason = "benchmark: the gate-blocked degraded candidate forced to canary to test the live rollback"
        decision = Decision(self.router.model, "forced_canary", self.router.stable, version, {"reason": reason})
        await self.store.add("decisions", decision)
        self.router.start_canary(version)
        self.events.emit("degraded_canary", forced=True, **await self.wait_for_canary(version))

    async def run(self) -> None:
        spec = self.spec
        baseline = await self.deployed_success()
        self.events.emit("baseline", held_out=baseline)
        feedback_seen = 0
        for index in range(spec["cycles"]):
            deadline = time.monotonic() + spec["collect_timeout_s"]
            feedback_seen = await self.wait_for_feedback(feedback_seen, deadline)
            cut = time.time()  # this cycle trains on what was served since the previous cycle's cut
            if index == spec["degraded_at"]:
                await self.degraded_cycle()
            started = time.time()
            report = await self.cycle.run_once()
            # too little trusted data yet (e.g. nobody judged, few corroborated signals): keep collecting into the
            # same window instead of spending the cycle, until the collection time limit
            while report.get("outcome") == "waiting" and time.monotonic() < deadline:
                self.events.emit("cycle_waiting", index=index, report=report, trust=self.trusted.report())
                feedback_seen = await self.wait_for_feedback(feedback_seen, deadline)
                cut, started = time.time(), time.time()
                report = await self.cycle.run_once()
            self.trusted.fresh_since = cut
            row: dict[str, Any] = {"index": index, "report": report, "trust": self.trusted.report(),
                                   "started": started}  # fmt: skip
            if report.get("outcome") == "canary":
                row["canary"] = await self.wait_for_canary(report["version"])
            row["router"] = self.router.state()
            row["held_out"] = await self.deployed_success()
            self.events.emit("cycle", **row)
        self.events.emit("done", held_out=self.held_out, decisions=len(self.router.decisions))


async def main(spec: dict[str, Any]) -> None:
    from taskrl.deploy.server import ServerThread

    service = Service(spec)
    with ServerThread(service.app, "127.0.0.1", spec["port"], log_level="warning") as server:
        service.events.emit("ready", url=server.base_url, spec={k: v for k, v in spec.items() if "key" not in k})
        try:
            await service.run()
        except Exception as exc:
            service.events.emit("error", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            await asyncio.sleep(0.5)  # let the store writer flush the last decisions
    service.store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, required=True, help="JSON spec written by production.py")
    spec_data = json.loads(parser.parse_args().spec.read_text())
    spec_data["stages"] = list(spec_data["stages"])
    asyncio.run(main(spec_data))
