"""The real-time RL cycle (Composer 2): serve and collect -> train from the store -> gate -> deploy, in a loop.

``ProductionCycle(learner, tokenizer, router, store, config, suites)`` owns the learner's model (a separate
copy from the one being served). ``await cycle.run_once()`` trains on the store's fresh, feedback-labelled
interactions, builds the candidate policy, runs every eval suite on stable and candidate, and either hands
the candidate to the router (canary or immediate activation) or blocks it. Every gate verdict is stored
with its evidence: a ``gate_pass`` decision before the canary/activation, a ``block`` decision otherwise.
A suite that also returns ``task_ids`` (one per episode) is gated paired by task when stable and candidate
played the same tasks; otherwise the bootstrap is unpaired and the evidence says why.
``await cycle.run()`` repeats it every ``CycleConfig.cycle_s`` seconds (Cursor: ~5 h).
With a ``TrustedFeedbackStore`` the tenants it excludes from training are also kept out of the router's live
canary evidence (``refresh_trust``: at every cycle, and every ``cycle_s`` while a canary runs).
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from taskrl.deploy.dataset import GroupBy, trajectories_from_store
from taskrl.deploy.feedback import RewardMap
from taskrl.deploy.feedback_trust import TrustedFeedbackStore
from taskrl.deploy.gate import GateConfig, gate_decision
from taskrl.deploy.router import Router
from taskrl.deploy.store import Decision, InteractionStore
from taskrl.policies.base import Policy
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import record_base_model

Suite = Callable[[Policy], Awaitable[dict[str, list[Any]]]]
"""An eval suite: plays a policy and returns per-episode scores by metric (higher is better unless the
gate's ``lower_is_better`` names it), optionally with ``task_ids`` naming each episode's task (for pairing)."""

TASK_IDS = "task_ids"
"""The reserved suite key naming each episode's task; never a metric."""


@dataclass
class CycleConfig:
    """One production training loop."""

    cycle_s: float = 5 * 3600.0
    """Seconds between the starts of two cycles (serving and collecting happen meanwhile)."""
    cycles: int = 0
    """Cycles to run; 0 runs until cancelled."""
    min_trajectories: int = 16
    """Feedback-labelled interactions needed to train; fewer and the cycle waits for the next one."""
    max_staleness: int = 1
    """Train only on interactions of the last this-many policy versions (plus the stable one)."""
    updates_per_cycle: int = 1
    """Learner updates on each cycle's batch (later ones are off-policy, corrected by the stored logprobs)."""
    group_by: GroupBy = "prompt"
    """How interactions form GRPO groups: identical prompts, sessions, or none."""
    rollout: Literal["canary", "activate"] = "canary"
    """What a candidate that passes the gate gets: canary stages, or all traffic at once."""
    gate: GateConfig = field(default_factory=GateConfig)
    """When the candidate counts as a regression on the eval suites."""
    reward_map: RewardMap = field(default_factory=RewardMap)
    """Feedback -> reward, the same map the server uses for live rollback."""
    retire_unroutable: bool = True
    """At each cycle, retire every version no session can reach (rolled back, or superseded beyond the
    holdout's previous): ``Router.retire`` frees its weights and KV cache, so memory does not grow per cycle.
    An operator can still activate the previous version; older ones must be loaded again (``/admin`` LoRA load)."""
    exclude_rolled_back: bool = True
    """Leave rows served by versions the router rolled back out of training (their users saw a rejected
    candidate; its feedback describes that candidate, not the policy being improved)."""
    revert_rejected: bool = True
    """When the learner's newest candidate was blocked by the gate or rolled back in its canary, the next cycle
    first puts the learner back to the weights and optimizer state of the version serving as stable, so the next
    update does not build on a rejected one (without this, one update trained on not-yet-detected adversarial
    feedback kept dragging every later candidate down). Only versions this cycle produced (and the stable one it
    started from) have a saved state; after an operator activates something else the learner is left as is."""
    paired: bool = True
    """Pair the gate's bootstrap by task when every suite returned ``task_ids`` and both policies played the
    same tasks (the candidate's scores are aligned to the stable's task order); False always compares means."""

    def __post_init__(self) -> None:
        if self.cycle_s <= 0:
            raise ValueError(f"CycleConfig.cycle_s must be > 0, got {self.cycle_s}")
        if self.cycles < 0:
            raise ValueError(f"CycleConfig.cycles must be >= 0, got {self.cycles}")
        if self.min_trajectories < 1:
            raise ValueError(f"CycleConfig.min_trajectories must be >= 1, got {self.min_trajectories}")
        if self.max_staleness < 0:
            raise ValueError(f"CycleConfig.max_staleness must be >= 0, got {self.max_staleness}")
        if self.updates_per_cycle < 1:
            raise ValueError(f"CycleConfig.updates_per_cycle must be >= 1, got {self.updates_per_cycle}")
        if self.rollout not in ("canary", "activate"):
            raise ValueError(f"CycleConfig.rollout must be canary or activate, got {self.rollout!r}")


class ProductionCycle:
    """Trains the router's model from its own logged traffic and deploys what passes the gate."""

    def __init__(
        self,
        learner: Any,
        tokenizer: Any,
        router: Router,
        store: InteractionStore,
        config: CycleConfig,
        suites: dict[str, Suite],
        *,
        serve_device: Any = None,
    ) -> None:
        if not suites:
            raise ValueError("ProductionCycle needs at least one eval suite: nothing is promoted without evidence")
        self.learner = learner
        self.tokenizer = tokenizer
        self.router = router
        self.store = store
        self.config = config
        self.suites = suites
        self.serve_device = serve_device
        self.step = 0
        self.history: list[dict[str, Any]] = []
        # Learner states by the router version whose weights they are; the learner starts as the stable version.
        self._states: dict[int, dict[str, Any]] = {}
        self._holds: int | None = router.stable  # the version whose weights the learner holds (None: rejected)

    def _learner_state(self) -> dict[str, Any]:
        """A copy of what the learner updates: trainable tensors and the optimizer's state."""
        params = {name: t.detach().clone() for name, t in self.learner.trainable_state().items()}
        return {"params": params, "optimizer": copy.deepcopy(self.learner.optimizer.state_dict())}

    async def _revert_if_rejected(self) -> int | None:
        """Put the learner back to the stable version's state when it holds a rejected candidate's weights; returns
        the version reverted to. Saved states of versions no longer routable are dropped."""
        if not self.config.revert_rejected:
            return None
        stable, candidate = self.router.stable, self.router.candidate
        keep = self.router.live_versions()
        self._states = {v: state for v, state in self._states.items() if v in keep}
        held = self._holds is not None and self._holds in (stable, candidate)
        if held or stable not in self._states:
            return None
        saved = self._states[stable]
        self.learner.load_trainable_state(saved["params"])
        self.learner.optimizer.load_state_dict(copy.deepcopy(saved["optimizer"]))
        rejected, self._holds = self._holds, stable
        reason = "the learner's last candidate was blocked or rolled back; training restarts from the stable version"
        await self._log("revert_learner", stable, {"cycle": self.step, "rejected": rejected, "reason": reason})
        return stable

    def _candidate(self) -> HFPolicy:
        """A frozen serving copy of the learner's weights (LoRA merged), on the serving device."""
        from taskrl.training.model import is_peft

        model = copy.deepcopy(self.learner.model)
        if is_peft(model):
            model = model.merge_and_unload()
        for param in model.parameters():
            param.requires_grad_(False)
        device = self.serve_device if self.serve_device is not None else self.learner.device
        return HFPolicy(model, self.tokenizer, name=f"{self.router.model}-cycle{self.step}", device=device)

    async def _evaluate(self, policy: Policy) -> tuple[dict[str, list[float]], dict[str, list[str] | None]]:
        """Scores by ``suite/metric`` and, per suite, its episodes' task ids (None when the suite gave none)."""
        scores: dict[str, list[float]] = {}
        task_ids: dict[str, list[str] | None] = {}
        for suite_name, suite in self.suites.items():
            result = dict(await suite(policy))
            ids = result.pop(TASK_IDS, None)
            task_ids[suite_name] = [str(i) for i in ids] if ids is not None else None
            for metric, values in result.items():
                scores[f"{suite_name}/{metric}"] = list(values)
        return scores, task_ids

    def _pair(
        self,
        base: tuple[dict[str, list[float]], dict[str, list[str] | None]],
        cand: tuple[dict[str, list[float]], dict[str, list[str] | None]],
    ) -> tuple[dict[str, list[float]], bool, str]:
        """The candidate's scores aligned to the stable's task order, whether pairing applies, and why not."""
        (_, base_ids), (cand_scores, cand_ids) = base, cand
        if not self.config.paired:
            return cand_scores, False, "pairing disabled (CycleConfig.paired)"
        aligned: dict[str, list[float]] = {}
        for suite_name in self.suites:
            b, c = base_ids.get(suite_name), cand_ids.get(suite_name)
            if b is None or c is None:
                return cand_scores, False, f"suite {suite_name} returned no {TASK_IDS}"
            if len(set(b)) != len(b) or sorted(b) != sorted(c):
                return cand_scores, False, f"suite {suite_name}: stable and candidate played different tasks"
            order = [c.index(task) for task in b]
            for name, values in cand_scores.items():
                if name.startswith(f"{suite_name}/"):
                    if len(values) != len(c):
                        return cand_scores, False, f"{name}: {len(values)} scores for {len(c)} {TASK_IDS}"
                    aligned[name] = [values[i] for i in order]
        return aligned, True, "paired by task"

    def rolled_back(self) -> set[int]:
        """Versions the router rolled back (a rollback decision's ``from_version`` is the dropped candidate)."""
        return {d.from_version for d in self.router.decisions if d.kind == "rollback" and d.from_version is not None}

    async def _log(self, kind: str, to_version: int | None, evidence: dict[str, Any]) -> None:
        """Record a decision and wait until it is durable: the cycle reports nothing the store does not hold."""
        decision = Decision(self.router.model, kind, self.router.stable, to_version, evidence)
        self.router.decisions.append(decision)
        await self.store.add("decisions", decision)

    async def refresh_trust(self) -> Decision | None:
        """Recompute feedback trust and keep the tenants it excludes out of the router's live evidence too (a
        tenant accepting bad answers must not hold a degraded canary up); None without a trusted store or change."""
        if not isinstance(self.store, TrustedFeedbackStore):
            return None
        await asyncio.to_thread(self.store.refresh)
        return self._push_trust()

    def _push_trust(self) -> Decision | None:
        """Hand the trusted store's current exclusions to the router (no recomputation)."""
        if not isinstance(self.store, TrustedFeedbackStore):
            return None
        return self.router.set_untrusted(self.store.excluded, {"trust": self.store.report()})

    async def run_once(self) -> dict[str, Any]:
        """One cycle: train on fresh feedback, gate, deploy. Returns what happened (also logged)."""
        started = time.perf_counter()
        if self.config.retire_unroutable:
            for version in sorted(set(self.router.versions) - self.router.live_versions()):
                self.router.retire(version)
        reverted = await self._revert_if_rejected()
        rolled_back = self.rolled_back() if self.config.exclude_rolled_back else set()
        # the window counts from the newest version not rolled back: a dropped canary must not push the stable
        # version's own traffic out of a small max_staleness window
        latest = max(set(self.router.versions) - rolled_back, default=max(self.router.versions))
        trajectories, stats = await asyncio.to_thread(
            trajectories_from_store,
            self.store,
            self.config.reward_map,
            max_staleness=self.config.max_staleness,
            model=self.router.model,
            latest_version=latest,
            group_by=self.config.group_by,
            exclude_versions=rolled_back,
        )
        self._push_trust()  # reading the feedback just recomputed trust: the router gets the same exclusions
        report: dict[str, Any] = {"cycle": self.step, "data": asdict(stats)}
        if reverted is not None:
            report["reverted_to"] = reverted
        if len(trajectories) < self.config.min_trajectories:
            report["outcome"] = "waiting"
            report["reason"] = f"{len(trajectories)} labelled interactions < min_trajectories"
            self.history.append(report)
            return report
        # The learner's weights are the newest version's; its staleness check counts from there.
        self.learner.version = latest
        if self.config.revert_rejected and self._holds is not None and self._holds not in self._states:
            self._states[self._holds] = self._learner_state()  # e.g. the stable version the learner started as
        metrics: dict[str, float] = {}
        for update in range(self.config.updates_per_cycle):
            metrics = await asyncio.to_thread(self.learner.update, trajectories, step=self.step * 1000 + update)
        report["train"] = metrics
        self._holds = None  # the learner's weights are no served version's until a candidate of them is added
        candidate = self._candidate()
        from taskrl.deploy.admin import non_finite_parameters

        poisoned = non_finite_parameters(candidate.model)
        if poisoned:  # NaN/inf weights answer garbage; no eval can make such a candidate safe to serve
            candidate.close()
            reason = f"candidate has non-finite weights in {len(poisoned)} tensors (e.g. {poisoned[0]})"
            report["gate"] = {"promote": False, "reason": reason, "evidence": {"non_finite_tensors": poisoned[:20]}}
            await self._log("block", None, {"reason": reason, "non_finite_tensors": poisoned[:20]})
            report["outcome"] = "blocked"
            report["seconds"] = time.perf_counter() - started
            self.step += 1
            self.history.append(report)
            return report
        baseline = await self._evaluate(self.router.policy(self.router.stable))
        candidate_eval = await self._evaluate(candidate)
        candidate_scores, paired, pairing = self._pair(baseline, candidate_eval)
        verdict = gate_decision(baseline[0], candidate_scores, self.config.gate, paired=paired)
        verdict.evidence = {"paired": paired, "pairing": pairing, **verdict.evidence}
        report["gate"] = {"promote": verdict.promote, "reason": verdict.reason, "evidence": verdict.evidence}
        if verdict.promote:
            version = self.router.add_version(candidate)
            self._holds = version
            if self.config.revert_rejected:
                self._states[version] = self._learner_state()
            train = {k: v for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
            evidence = {"reason": verdict.reason, "cycle": self.step, "train": train, **verdict.evidence}
            await self._log("gate_pass", version, evidence)  # durable before the candidate serves anyone
            if self.config.rollout == "activate":
                self.router.activate(version, {"gate": verdict.evidence})
            else:
                self.router.start_canary(version)
            report["outcome"], report["version"] = self.config.rollout, version
        else:
            candidate.close()
            await self._log("block", None, {"reason": verdict.reason, "cycle": self.step, **verdict.evidence})
            report["outcome"] = "blocked"
        report["seconds"] = time.perf_counter() - started
        self.step += 1
        self.history.append(report)
        return report

    async def run(self) -> list[dict[str, Any]]:
        """Run cycles every ``cycle_s`` seconds until ``cycles`` are done (or forever when 0)."""
        while self.config.cycles == 0 or len(self.history) < self.config.cycles:
            started = time.monotonic()
            if self.router.candidate is None:  # one candidate at a time: let a running canary finish first
                await self.run_once()
            else:
                await self.refresh_trust()
            await asyncio.sleep(max(0.0, self.config.cycle_s - (time.monotonic() - started)))
        return self.history


def train_from_store(
    train_config: Any,
    store_url: str,
    *,
    model_name: str | None = None,
    reward_map: RewardMap | None = None,
    group_by: GroupBy = "prompt",
) -> tuple[list[dict[str, float]], str]:
    """Offline ``taskrl train --from-store``: ``steps`` learner updates on the store's fresh labelled interactions.

    Uses ``train_config``'s model, algorithm and ``max_staleness``; writes ``run_dir/metrics.jsonl`` (one row per
    update plus the data stats: rows read, skipped as non-finite, malformed, undelivered) and the result to
    ``run_dir/adapter`` (LoRA, hot-loadable with ``/v1/load_lora_adapter``) or ``run_dir/model`` (full). Refuses
    (``ValueError``, nothing written) to save weights that are not all finite. Returns (metrics per step, path).
    """
    from pathlib import Path

    from taskrl.deploy.admin import non_finite_parameters
    from taskrl.runlog import RunLog
    from taskrl.training.learner import Learner
    from taskrl.training.model import is_peft, prepare_model

    with InteractionStore(store_url) as store:
        trajectories, stats = trajectories_from_store(
            store, reward_map, max_staleness=train_config.rollout.max_staleness, model=model_name, group_by=group_by
        )
    run = RunLog(train_config.run_dir)
    run.write_config(train_config)
    data = {f"data/{k}": float(v) for k, v in asdict(stats).items() if isinstance(v, int) and v is not None}
    if stats.non_finite or stats.malformed:
        run.alert(0, "store_rows", float(stats.non_finite + stats.malformed), 0.0,
                  f"{stats.non_finite} non-finite and {stats.malformed} malformed interactions skipped")  # fmt: skip
    if not trajectories:
        run.log(0, data)
        run.close()
        raise ValueError(
            f"no interactions with feedback in {store_url} for versions >= {stats.min_version} "
            f"({stats.read} read, {stats.without_feedback} without feedback, {stats.non_finite} non-finite, "
            f"{stats.malformed} malformed); collect feedback first"
        )
    policy = HFPolicy.from_pretrained(train_config.model, device=train_config.device)
    model = prepare_model(policy.model.train(), train_config)
    learner = Learner(model, train_config, pad_id=policy._pad_id)
    rows = []
    for step in range(train_config.steps):
        learner.version = stats.latest_version or 0  # every step re-uses the same fresh batch
        row = learner.update(trajectories, step=step)
        rows.append(row)
        run.log(step, {**row, **(data if step == 0 else {})})
    out = Path(train_config.run_dir) / ("adapter" if is_peft(model) else "model")
    poisoned = non_finite_parameters(model)
    if poisoned:
        message = f"trained weights are non-finite in {len(poisoned)} tensors (e.g. {poisoned[0]}); nothing saved"
        run.alert(train_config.steps, "non_finite_weights", float(len(poisoned)), 0.0, message)
        run.close()
        policy.close()
        raise ValueError(message)
    model.save_pretrained(str(out))
    if not is_peft(model):
        policy.tokenizer.save_pretrained(str(out))
    record_base_model(out, train_config.model)  # `taskrl serve --model` loads the adapter offline
    policy.close()
    run.close()
    return rows, str(out)
