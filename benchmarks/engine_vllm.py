"""vLLM's side of ``benchmarks/engine_bench.py`` (issue 36): a local vLLM CPU server on the same weights, sampled
through ``VLLMPolicy`` (token ids in, token ids out), and part (d), a long-prompt multi-turn workload on the search
env where prefix caching matters.

(d) ``search``: the search env's expert plays ``--search-episodes`` episodes (a long system prompt with four tool
    schemas, search results of up to a few hundred tokens per turn). Every engine is then asked, for each episode
    and each of its assistant turns in order, for ``--group-size`` samples of that turn from the exact context the
    expert had (episodes concurrently, turns one after another, as in a GRPO step's rollouts): every turn extends
    the previous turn's context, and a group shares its whole prompt. Prints turns/s, sampled tokens/s and the
    prompt tokens per turn.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from taskrl.policies.base import SamplingParams
from taskrl.types import Message


@contextmanager
def vllm_engine(model_dir: Path, chat_format: Any, *, dtype: str, threads: str, max_model_len: int = 0):
    """A local vLLM server on ``model_dir`` and a ``VLLMPolicy`` on it; the server is stopped on exit.
    ``max_model_len`` 0: the model's own positions (SmolLM2: 8192), as the in-process engine has them; (d)'s
    longest search turns pass 4,096 tokens."""
    from taskrl.policies.vllm import VLLMPolicy
    from taskrl.policies.vllm_server import VLLMServer, VLLMServerConfig

    # the server's log outlives the run: a server that dies mid-benchmark (once, in (d)) must say why
    if not max_model_len:
        config_json = json.loads((Path(model_dir) / "config.json").read_text())
        max_model_len = int(config_json.get("max_position_embeddings", 4096))
    handle, log = tempfile.mkstemp(prefix="taskrl-bench-vllm-", suffix=".log")
    os.close(handle)
    config = VLLMServerConfig(
        model=str(model_dir), dtype=dtype, threads=threads, max_model_len=max_model_len, enable_lora=False,
        extra_args=["--logprobs-mode", "processed_logprobs"], log_path=log,
    )  # fmt: skip
    started = time.perf_counter()
    with VLLMServer(config) as server:
        print(f"vLLM server up in {time.perf_counter() - started:.0f} s ({dtype}, threads {threads}); log {log}",
              flush=True)  # fmt: skip
        policy = VLLMPolicy(server.base_url, server.served_model, chat_format, max_positions=max_model_len)
        try:
            yield policy
        finally:
            asyncio.run(policy.aclose())


def save_for_vllm(policy: Any, where: Path | None) -> Path:
    """The HF policy's current weights as a directory vLLM can load (merged if LoRA)."""
    if where is not None and (where / "config.json").is_file():
        return where
    out = Path(where or tempfile.mkdtemp(prefix="taskrl-bench-model-"))
    model = policy.model.merge_and_unload() if hasattr(policy.model, "merge_and_unload") else policy.model
    model.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    return out


# -- (d) long prompts, many turns ------------------------------------------------------------------
async def _sample_turns(
    policy: Any, prompts: list[list[list[int]]], group: int, new_tokens: int
) -> list[tuple[int, int]]:
    """Episodes concurrently; within one, its turns in order, each sampled ``group`` times at once."""

    async def episode(turns: list[list[int]], index: int) -> tuple[int, int]:
        sampled = 0
        for turn, ids in enumerate(turns):
            seeds = [index * 1000 + turn * 10 + k for k in range(group)]
            samples = [SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=seed) for seed in seeds]
            done = await asyncio.gather(*(policy.generate(token_ids=ids, sampling=s) for s in samples))
            sampled += sum(len(c.token_ids) for c in done)
        return sampled, len(turns) * group

    return await asyncio.gather(*(episode(p, i) for i, p in enumerate(prompts)))


def expert_contexts(n_episodes: int) -> list[list[list[Message]]]:
    """For each of the search expert's episodes: the message context before each of its assistant turns."""
    from taskrl.env import make
    from taskrl.policies.scripted import ScriptedPolicy
    from taskrl.rollout import RolloutConfig, run_episodes

    env = make("search")
    tasks = list(env.tasks())[:n_episodes]
    config = RolloutConfig(max_turns=8, group_size=1, concurrency=n_episodes, seed=0)
    expert = ScriptedPolicy(env.scripted_rule, name="expert")
    trajs = asyncio.run(run_episodes(lambda: make("search"), expert, tasks, config))
    contexts = []
    for t in trajs:
        turns = [i for i, m in enumerate(t.messages) if m.role == "assistant"]
        contexts.append([list(t.messages[:i]) for i in turns])
    return contexts


def search_part(engines: dict[str, Any], tools: list[dict[str, Any]], contexts: list[list[list[Message]]],
                args: Any) -> dict[str, Any]:  # fmt: skip
    """(d): every engine samples every expert turn ``group_size`` times, turn after turn within an episode."""
    results: dict[str, Any] = {}
    for name, policy in engines.items():
        fmt = policy.chat_format
        prompts = [[fmt.prompt_ids(messages, tools) for messages in episode] for episode in contexts]

        start = time.perf_counter()
        done = asyncio.run(_sample_turns(policy, prompts, args.group_size, args.search_new_tokens))
        wall = time.perf_counter() - start
        sampled, turns = sum(s for s, _ in done), sum(n for _, n in done)
        lengths = [len(ids) for ep in prompts for ids in ep]
        results[name] = {
            "wall_s": wall, "turns": turns, "turns_per_s": turns / wall, "sampled_tokens_per_s": sampled / wall,
            "prompt_tokens_mean": statistics.fmean(lengths), "prompt_tokens_max": max(lengths),
        }  # fmt: skip
        print(f"  {name}: {wall:.1f} s", flush=True)
    print(f"\n(d) search env, {len(contexts)} expert episodes x their turns x {args.group_size} samples, "
          f"<= {args.search_new_tokens} tokens, T=1")  # fmt: skip
    print(f"{'engine':12} {'wall s':>7} {'turns':>6} {'turns/s':>8} {'tok/s':>7} {'prompt mean':>11} {'max':>6}")
    for name, r in results.items():
        print(f"{name:12} {r['wall_s']:7.1f} {r['turns']:6d} {r['turns_per_s']:8.3f} {r['sampled_tokens_per_s']:7.1f} "
              f"{r['prompt_tokens_mean']:11.0f} {r['prompt_tokens_max']:6d}")  # fmt: skip
    return results


async def fixed_length(policy: Any, prompt: list[int], n: int, seed: int) -> None:
    """Exactly ``n`` sampled tokens from vLLM (``ignore_eos``), as the arrival trace asks of every engine."""
    body = {"model": policy.model, "prompt": prompt, "max_tokens": n, "min_tokens": n, "ignore_eos": True,
            "temperature": 1.0, "seed": seed, "return_token_ids": True}  # fmt: skip
    data = await policy._post("/completions", body)
    got = len(data["choices"][0]["token_ids"])
    if got != n:
        raise RuntimeError(f"vLLM sampled {got} tokens, asked for exactly {n}")
