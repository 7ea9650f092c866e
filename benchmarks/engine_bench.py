"""Rollout engine benchmark (issue 13): HFPolicy's continuous engine vs its static engine vs transformers
``generate`` one request at a time, side by side in one run, on SmolLM2-135M-Instruct.

Engines: ``continuous`` (the default engine: prompt-lookup drafts, the fast forward on CPU, and in (b) the
priority lane for short requests), ``continuous_hf`` (the same engine on transformers' forward),
``continuous_plain`` (transformers' forward, ``draft_tokens=0`` and ``priority_tokens=0``), ``static``,
``static_before`` (in (c): the static engine and the learner as they were before issue 13, without the step's
shared-prompt pass; elsewhere the same as ``static``), ``generate``, and ``vllm`` (issue 36: a local vLLM CPU
server on the same weights, sampled token-in/token-out through ``VLLMPolicy``; ``benchmarks/engine_vllm.py``).
``--rounds N`` plays (a) N times, the engine order reversed every other round, so machine load drifting during the
run falls on every engine alike.
(a) and (c) use the trainer's "throughput" schedule, (b) the "latency" schedule of ``taskrl serve``.

(a) ``grpo``: a GRPO step's rollouts on the ``shop`` env: 4 tasks x 4 samples = 16 episodes of up to 5 turns,
    temperature 1, the same seeds for every engine. Prints episodes/s, sampled tokens/s, prompt tokens the
    engine computed (prefill), p50/p95 seconds per turn, and whether the episodes equal the continuous engine's.
(b) ``trace``: requests arriving every 100 ms, long (a ~300-token prompt, 48 new tokens) and short (a ~20-token
    prompt, 6 new tokens) mixed; p50/p95 latency, and a short request's latency under load vs alone.
(c) ``demo``: ``make demo``'s GRPO arm (``recipes/demo.toml`` from the ``recipes/demo_sft.toml`` warm start, as
    the demo runs it) with each engine; per-step time, rollout time and training reward (seeded).

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/engine_bench.py --part grpo trace [--device auto]
    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/engine_bench.py --part demo --demo-grpo-steps 2
    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/engine_bench.py --part grpo trace search demo \
        --engines continuous vllm --dtype bfloat16 --warm-start-cache runs/bench_warm --rounds 3

(d) ``search``: long prompts over many turns (``engine_vllm.search_part``), where prefix caching matters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import engine_vllm
import torch

from taskrl.env import make
from taskrl.policies.base import Completion, SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.memory import release_freed
from taskrl.policies.precision import weights_dtype
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.types import Message


def cpu_model() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    amx = "amx_bf16 present" if "amx_bf16" in Path("/proc/cpuinfo").read_text() else "no amx_bf16"
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    return f"{name}, {amx}, torch threads {torch.get_num_threads()}, load average {load}"


ENGINES = ("continuous", "continuous_hf", "continuous_plain", "static", "static_before", "generate", "vllm")


def use_engine(policy: HFPolicy, engine: str, schedule: str = "latency") -> None:
    """Switch ``policy`` to one of ``ENGINES`` (not ``generate``), cold: no KV from an earlier engine's run.
    ``schedule``: "throughput" as the trainer's rollouts use it, "latency" as ``taskrl serve`` does."""
    settings = policy.engine_config
    kind = "static" if engine.startswith("static") else "continuous"
    policy.engine_config = dataclasses.replace(settings, engine=kind, schedule=schedule)
    plain = engine == "continuous_plain"  # this engine without drafts and without a priority lane
    fast = settings.fast_forward
    on_by_default = fast is True or (fast == "auto" and policy.device.type == "cpu")
    policy._engine.fast.enabled = engine == "continuous" and on_by_default
    policy._engine.fast.invalidate()
    policy._engine.draft_tokens = 0 if plain else settings.draft_tokens
    policy._engine.priority_tokens = 0 if plain else settings.priority_tokens
    policy._engine.schedule = schedule
    policy.invalidate_kv_cache()


