"""Production loop (issue 22): does real-time RL from users' feedback raise the quality of what is served?

Not run in CI (``--tiny`` is, as a smoke test). The script starts the production process
(``production_service.py``: the ``taskrl serve`` app on a real socket with ``ProductionCycle`` training from its
store) and plays a user population against it with the official ``openai`` SDK: each session asks one
price-list question (``production_task.py``) and may post feedback from the task's hidden check through
``POST /v1/feedback``. Noise: ``--silent`` of the users never answer, honest users flip ``--flip`` of their
signals, and one tenant (``mallory``) always posts the opposite of the truth. Each cycle trains SmolLM2-135M
(LoRA, GRPO over identical prompts) on the fresh labelled traffic, gates the candidate on held-out ``val`` tasks
and canaries it through the router's stages; one cycle (``--degraded-at``) also trains a candidate on
*inverted* feedback, which must be blocked, or rolled back at the first canary stage.

Reported per cycle (RUN_DIR/summary.json, docs/learning_production.{json,png}): the deployed version's greedy
success on held-out ``test`` tasks with a bootstrap CI, the traffic share per version over time (read back from
the store), and every gate/router decision with its evidence (read back from the store). Events stream to
stdout and RUN_DIR/events.jsonl as they happen. ``--resume`` re-reads a run's store and events and rewrites the
summary without serving again (``finished`` says whether it reached its last cycle); an interrupted run cannot
continue serving (the router's versions live in the production process's memory).

    python experiments/production.py --cycles 5 --run-dir runs/production      # ~20 min on 2 CPU cores
    python experiments/production.py --tiny --run-dir /tmp/prod-tiny            # smoke test, ~1 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.production_report import plot_production, summarize  # noqa: E402
from experiments.production_task import ListingTask, correct, make_tasks  # noqa: E402

HONEST = ("alice", "bob", "carol", "dave")
ADVERSARY = "mallory"
MODEL_NAME = "taskrl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--run-dir", type=Path, default=Path("runs/production"))
    add("--out", type=Path, default=None, help="also write the summary JSON here (docs/learning_production.json)")
    add("--plot", type=Path, default=None, help="write the curves here (docs/learning_production.png)")
    add("--tiny", action="store_true", help="a tiny random model and small counts: exercises everything in ~1 min")
    add("--resume", action="store_true", help="rebuild the summary from a run's store and events, no serving")
    add("--cycles", type=int, default=5)
    add("--degraded-at", type=int, default=2, help="cycle index before which the inverted-feedback candidate runs")
    add("--no-force-degraded-canary", action="store_true", help="do not push a gate-blocked degraded candidate")
    add("--seed", type=int, default=0)
    add("--users", type=int, default=8, help="concurrent simulated users")
    add("--train-tasks", type=int, default=32, help="distinct prompts in the users' pool (repeats form GRPO groups)")
    add("--val-tasks", type=int, default=40, help="gate tasks (held out)")
    add("--test-tasks", type=int, default=64, help="report tasks (held out, never seen by the gate)")
    add("--temperature", type=float, default=0.5, help="sampling temperature the users request")
    add("--max-tokens", type=int, default=24)
    add("--silent", type=float, default=0.2, help="share of users who never answer")
    add("--flip", type=float, default=0.1, help="share of honest signals flipped")
    add("--adversary-share", type=float, default=0.2, help="share of sessions sent by the adversarial tenant")
    add("--lr", type=float, default=3e-4)
    add("--updates-per-cycle", type=int, default=2)
    add("--degraded-updates", type=int, default=3)
    add("--min-trajectories", type=int, default=48)
    add("--fresh-feedback", type=int, default=64, help="new feedback signals before each cycle trains")
    add("--max-staleness", type=int, default=2)
    add("--max-fresh", type=int, default=160, help="newest interactions a cycle may train on (bounds its cost)")
    add("--stages", default="0.2,0.5,1.0", help="canary shares of non-holdout sessions")
    add("--stage-sessions", type=int, default=16, help="sessions with feedback per canary stage")
    add("--rollback-sessions", type=int, default=8, help="candidate sessions before the live rollback test runs")
    add("--advance-margin", type=float, default=0.1, help="advance a stage only when live CI lower end >= -this")
    add("--max-stage-sessions", type=int, default=0, help="roll back a stage inconclusive after this (0: 10x)")
    add("--holdout", type=float, default=0.1)
    add("--trust-min-overlap", type=int, default=20)
    add("--trust-unjudged", choices=("keep", "corroborated", "drop"), default="corroborated",
        help="what a not-yet-judged tenant's signals do: train, train where another tenant agrees, or wait")
    add("--canary-timeout-s", type=float, default=300.0)
    add("--collect-timeout-s", type=float, default=600.0)
    add("--timeout-min", type=float, default=40.0, help="hard limit of the whole run")
    add("--threads", type=int, default=2, help="torch threads of the production process")
    add("--device", default="cpu")
    add("--nice", type=int, default=0, help="niceness of the production process")
    args = parser.parse_args(argv)
    if args.tiny:
        tiny = {"cycles": 2, "train_tasks": 8, "val_tasks": 8, "test_tasks": 8, "max_tokens": 6, "users": 4,
                "min_trajectories": 8, "fresh_feedback": 10, "stage_sessions": 3, "rollback_sessions": 2,
                "trust_min_overlap": 2, "canary_timeout_s": 40.0, "collect_timeout_s": 60.0, "timeout_min": 4.0,
                "temperature": 1.0, "updates_per_cycle": 1, "degraded_updates": 1, "degraded_at": 1,
                "trust_unjudged": "keep"}  # fmt: skip
        for name, value in tiny.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


def make_spec(args: argparse.Namespace, keys: dict[str, str], admin_key: str) -> dict[str, Any]:
    """What the production process needs (written to RUN_DIR/spec.json; keys go through the environment)."""
    run_dir = args.run_dir.resolve()
    return {
        "run_dir": str(run_dir), "store": f"sqlite:///{run_dir / 'interactions.db'}", "name": MODEL_NAME,
        "tiny": args.tiny, "seed": args.seed, "device": args.device, "threads": args.threads, "port": 0,
        "api_keys": keys, "admin_key": admin_key, "salt": f"production-{args.seed}",
        "stages": [float(s) for s in args.stages.split(",")], "stage_sessions": args.stage_sessions,
        "rollback_sessions": args.rollback_sessions, "holdout": args.holdout, "tenant_share": 0.5,
        "advance_margin": args.advance_margin, "max_stage_sessions": args.max_stage_sessions,
        "max_tokens": args.max_tokens, "lr": args.lr, "max_staleness": args.max_staleness,
        "max_fresh": args.max_fresh,
        "updates_per_cycle": args.updates_per_cycle, "degraded_updates": args.degraded_updates,
        "min_trajectories": args.min_trajectories, "fresh_feedback": args.fresh_feedback,
        "cycles": args.cycles, "degraded_at": args.degraded_at,
        "force_degraded_canary": not args.no_force_degraded_canary, "val_tasks": args.val_tasks,
        "test_tasks": args.test_tasks, "n_boot": 500 if args.tiny else 2000,
        "trust_min_overlap": args.trust_min_overlap, "trust_unjudged": args.trust_unjudged,
        "canary_timeout_s": args.canary_timeout_s,
        "collect_timeout_s": args.collect_timeout_s,
    }  # fmt: skip


class Population:
    """Simulated users: sessions of one question each, feedback from the hidden check with noise."""

    def __init__(self, args: argparse.Namespace, base_url: str, keys: dict[str, str], tasks: list[ListingTask]) -> None:
        self.args, self.base_url, self.tasks = args, base_url, tasks
        self.key_of = {tenant: key for key, tenant in keys.items()}
        self.counts = {"sessions": 0, "errors": 0, "feedback": 0, "silent": 0, "correct": 0}
        self.log = (args.run_dir / "sessions.jsonl").open("a")

    async def user(self, index: int, stop: asyncio.Event) -> None:
        import httpx
        import openai

        rng = random.Random(f"{self.args.seed}-{index}")
        clients = {t: openai.AsyncOpenAI(base_url=self.base_url, api_key=k, max_retries=2, timeout=120.0)
                   for t, k in self.key_of.items()}  # fmt: skip
        async with httpx.AsyncClient(base_url=self.base_url.removesuffix("/v1"), timeout=60.0) as http:
            while not stop.is_set():
                tenant = ADVERSARY if rng.random() < self.args.adversary_share else rng.choice(HONEST)
                task = rng.choice(self.tasks)
                session = f"{tenant}-{index}-{secrets.token_hex(6)}"
                try:
                    response = await clients[tenant].chat.completions.create(
                        model=MODEL_NAME, messages=task.messages(), max_tokens=self.args.max_tokens,  # type: ignore[arg-type]
                        temperature=self.args.temperature, user=session, extra_headers={"x-session-id": session},
                    )  # fmt: skip
                except openai.OpenAIError as exc:
                    self.counts["errors"] += 1
                    self._write({"session": session, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    await asyncio.sleep(1.0)
                    continue
                self.counts["sessions"] += 1
                reply = response.choices[0].message.content
                right = correct(reply, task)
                self.counts["correct"] += int(right)
                row = {"session": session, "tenant": tenant, "task": task.id, "id": response.id, "correct": right}
                if tenant != ADVERSARY and rng.random() < self.args.silent:
                    self.counts["silent"] += 1
                    self._write({**row, "feedback": None})
                    continue
                liked = right if tenant != ADVERSARY else not right
                if tenant != ADVERSARY and rng.random() < self.args.flip:
                    liked = not liked
                kind = "accepted" if liked else "rejected"
                try:
                    posted = await http.post("/v1/feedback", json={"interaction_id": response.id, "kind": kind},
                                             headers={"Authorization": f"Bearer {self.key_of[tenant]}"})  # fmt: skip
                except httpx.HTTPError as exc:  # the server went away mid-call (e.g. the loop just finished)
                    self.counts["errors"] += 1
                    self._write({**row, "feedback": kind, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    await asyncio.sleep(1.0)
                    continue
                ok = posted.status_code == 200
                self.counts["feedback"] += int(ok)
                decision = posted.json().get("decision") if ok else None
                self._write({**row, "feedback": kind, "status": posted.status_code, "decision": decision})

    def _write(self, row: dict[str, Any]) -> None:
        self.log.write(json.dumps({"time": time.time(), **row}) + "\n")
        self.log.flush()


def _events(path: Path, seen: int) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[seen:] if line.strip()]


def _brief(event: dict[str, Any]) -> str:
    """One line per event for the console (the full event goes to events.jsonl)."""
    kind = event["event"]
    if kind in ("baseline", "cycle") and "held_out" in event:
        held = event["held_out"]
        extra = ""
        if kind == "cycle":
            report = event["report"]
            extra = f" outcome={report.get('outcome')} canary={(event.get('canary') or {}).get('outcome')}"
        return f"[{event['t']:7.1f}s] {kind}: deployed v{held['version']} held-out {held['value']:.3f} " \
               f"[{held['low']}, {held['high']}]{extra}"  # fmt: skip
    if kind == "degraded_cycle":
        return f"[{event['t']:7.1f}s] degraded candidate: {event['report'].get('outcome')} " \
               f"({(event['report'].get('gate') or {}).get('reason')})"  # fmt: skip
    if kind == "degraded_canary":
        return f"[{event['t']:7.1f}s] degraded canary (forced={event['forced']}): {event['outcome']} " \
               f"at stage {event['highest_stage']}"  # fmt: skip
    return f"[{event.get('t', 0):7.1f}s] {kind}"


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    """Start the production process, play the users until it reports ``done``, then summarise from the store."""
    keys = {secrets.token_hex(12): tenant for tenant in (*HONEST, ADVERSARY)}
    admin_key = secrets.token_hex(16)
    spec = make_spec(args, keys, admin_key)
    (args.run_dir / "spec.json").write_text(json.dumps({k: v for k, v in spec.items() if "key" not in k}, indent=1))
    secret_spec = args.run_dir / ".spec-with-keys.json"
    secret_spec.write_text(json.dumps(spec))
    os.chmod(secret_spec, 0o600)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(ROOT / "experiments/production_service.py"), "--spec", str(secret_spec)]
    if args.nice:
        command = ["nice", "-n", str(args.nice), *command]
    log = (args.run_dir / "service.log").open("w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    events_path = args.run_dir / "events.jsonl"
    seen, events = 0, []
    deadline = time.monotonic() + args.timeout_min * 60
    stop = asyncio.Event()
    workers: list[asyncio.Task] = []
    population: Population | None = None
    try:
        while time.monotonic() < deadline:
            new = _events(events_path, seen)
            seen += len(new)
            for event in new:
                events.append(event)
                print(_brief(event), flush=True)
                if event["event"] == "ready":
                    train = make_tasks(args.train_tasks, "train")
                    population = Population(args, event["url"], keys, train)
                    workers = [asyncio.create_task(population.user(i, stop)) for i in range(args.users)]
            if any(e["event"] in ("done", "error") for e in events):
                break
            if process.poll() is not None:
                raise RuntimeError(f"production process exited with {process.returncode}; see {log.name}")
            await asyncio.sleep(1.0)
        else:
            raise TimeoutError(f"production loop not done within {args.timeout_min:g} min; see {events_path}")
    finally:
        stop.set()
        if workers:
            await asyncio.wait(workers, timeout=130)
        secret_spec.unlink(missing_ok=True)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.terminate()
            process.wait(timeout=30)
        log.close()
    if any(e["event"] == "error" for e in events):
        raise RuntimeError(f"production process failed: {next(e for e in events if e['event'] == 'error')['error']}")
    return {"population": population.counts if population else {}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.time()
    extra: dict[str, Any] = {}
    events = args.run_dir / "events.jsonl"
    finished = events.exists() and '"done"' in events.read_text()
    if not (args.resume and events.exists()):
        if args.run_dir.exists():
            shutil.rmtree(args.run_dir)
        args.run_dir.mkdir(parents=True)
        extra = asyncio.run(drive(args))
    summary = summarize(args.run_dir, MODEL_NAME, adversary=ADVERSARY)
    finished = finished or '"done"' in events.read_text()
    summary.update(extra, command=" ".join(sys.argv), wall_s=time.time() - started, tiny=args.tiny, finished=finished)
    (args.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1, default=str))
    if args.plot:
        plot_production(summary, args.plot)
    print(json.dumps(summary["acceptance"], indent=1))
    return summary


if __name__ == "__main__":
    main()
