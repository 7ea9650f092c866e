"""Constrained decoding of a forced tool call (issue 38.3): whatever the model would say, the turn is one valid
Hermes call to one of the given names, closed within the token budget. A tiny random model's output is garbage,
so the constraint does all the work; logprobs stay those ``logprobs_of`` scores (the learner's ratio is 1)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from taskrl.parsing import parse_hermes
from taskrl.policies.base import InvalidRequestError, SamplingParams
from taskrl.policies.constrain import tool_call_constraint
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import smollm2_tokenizer, tiny_model
from taskrl.types import Message

NAMES = ["get_weather", "get_time", "get"]


def minimum() -> int:
    tokenizer = smollm2_tokenizer()
    return tool_call_constraint(tokenizer, [tokenizer.eos_token_id], NAMES).min_tokens()


def walk(seed: int, budget: int, names: list[str]) -> tuple[str, bool]:
    """A random walk over the allowed tokens (a model that says anything); (text, ended with end-of-turn)."""
    tokenizer = smollm2_tokenizer()
    stop = [tokenizer.eos_token_id]
    constraint = tool_call_constraint(tokenizer, stop, names)
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < budget:
        allowed = constraint.allowed(budget - len(ids)).tolist()
        token = rng.choice(allowed)
        ids.append(token)
        if token in stop:
            return tokenizer.decode(ids[:-1]), True
        constraint.advance(token)
    return tokenizer.decode(ids), False


@pytest.mark.parametrize("seed", range(60))
def test_any_walk_of_allowed_tokens_is_one_valid_call(seed: int) -> None:
    budget = random.Random(seed).choice([minimum(), minimum() + 1, 24, 40, 80, 300])
    text, ended = walk(seed, budget, NAMES)
    assert ended, text  # closed within the budget, end-of-turn included
    turn = parse_hermes(text)
    assert len(turn.tool_calls) == 1 and not turn.invalid and turn.content == "", text
    call = turn.tool_calls[0]
    assert call.name in NAMES and isinstance(call.arguments, dict)
    body = text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
    assert json.loads(body)["name"] == call.name  # the whole block is JSON, not just what the parser tolerated


def run(policy: HFPolicy, sampling: SamplingParams) -> object:
    prompt = policy.chat_format.prompt_ids([Message("user", "what is the weather in Paris?")], None)
    return asyncio.run(policy.generate(token_ids=prompt, sampling=sampling)), prompt


@pytest.mark.parametrize("temperature", [0.0, 1.0, 1.5])
def test_a_random_model_forced_to_call_makes_one_valid_call(temperature: float) -> None:
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu")
    try:
        for seed in range(3):
            sampling = SamplingParams(max_new_tokens=64, temperature=temperature, seed=seed,
                                      force_tool_call=("get_weather", "get_time"))  # fmt: skip
            completion, prompt = run(policy, sampling)
            turn = parse_hermes(completion.text)
            assert len(turn.tool_calls) == 1 and not turn.invalid, completion.text
            assert turn.tool_calls[0].name in ("get_weather", "get_time")
            assert completion.finish_reason == "stop"
            scored = policy.logprobs_of(prompt + completion.token_ids, temperature=temperature or 1.0)
            assert scored[len(prompt) :] == pytest.approx(completion.logprobs, abs=1e-4)  # unconstrained logprobs
        free, _ = run(policy, SamplingParams(max_new_tokens=64, temperature=1.0, seed=0))
        assert not parse_hermes(free.text).tool_calls  # without the constraint the random model calls nothing
        with pytest.raises(InvalidRequestError, match="forced tool call"):
            run(policy, SamplingParams(max_new_tokens=minimum() - 1, force_tool_call=tuple(NAMES)))
        tight, _ = run(policy, SamplingParams(max_new_tokens=minimum(), force_tool_call=tuple(NAMES), seed=1))
        assert len(parse_hermes(tight.text).tool_calls) == 1 and len(tight.token_ids) <= minimum()
    finally:
        policy.close()


def test_each_request_ends_on_its_own_end_of_turn_ids() -> None:
    """The per-tokenizer vocabulary is shared; the end-of-turn ids are the request's. A constraint built earlier with
    other stop ids (a chat format's) once fixed them for every later request on that tokenizer."""
    tokenizer = smollm2_tokenizer()
    other = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert other != tokenizer.eos_token_id
    first = tool_call_constraint(tokenizer, [other], NAMES)
    second = tool_call_constraint(tokenizer, [tokenizer.eos_token_id], NAMES)
    assert first.vocab is second.vocab  # the expensive table is still built once
    for constraint, stop in ((first, other), (second, tokenizer.eos_token_id)):
        constraint.phase = "done"
        assert constraint.allowed(4).tolist() == [stop]