def release_engine_memory(policy: HFPolicy) -> None:
    """Hand the engines' KV buffers and freed heap back to the OS between runs (the machine is shared; glibc keeps
    freed blocks resident otherwise)."""

    def release() -> None:
        policy.invalidate_kv_cache()
        policy._engine._check_weights()  # empties the prefix cache
        policy._engine.prefilling.release()
        policy._engine.decoding.release()

    policy.run_exclusive(release)
    release_freed()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Timed:
    """Wraps a policy; records each turn's wall time."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.version, self.chat_format = inner.name, inner.version, inner.chat_format
        self.turn_s: list[float] = []

    async def generate(self, **kwargs: Any) -> Completion:
        start = time.perf_counter()
        completion = await self.inner.generate(**kwargs)
        self.turn_s.append(time.perf_counter() - start)
        return completion


class GeneratePolicy:
    """transformers ``model.generate``, one request at a time (the baseline without our engine).

    Seeds torch's global RNG per request and reports the logprobs of the temperature-scaled distribution
    from ``output_logits``; it runs on the HFPolicy's decode thread (one OpenMP team, as the engines do).
    """

    def __init__(self, policy: HFPolicy) -> None:
        self.policy = policy
        self.name, self.version, self.chat_format = policy.name, 0, policy.chat_format
        self.lock = asyncio.Lock()
        self.prefill_tokens = 0

    async def generate(self, *, token_ids: list[int], sampling: SamplingParams, **_: Any) -> Completion:
        async with self.lock:
            return await asyncio.to_thread(self.policy.run_exclusive, lambda: self._generate(token_ids, sampling))

    @torch.inference_mode()
    def _generate(self, token_ids: list[int], sampling: SamplingParams) -> Completion:
        policy = self.policy
        torch.manual_seed(sampling.seed or 0)
        ids = torch.tensor([token_ids], device=policy.device)
        greedy = sampling.temperature == 0
        out = policy.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy or not sampling.top_k else sampling.top_k,
            eos_token_id=sorted(policy.chat_format.stop_token_ids) or None,
            pad_token_id=policy._pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        new = out.sequences[0, len(token_ids) :].tolist()
        logits = torch.stack(out.logits)[:, 0].float() / (sampling.temperature or 1.0)
        logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(new, device=logits.device)[:, None])
        self.prefill_tokens += len(token_ids)
        stopped = bool(new) and new[-1] in policy.chat_format.stop_token_ids
        return Completion(
            text=policy.chat_format.decode(new),
            token_ids=new,
            logprobs=logprobs[:, 0].tolist(),
            finish_reason="stop" if stopped else "length",
            prompt_token_ids=list(token_ids),
        )


# -- (a) a GRPO step's rollouts --------------------------------------------------------------------
def grpo_once(
    policy: HFPolicy, engine: str, tasks: list[Any], config: RolloutConfig, args: argparse.Namespace
) -> tuple[dict[str, Any], list[list[int]]]:
    """One engine plays the GRPO step's episodes once: its row of table (a) and every episode's sampled tokens."""
    run_tasks = tasks
    if engine == "vllm":
        target: Any = args.vllm_policy
    elif engine == "generate":
        target = GeneratePolicy(policy)
        run_tasks = tasks[: max(1, args.generate_episodes // args.group_size)]  # it is slow: fewer episodes
    else:
        use_engine(policy, engine, "throughput")  # as the trainer's rollouts
        target = policy
    before = policy.engine_stats()
    timed = Timed(target)
    start = time.perf_counter()
    trajs = asyncio.run(run_episodes(lambda: make("shop"), timed, run_tasks, config))
    wall = time.perf_counter() - start
    after = policy.engine_stats()
    budget = policy._engine.draft_budget() if engine.startswith("continuous") else 0
    release_engine_memory(policy)
    if engine == "vllm":  # the in-process engine's counters did not move; vLLM's own are not read here
        after = before
    counters = ("prefill_tokens", "draft_tokens", "accepted_draft_tokens", "decode_forwards")
    counted = {k: after.get(k, 0) - before.get(k, 0) for k in counters}
    if engine == "generate":
        counted["prefill_tokens"] = target.prefill_tokens
    sampled = sum(t.num_sampled_tokens for t in trajs)
    turns = [t.metrics["turns"] for t in trajs]
    row = {
        "episodes": len(trajs),
        "mean_turns": statistics.fmean(turns),
        "wall_s": wall,
        "episodes_per_s": len(trajs) / wall,
        "sampled_tokens_per_s": sampled / wall,
        "sampled_tokens": sampled,
        **counted,
        "turns": len(timed.turn_s),
        "turn_p50_s": percentile(timed.turn_s, 0.5),
        "turn_p95_s": percentile(timed.turn_s, 0.95),
        "mean_reward": statistics.fmean(t.reward for t in trajs),
        "decode_token_budget": budget,
    }
    return row, [[tok for s in t.segments for tok in s.token_ids] for t in trajs]


def mean_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' mean of every number (the wall times of each round are kept too)."""
    out = {key: statistics.fmean(r[key] for r in results) for key in results[0]}
    out["episodes"] = results[0]["episodes"]
    out["round_wall_s"] = [r["wall_s"] for r in results]
    return out


