"""The full real-time RL cycle on CPU with a tiny model, users talking to the real server with the openai client.

Simulated users accept an answer when most of its tokens have even ids (a hidden criterion the policy can
learn, as in tests/test_trainer_learning.py) and rate it by that share. Each cycle: users chat -> feedback ->
train from the store -> gate on an eval suite -> activate. The promoted policy must be accepted more often.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import openai
import torch

from taskrl.deploy.config import ServeConfig
from taskrl.deploy.cycle import CycleConfig, ProductionCycle
from taskrl.deploy.gate import GateConfig
from taskrl.deploy.router import RouterConfig
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.base import Policy, SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.training.config import config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.types import Message

PROMPTS = [f"Say something about {w}." for w in ("cats", "dogs", "tea", "rain")]
MAX_TOKENS = 4


def even_share(token_ids: list[int]) -> float:
    return sum(t % 2 == 0 for t in token_ids) / max(len(token_ids), 1)


async def users(oa: openai.AsyncOpenAI, base_url: str, cycle: int, per_prompt: int = 8) -> None:
    """Each user asks once, judges the answer by the hidden criterion, and sends feedback."""

    async def one(prompt: str, k: int) -> None:
        reply = await oa.chat.completions.create(
            model="agent",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=cycle * 1000 + k * 10 + PROMPTS.index(prompt),
            extra_body={"return_token_ids": True},
            extra_headers={"x-session-id": f"c{cycle}-{prompt}-{k}"},
        )
        share = even_share(reply.choices[0].model_extra["token_ids"])
        feedback = [("accepted" if share >= 0.75 else "rejected", None), ("rating", 1 + 4 * share)]
        for kind, value in feedback:
            body = {"interaction_id": reply.id, "kind": kind, "value": value}
            await oa.post("/feedback", body=body, cast_to=object)

    await asyncio.gather(*(one(p, k) for p in PROMPTS for k in range(per_prompt)))


async def even_suite(policy: Policy) -> dict[str, list[float]]:
    assert policy.chat_format is not None
    scores = []
    for i, prompt in enumerate(PROMPTS):
        ids = policy.chat_format.prompt_ids([Message("user", prompt)], None)
        for k in range(8):
            sampling = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=1.0, seed=10_000 + i * 100 + k)
            scores.append(even_share((await policy.generate(token_ids=ids, sampling=sampling)).token_ids))
    return {"even_share": scores}


def acceptance(store: InteractionStore, version: int) -> float:
    ids = {r.id for r in store.interactions(include_shadow=False) if r.policy_version == version}
    kinds = [f.kind for f in store.feedback() if f.interaction_id in ids and f.kind in ("accepted", "rejected")]
    return kinds.count("accepted") / len(kinds)


async def test_cycle_promotes_a_policy_users_accept_more(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=1)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)  # prefer a few dozen tokens, as a pretrained model does
    served = HFPolicy(copy.deepcopy(model), tokenizer, device="cpu")
    train_config = config_from_dict({"run_dir": str(tmp_path / "run"), "algo.name": "grpo", "finetune": "full",
                                     "freeze": ["layers",
                                                "norm"], "lr": 1e-2, "rollout.group_size": 8,
                                                "rollout.max_new_tokens": MAX_TOKENS, "progress": False})  # fmt: skip
    learner = Learner(prepare_model(model, train_config), train_config, pad_id=tokenizer.pad_token_id or 0)
    config = ServeConfig(api_keys={"user-key": "users"}, router=RouterConfig(holdout=0.0))
    cycle_config = CycleConfig(
        min_trajectories=16, max_staleness=0, updates_per_cycle=2, rollout="activate",
        gate=GateConfig(margin=0.05, n_boot=500),
    )  # fmt: skip
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}", sqlite_synchronous="NORMAL") as store:
        app = create_app({"agent": served}, store=store, config=config)
        router = app.state.routers["agent"]
        cycle = ProductionCycle(learner, tokenizer, router, store, cycle_config, {"users": even_suite})
        with running_server(app) as base_url:
            oa = openai.AsyncOpenAI(base_url=base_url, api_key="user-key", max_retries=0, timeout=60)
            reports: list[dict[str, Any]] = []
            for c in range(4):
                await users(oa, base_url, c)
                reports.append(await cycle.run_once())
            await users(oa, base_url, 99, per_prompt=16)
            await oa.close()
        first, promoted = acceptance(store, 0), acceptance(store, router.stable)
        decisions = [d.kind for d in store.decisions()]
    for policy in router.versions.values():
        policy.close()
    assert router.stable > 0, reports
    assert promoted > first + 0.15, (first, promoted, [r.get("gate", {}).get("reason") for r in reports])
    assert "promote" in decisions
    assert all(r["data"]["used"] >= 16 for r in reports)
