"""HFPolicy: batching must not change samples, logprobs must match a full forward, stops and limits hold."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from taskrl.policies.base import Policy, PolicyError, SamplingParams
from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.policies.sampling import sample_row
from taskrl.types import Message

TOL = 1e-4


def prompts(tokenizer, n: int) -> list[list[int]]:
    # Different lengths, so batching has to left-pad.
    return [tokenizer.encode("The quick brown fox " * (i + 1) + f"number {i}") for i in range(n)]


def max_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


async def greedy(policy: HFPolicy, prompt: list[int], n: int = 12):
    return await policy.generate(token_ids=prompt, sampling=SamplingParams(max_new_tokens=n, temperature=0))


def test_satisfies_policy_protocol(hf_policy):
    assert isinstance(hf_policy, Policy)
    assert hf_policy.version == 0
    assert hf_policy.tokenizer.eos_token_id in hf_policy.chat_format.stop_token_ids


async def test_batched_equals_one_at_a_time(hf_policy, tiny):
    params = [
        SamplingParams(max_new_tokens=16, temperature=0),
        SamplingParams(max_new_tokens=16, temperature=1.0, seed=1),
        SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=2),
        SamplingParams(max_new_tokens=16, temperature=1.3, top_k=40, seed=3),
        SamplingParams(max_new_tokens=5, temperature=0.5, top_k=20, top_p=0.8, seed=4),
        SamplingParams(max_new_tokens=9, temperature=0),
    ]
    ids = prompts(tiny[1], len(params))
    batched = await asyncio.gather(
        *(hf_policy.generate(token_ids=p, sampling=s) for p, s in zip(ids, params, strict=True))
    )
    for prompt, sampling, together in zip(ids, params, batched, strict=True):
        alone = await hf_policy.generate(token_ids=prompt, sampling=sampling)
        if hf_policy.engine_config.engine == "static":
            assert together.info["batch_size"] == len(params)
        elif sampling.max_new_tokens <= hf_policy.engine_config.priority_tokens:  # the short requests' own lane
            assert 1 <= together.info["batch_size"] <= len(params)
        else:  # rows join and leave step by step: they shared some steps, never more than all of them
            assert 1 < together.info["batch_size"] <= len(params)
        assert alone.info["batch_size"] == 1
        assert together.token_ids == alone.token_ids
        assert len(together.token_ids) == sampling.max_new_tokens
        assert max_abs_diff(together.logprobs, alone.logprobs) < TOL
        assert together.prompt_token_ids == prompt


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=20, temperature=0),
        SamplingParams(max_new_tokens=20, temperature=0.6, top_p=0.95, seed=7),
        SamplingParams(max_new_tokens=20, temperature=1.5, top_k=10, seed=8),
    ],
)
async def test_logprobs_match_full_forward(hf_policy, tiny, sampling):
    prompt = prompts(tiny[1], 1)[0]
    completion = await hf_policy.generate(token_ids=prompt, sampling=sampling)
    temperature = sampling.temperature or 1.0
    recomputed = hf_policy.logprobs_of(prompt + completion.token_ids, temperature=temperature)
    assert len(recomputed) == len(prompt) + len(completion.token_ids)
    assert recomputed[0] == 0.0
    assert max_abs_diff(recomputed[len(prompt) :], completion.logprobs) < TOL
    assert all(lp <= 0 for lp in completion.logprobs)


async def test_stop_token_is_included(hf_policy, tiny):
    prompt = prompts(tiny[1], 1)[0]
    hf_policy.chat_format.stop_token_ids = set()
    reference = (await greedy(hf_policy, prompt, 12)).token_ids
    # The first token (past the first) not seen before: generation must stop exactly there.
    k = next(i for i in range(1, len(reference)) if reference[i] not in reference[:i])
    hf_policy.chat_format.stop_token_ids = {reference[k]}
    completion = await greedy(hf_policy, prompt, 12)
    assert completion.token_ids == reference[: k + 1]
    assert completion.finish_reason == "stop"
    assert len(completion.logprobs) == k + 1


async def test_stop_string(hf_policy, tiny):
    prompt = prompts(tiny[1], 1)[0]
    hf_policy.chat_format.stop_token_ids = set()
    reference = (await greedy(hf_policy, prompt, 12)).token_ids
    decode = hf_policy.chat_format.decode
    stop = next(decode(reference[: i + 1])[-2:] for i in range(3, 12) if decode(reference[: i + 1]).strip())
    completion = await hf_policy.generate(
        token_ids=prompt, sampling=SamplingParams(max_new_tokens=12, temperature=0, stop=[stop])
    )
    assert completion.finish_reason == "stop"
    assert completion.info["stop"] == stop
    assert completion.token_ids == reference[: len(completion.token_ids)]
    assert stop in completion.text
    assert stop not in decode(completion.token_ids[:-1])


async def test_max_new_tokens_gives_length(hf_policy, tiny):
    hf_policy.chat_format.stop_token_ids = set()
    completion = await greedy(hf_policy, prompts(tiny[1], 1)[0], 5)
    assert len(completion.token_ids) == 5
    assert completion.finish_reason == "length"
    assert completion.text == hf_policy.chat_format.decode(completion.token_ids)


async def test_top_k_one_and_tiny_top_p_equal_greedy(hf_policy, tiny):
    prompt = prompts(tiny[1], 1)[0]
    reference = await greedy(hf_policy, prompt, 10)
    for sampling in (
        SamplingParams(max_new_tokens=10, temperature=1.0, top_k=1, seed=5),
        SamplingParams(max_new_tokens=10, temperature=1.0, top_p=1e-6, seed=6),
    ):
        completion = await hf_policy.generate(token_ids=prompt, sampling=sampling)
        assert completion.token_ids == reference.token_ids
        # Greedy logprobs are those of the temperature-1 distribution, like these samples'.
        assert max_abs_diff(completion.logprobs, reference.logprobs) < TOL


async def test_seeds_reproduce_and_are_recorded(hf_policy, tiny):
    prompt = prompts(tiny[1], 1)[0]

    async def sample(seed):
        sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed)
        return await hf_policy.generate(token_ids=prompt, sampling=sampling)

    first, again, other, unseeded = await sample(11), await sample(11), await sample(12), await sample(None)
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids
    assert isinstance(unseeded.info["seed"], int)
    assert (await sample(unseeded.info["seed"])).token_ids == unseeded.token_ids


def test_temperature_validation(hf_policy):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-0.5)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        hf_policy.logprobs_of([1, 2, 3], temperature=0.0)


async def test_messages_mode(hf_policy):
    messages = [Message("user", "What is 2 + 2?")]
    completion = await hf_policy.generate(messages=messages, sampling=SamplingParams(max_new_tokens=4, seed=0))
    assert completion.prompt_token_ids == hf_policy.chat_format.prompt_ids(messages)
    # Given both (as the agent loop does), the exact token ids win.
    both = await hf_policy.generate(token_ids=[1, 2, 3], messages=messages, sampling=SamplingParams(max_new_tokens=2))
    assert both.prompt_token_ids == [1, 2, 3]
    with pytest.raises(PolicyError, match="needs token_ids or messages"):
        await hf_policy.generate(sampling=SamplingParams())


async def test_bad_prompts_fail_alone(hf_policy, tiny):
    sampling = SamplingParams(max_new_tokens=3, temperature=0)
    with pytest.raises(PolicyError, match="empty prompt"):
        await hf_policy.generate(token_ids=[], sampling=sampling)
    with pytest.raises(PolicyError, match="outside the model's vocabulary"):
        await hf_policy.generate(token_ids=[1, hf_policy.vocab_size], sampling=sampling)
    with pytest.raises(PolicyError, match="no room"):
        await hf_policy.generate(token_ids=[1] * hf_policy.max_positions, sampling=sampling)
    # A prompt that nearly fills the context is cut short with "length", not an error.
    hf_policy.chat_format.stop_token_ids = set()
    near_full = await hf_policy.generate(token_ids=[1] * (hf_policy.max_positions - 2), sampling=sampling)
    assert (len(near_full.token_ids), near_full.finish_reason) == (2, "length")


async def test_batches_respect_max_batch_size_and_cancellation(tiny):
    policy = HFPolicy(*tiny, device="auto", engine_config=EngineConfig(max_batch_size=2))
    try:
        sampling = SamplingParams(max_new_tokens=4, temperature=0)
        ids = prompts(tiny[1], 5)
        tasks = [asyncio.create_task(policy.generate(token_ids=p, sampling=sampling)) for p in ids]
        tasks[1].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[1], asyncio.CancelledError)
        for prompt, completion in zip(ids, done, strict=True):
            if isinstance(completion, BaseException):
                continue
            assert completion.info["batch_size"] <= 2
            assert completion.token_ids == (await greedy(policy, prompt, 4)).token_ids
    finally:
        policy.close()


async def test_event_loop_stays_free(hf_policy, tiny):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    hf_policy.chat_format.stop_token_ids = set()
    await greedy(hf_policy, prompts(tiny[1], 1)[0], 64)
    task.cancel()
    assert ticks > 0


async def test_version_is_stamped(hf_policy, tiny):
    hf_policy.version = 3
    assert (await greedy(hf_policy, prompts(tiny[1], 1)[0], 2)).policy_version == 3


async def test_from_pretrained_local_dir(tmp_path, tiny, hf_policy):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = HFPolicy.from_pretrained(tmp_path, device="auto")
    try:
        prompt = prompts(tokenizer, 1)[0]
        assert (await greedy(loaded, prompt)).token_ids == (await greedy(hf_policy, prompt)).token_ids
        assert loaded.name == tmp_path.name
    finally:
        loaded.close()


def test_from_pretrained_missing_dir_names_path_and_fix(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(PolicyError, match="no-such-model") as info:
        HFPolicy.from_pretrained(missing)
    assert "smollm2" in str(info.value)


@pytest.mark.parametrize(
    ("top_k", "top_p", "expected"),
    [(0, 1.0, [0.5, 0.3, 0.2]), (2, 1.0, [0.625, 0.375, 0.0]), (0, 0.6, [0.625, 0.375, 0.0])],
)
def test_sampler_frequencies(top_k, top_p, expected):
    logp = torch.tensor([0.5, 0.3, 0.2]).log()
    sampling = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
    generator = torch.Generator().manual_seed(0)
    request = SimpleNamespace(sampling=sampling, generator=generator)
    draws = torch.cat([sample_row(logp, request) for _ in range(4000)])
    frequencies = torch.bincount(draws, minlength=3).float() / len(draws)
    assert torch.allclose(frequencies, torch.tensor(expected), atol=0.03)