def grpo_part(policy: HFPolicy, args: argparse.Namespace) -> dict[str, Any]:
    env = make("shop")
    tasks = list(env.tasks())[: args.tasks]
    config = RolloutConfig(
        max_turns=5,
        group_size=args.group_size,
        concurrency=args.tasks * args.group_size,
        sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0),
        seed=0,
    )
    runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in args.engines}
    episodes: dict[str, list[list[int]]] = {}
    for round_index in range(args.rounds):
        order = args.engines if round_index % 2 == 0 else list(reversed(args.engines))
        for engine in order:
            row, played = grpo_once(policy, engine, tasks, config, args)
            runs[engine].append(row)
            episodes.setdefault(engine, played)
            print(f"  round {round_index + 1} {engine}: {row['wall_s']:.1f} s", flush=True)
    rows = {engine: mean_row(results) for engine, results in runs.items()}
    reference = episodes.get("continuous")
    for engine, row in rows.items():
        if reference is not None:
            row["episodes_equal_continuous"] = sum(a == b for a, b in zip(episodes[engine], reference, strict=False))
    limits = f"<= 5 turns, <= {args.max_new_tokens} tokens/turn"
    print(f"\n(a) shop env, {args.tasks} tasks x {args.group_size} samples, {limits}")
    columns = [("episodes", 8), ("wall s", 7), ("ep/s", 6), ("tok/s", 6), ("prefill tok", 11), ("turns", 5)]
    columns += [("p50 s", 6), ("p95 s", 6)]
    print(f"{'engine':12} " + " ".join(f"{name:>{width}}" for name, width in columns) + f" {'same eps':>8}")
    for engine, r in rows.items():
        same = r.get("episodes_equal_continuous", "")
        print(
            f"{engine:12} {r['episodes']:8d} {r['wall_s']:7.1f} {r['episodes_per_s']:6.3f} "
            f"{r['sampled_tokens_per_s']:6.1f} {r['prefill_tokens']:11.0f} {r['turns']:5.0f} "
            f"{r['turn_p50_s']:6.2f} {r['turn_p95_s']:6.2f} {same!s:>8}"
        )
    for engine, r in rows.items():
        if r.get("draft_tokens"):
            print(
                f"{engine}: {r['accepted_draft_tokens']:.0f} of {r['draft_tokens']:.0f} drafts kept, "
                f"{r['decode_forwards']:.0f} decode forwards (decode budget {r['decode_token_budget']:.0f} positions); "
                f"wall s per round {r['round_wall_s']}"
            )
    if "continuous" in rows and "static" in rows:
        ratio = rows["continuous"]["episodes_per_s"] / rows["static"]["episodes_per_s"]
        print(f"continuous / static episodes/s: {ratio:.2f}x (target >= 3x: {'met' if ratio >= 3 else 'missed'})")
        per_round = [s / c for c, s in zip(rows["continuous"]["round_wall_s"], rows["static"]["round_wall_s"],
                                           strict=True)]  # fmt: skip
        print(f"  per round: {', '.join(f'{x:.2f}x' for x in per_round)}")
    for other, what in (("continuous_hf", "fast forward"), ("continuous_plain", "fast forward and drafts")):
        if other in rows and "continuous" in rows:
            ratio = rows["continuous"]["episodes_per_s"] / rows[other]["episodes_per_s"]
            print(f"continuous / {other} (what the {what} add) episodes/s: {ratio:.2f}x")
    return rows


