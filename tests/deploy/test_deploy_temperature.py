"""Issue 16 item 5: production rows are scored at the temperature they were served at.

Rows sampled at T=0.3 through the real server are turned into trajectories whose segments carry T=0.3, and the
learner (configured at T=1) scores each row at its own temperature: on the unchanged policy the first update's
importance weights are 1. Without the per-row temperature they are not (the reported 0.82).
"""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import openai

from taskrl.deploy.config import ServeConfig
from taskrl.deploy.dataset import trajectories_from_store
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.training.config import config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.types import Trajectory


def first_is_weight(model: object, trajectories: list[Trajectory], tmp_path: Path, pad_id: int) -> float:
    config = config_from_dict({"run_dir": str(tmp_path / "run"), "algo.name": "grpo", "finetune": "full",
                               "rollout.group_size": 8, "lr": 1e-6, "rollout.temperature": 1.0,
                               "progress": False})  # fmt: skip
    learner = Learner(prepare_model(copy.deepcopy(model), config), config, pad_id=pad_id)
    return float(learner.update(trajectories, step=0)["losses/is_weight"])


def test_rows_served_at_t03_have_unit_importance_weights(tmp_path: Path, store_url: str) -> None:
    model, tokenizer = tiny_model(seed=0)
    served = HFPolicy(copy.deepcopy(model), tokenizer, device="cpu")
    with InteractionStore(store_url) as store:  # the sampling record round-trips through SQLite and PostgreSQL
        app = create_app({"tiny": served}, store=store, config=ServeConfig(api_keys={"k": "t"}))
        with running_server(app) as url:
            oa = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=120)
            for i in range(8):
                reply = oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                                   max_tokens=6, temperature=0.3, seed=i)  # fmt: skip
                kind = "accepted" if i % 2 else "rejected"
                httpx.post(url + "/feedback", json={"interaction_id": reply.id, "kind": kind},
                           headers={"Authorization": "Bearer k"}).raise_for_status()  # fmt: skip
        trajectories, stats = trajectories_from_store(store)
    assert stats.used == 8
    assert {s.temperature for t in trajectories for s in t.segments} == {0.3}
    weight = first_is_weight(model, trajectories, tmp_path, tokenizer.pad_token_id)
    assert abs(weight - 1.0) < 1e-3, weight
    for t in trajectories:  # the same rows scored at the trainer's T=1 instead: the reported mismatch
        for s in t.segments:
            s.temperature = None
    assert abs(first_is_weight(model, trajectories, tmp_path, tokenizer.pad_token_id) - 1.0) > 0.02
    again = Trajectory.from_dict(trajectories[0].to_dict())  # the field round-trips; old rows read as None
    assert again.segments[0].temperature is None
    old = trajectories[0].to_dict()
    for segment in old["segments"]:
        segment.pop("temperature")
    assert Trajectory.from_dict(old).segments[0].temperature is None