# -- (b) an arrival trace --------------------------------------------------------------------------
def trace_part(policy: HFPolicy, args: argparse.Namespace) -> dict[str, Any]:
    fmt = policy.chat_format
    long_text = "Here is a log of the shop's orders today. " + " ".join(
        f"Order {i}: {i % 5 + 1} x apple, {i % 3 + 1} x pen." for i in range(24)
    )
    plan = []  # (arrival s, prompt ids, max_new_tokens, is_short)
    for i in range(args.trace_requests):
        short = i % 3 == 1
        text = f"What is {i} + {i}?" if short else f"{long_text} Summarise order {i}."
        plan.append((i * args.trace_gap_s, fmt.prompt_ids([Message("user", text)]), 6 if short else 48, short))
    stop_ids = fmt.stop_token_ids
    fmt.stop_token_ids = set()  # fixed lengths: every request decodes exactly its max_new_tokens
    results: dict[str, Any] = {}
    try:
        for engine in [e for e in args.engines if e != "generate"]:
            if engine != "vllm":
                use_engine(policy, engine)

            async def one(prompt: list[int], n: int, seed: int, engine: str = engine) -> float:
                start = time.perf_counter()
                if engine == "vllm":  # exactly n tokens too: vLLM would stop at the model's eos by itself
                    await engine_vllm.fixed_length(args.vllm_policy, prompt, n, seed)
                else:
                    await policy.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=n, seed=seed))
                return time.perf_counter() - start

            async def trace() -> list[float]:
                async def arrive(at: float, prompt: list[int], n: int, seed: int) -> float:
                    await asyncio.sleep(at)
                    return await one(prompt, n, seed)

                return await asyncio.gather(*(arrive(at, p, n, i) for i, (at, p, n, _) in enumerate(plan)))

            shorts = [(p, n, i) for i, (_, p, n, s) in enumerate(plan) if s]
            policy.invalidate_kv_cache()
            alone = [asyncio.run(one(p, n, i + 1000)) for p, n, i in shorts[:3]]  # other seeds: no cache help
            policy.invalidate_kv_cache()
            start = time.perf_counter()
            latencies = asyncio.run(trace())
            wall = time.perf_counter() - start
            short_lat = [lat for lat, (_, _, _, s) in zip(latencies, plan, strict=True) if s]
            long_lat = [lat for lat, (_, _, _, s) in zip(latencies, plan, strict=True) if not s]
            row = {
                "wall_s": wall,
                "p50_s": percentile(latencies, 0.5),
                "p95_s": percentile(latencies, 0.95),
                "short_p50_s": percentile(short_lat, 0.5),
                "short_p95_s": percentile(short_lat, 0.95),
                "short_alone_s": statistics.median(alone),
                "long_p50_s": percentile(long_lat, 0.5),
            }
            row["short_ratio"] = row["short_p50_s"] / row["short_alone_s"]
            results[engine] = row
            print(f"  {engine}: {wall:.1f} s", flush=True)
    finally:
        fmt.stop_token_ids = stop_ids
    n_short = sum(s for *_, s in plan)
    print(
        f"\n(b) arrival trace: {len(plan)} requests every {args.trace_gap_s * 1000:.0f} ms "
        f"({n_short} short: ~20-token prompt, 6 tokens; the rest ~300-token prompt, 48 tokens)"
    )
    columns = [("wall s", 7), ("p50 s", 6), ("p95 s", 6), ("short p50", 9), ("short p95", 9)]
    columns += [("alone", 6), ("ratio", 6), ("long p50", 8)]
    print(f"{'engine':12} " + " ".join(f"{name:>{width}}" for name, width in columns))
    for engine, r in results.items():
        print(
            f"{engine:12} {r['wall_s']:7.1f} {r['p50_s']:6.2f} {r['p95_s']:6.2f} {r['short_p50_s']:9.2f} "
            f"{r['short_p95_s']:9.2f} {r['short_alone_s']:6.2f} {r['short_ratio']:6.2f} {r['long_p50_s']:8.2f}"
        )
    if "continuous" in results:
        ratio = results["continuous"]["short_ratio"]
        verdict = "met" if ratio <= 2 else "missed"
        print(f"continuous: short request p50 under load / alone = {ratio:.2f}x (target <= 2x: {verdict})")
    return results


# -- (c) the demo's GRPO steps ---------------------------------------------------------------------
def demo_part(args: argparse.Namespace) -> dict[str, Any]:
    """``make demo``'s two recipes as the demo runs them: the SFT warm start (``recipes/demo_sft.toml``) once,
    merged into a checkpoint, then ``args.demo_grpo_steps`` steps of ``recipes/demo.toml`` from it with each
    engine (same tasks, same seeds: only the engine differs)."""
    from taskrl.commands.demo import RL_RECIPE, SFT_RECIPE, load_recipe
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    common = {"device": args.device, "resume": False, "progress": False}
    sft_recipe, rl_recipe = {**load_recipe(SFT_RECIPE), **common}, {**load_recipe(RL_RECIPE), **common}
    print(f"demo recipes: {SFT_RECIPE.name} {json.dumps(sft_recipe, default=str)}", flush=True)
    print(f"              {RL_RECIPE.name} {json.dumps(rl_recipe, default=str)}", flush=True)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        start_dir = Path(tmp) / "start"
        started = time.perf_counter()
        trainer = Trainer(config_from_dict({**sft_recipe, "run_dir": str(Path(tmp) / "sft")}))
        try:
            trainer.train()
            trainer.learner.model.merge_and_unload().save_pretrained(str(start_dir))
            trainer.learner_policy.chat_format.tokenizer.save_pretrained(str(start_dir))
        finally:
            trainer.close()
        print(f"warm start ({sft_recipe['steps']} SFT steps): {time.perf_counter() - started:.0f} s", flush=True)
        for engine in [e for e in args.engines if e != "generate"]:
            fields = {**rl_recipe, "model": str(start_dir), "run_dir": str(Path(tmp) / engine)}
            fields["steps"] = args.demo_grpo_steps
            if engine == "vllm":  # the trainer starts and supervises its own vLLM server on the warm start
                fields.update({"placement.rollout_policy": "vllm",
                               "placement.vllm": {"dtype": args.vllm_dtype, "threads": args.vllm_threads}})
            config = config_from_dict(fields)
            dtype, _ = weights_dtype(config.dtype, args.device)
            policy = HFPolicy.from_pretrained(config.model, device=args.device, dtype=dtype)
            if engine != "vllm":
                use_engine(policy, engine, "throughput")  # as the Trainer builds its own policy
            trainer = Trainer(config, policy=policy)
            if engine == "static_before":  # the learner before issue 13: each micro-batch runs its own prompt
                trainer.learner.step_prefix = False
            try:
                rows = trainer.train()
            finally:
                trainer.close()
                policy.close()
            out[engine] = {
                "step_s": [r["charts/step_time_s"] for r in rows],
                "rollout_s": [r["charts/rollout_time_s"] for r in rows],
                "update_s": [r["charts/update_time_s"] for r in rows],
                "reward": [r["rewards/total"] for r in rows],
            }
            print(f"  {engine}: {out[engine]}", flush=True)
    print(f"\n(c) make demo's GRPO arm ({RL_RECIPE.name}), {args.demo_grpo_steps} GRPO steps from its SFT warm start")
    print(f"{'engine':14} {'GRPO step s':>20} {'rollout s':>20} {'update s':>20} {'training reward':>24}")
    for engine, r in out.items():
        steps_s, rollout_s, update_s = (" ".join(f"{x:.1f}" for x in r[k]) for k in ("step_s", "rollout_s", "update_s"))
        rewards = " ".join(f"{x:.3f}" for x in r["reward"])
        print(f"{engine:14} {steps_s:>20} {rollout_s:>20} {update_s:>20} {rewards:>24}")
    comparisons = (("static", "static / continuous", "rollout_s"),
                   ("static_before", "before issue 13 (static engine, learner without the step prefix) / now",
                    "update_s"))  # fmt: skip
    for baseline, label, part in comparisons:
        if "continuous" not in out or baseline not in out:
            continue
        ratio, part_ratio = (sum(out[baseline][k]) / sum(out["continuous"][k]) for k in ("step_s", part))
        print(f"GRPO step time {label}: {ratio:.3f}x (target >= 2x: {'met' if ratio >= 2 else 'missed'}); "
              f"{part.removesuffix('_s')} time: {part_ratio:.2f}x")  # fmt: skip
        print(f"same training rewards: {out[baseline]['reward'] == out['continuous']['reward']}")
    if "continuous" in out and "vllm" in out:  # issue 36: the trainer's default is the faster of the two
        steps, rollout = (sum(out["vllm"][k]) / sum(out["continuous"][k]) for k in ("step_s", "rollout_s"))
        print(f"GRPO step time vLLM / in-process: {steps:.3f}x, rollout time {rollout:.3f}x "
              f"({'in-process' if steps > 1 else 'vLLM'} faster; first steps include each engine's warm-up)")
    return out


def warm_start(policy: HFPolicy, args: argparse.Namespace) -> None:
    """A few SFT steps on the shop env's expert (the demo's recipe): the base model never calls a tool, so
    its episodes would end after one turn; after this it plays multi-turn tool episodes, as in a GRPO step."""
    from taskrl.commands.demo import SFT_RECIPE, load_recipe
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as run_dir:
        fields = {**load_recipe(SFT_RECIPE), "env": "shop", "env_kwargs": {}, "rollout.max_turns": 5}
        fields.update(steps=args.warm_start_steps, run_dir=run_dir, device=str(policy.device), resume=False)
        fields.update(progress=False)
        trainer = Trainer(config_from_dict(fields), policy=policy)
        try:
            trainer.train()
        finally:
            trainer.close()
    if hasattr(policy.model, "merge_and_unload"):  # a LoRA warm start: decode the merged weights
        policy.model = policy.model.merge_and_unload()
    policy.model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", nargs="+", default=["grpo", "trace"], choices=["grpo", "trace", "demo", "search"])
    ap.add_argument("--engines", nargs="+", default=["continuous", "static", "generate"], choices=ENGINES)
    ap.add_argument("--rounds", type=int, default=1, help="plays of (a), the engine order reversed every other one")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--trace-requests", type=int, default=18)
    ap.add_argument("--trace-gap-s", type=float, default=0.1)
    ap.add_argument("--demo-grpo-steps", type=int, default=2)
    ap.add_argument("--warm-start-steps", type=int, default=3, help="SFT steps on shop's expert before (a)")
    ap.add_argument("--warm-start-cache", type=Path, help="load the warm start from here; make and save it if absent")
    ap.add_argument("--generate-episodes", type=int, default=4, help="episodes the one-at-a-time baseline plays")
    ap.add_argument("--threads", type=int, help="torch threads (1 is far faster on an oversubscribed machine)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="weights of (a) and (b)'s policy (the learning recipes and the demo roll out in bfloat16)",
    )
    ap.add_argument("--decode-token-budget", type=int, help="the continuous engine's (default: HFPolicy's)")
    ap.add_argument("--draft-tokens", type=int, help="the continuous engine's drafts per row (default: HFPolicy's)")
    ap.add_argument("--vllm-dtype", default="bfloat16", choices=["float32", "bfloat16"], help="the vLLM server's")
    ap.add_argument("--vllm-threads", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND of the vLLM server")
    ap.add_argument("--search-episodes", type=int, default=8, help="(d): expert episodes whose turns are sampled")
    ap.add_argument("--search-new-tokens", type=int, default=32, help="(d): tokens per sampled turn")
    args = ap.parse_args()
    if "trace" in args.part and args.trace_requests < 2:
        ap.error("--trace-requests must be >= 2 with --part trace (every third request, from the second, is the short "
                 f"one whose latency is measured), got {args.trace_requests}")  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"SmolLM2-135M-Instruct; {cpu_model()}", flush=True)
    results: dict[str, Any] = {"machine": cpu_model()}
    if {"grpo", "trace", "search"} & set(args.part):
        cached = args.warm_start_cache is not None and (args.warm_start_cache / "config.json").is_file()
        if args.dtype != "float32" and not cached and args.warm_start_steps:
            ap.error(
                "--dtype bfloat16 loads a made warm start: the warm start trains in float32, so make its "
                "--warm-start-cache with a float32 run first"
            )
        policy = HFPolicy.from_pretrained(
            args.warm_start_cache if cached else "smollm2", device=args.device, dtype=getattr(torch, args.dtype)
        )
        if args.decode_token_budget is not None:
            policy._engine.decode_token_budget = args.decode_token_budget
        if args.draft_tokens is not None:
            # use_engine hands it to the engine
            policy.engine_config = dataclasses.replace(policy.engine_config, draft_tokens=args.draft_tokens)
        print(
            f"device {policy.device}, weights {args.dtype}, decode budget "
            f"{args.decode_token_budget or 'default (drafts.DECODE_TOKEN_BUDGETS)'}, "
            f"drafts {policy.engine_config.draft_tokens}",
            flush=True,
        )
        try:
            if cached:
                print(f"warm start: loaded from {args.warm_start_cache}")
            elif args.warm_start_steps:
                started = time.perf_counter()
                warm_start(policy, args)
                print(f"warm start: {args.warm_start_steps} SFT steps in {time.perf_counter() - started:.0f} s")
                if args.warm_start_cache is not None:
                    policy.model.save_pretrained(args.warm_start_cache)
                    policy.tokenizer.save_pretrained(args.warm_start_cache)
                release_freed()  # the SFT step's activations: the machine is shared
            with contextlib.ExitStack() as stack:
                if "vllm" in args.engines:
                    model_dir = engine_vllm.save_for_vllm(policy, args.warm_start_cache)
                    args.vllm_policy = stack.enter_context(engine_vllm.vllm_engine(
                        model_dir, policy.chat_format, dtype=args.vllm_dtype, threads=args.vllm_threads))  # fmt: skip
                if "grpo" in args.part:
                    results["grpo"] = grpo_part(policy, args)
                if "trace" in args.part:
                    results["trace"] = trace_part(policy, args)
                if "search" in args.part:
                    contexts = engine_vllm.expert_contexts(args.search_episodes)
                    engines: dict[str, Any] = {}
                    for engine in [e for e in args.engines if e not in ("generate", "vllm")][:1]:
                        use_engine(policy, engine, "throughput")
                        engines[engine] = policy
                    if "vllm" in args.engines:
                        engines["vllm"] = args.vllm_policy
                    tools = make("search").tools.schemas()
                    results["search"] = engine_vllm.search_part(engines, tools, contexts, args)
        finally:
            policy.close()
    if "demo" in args.part:
        results["demo"] = demo_part(args)
    print(f"machine at the end: {cpu_model()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
