"""MixturePolicy: the learned share follows the schedule, routing is replayable, arms are recorded."""

from __future__ import annotations

from taskrl.algos.schedules import Linear
from taskrl.policies.base import Policy, SamplingParams
from taskrl.policies.mixture import MixturePolicy
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.types import Message


async def test_traffic_shifts_from_guide_to_learned() -> None:
    guide = ScriptedPolicy(lambda m, t: "rule", name="guide")
    learned = ScriptedPolicy(lambda m, t: "model", name="learned")
    mixture = MixturePolicy(guide, learned, Linear(0.0, 1.0, steps=4))
    assert isinstance(mixture, Policy)
    messages = [Message("user", "hi")]
    shares = []
    for step in range(5):
        mixture.set_step(step)
        texts = [(await mixture.generate(messages=messages, sampling=SamplingParams(seed=i))).text for i in range(400)]
        shares.append(texts.count("model") / 400)
    assert shares[0] == 0.0 and shares[-1] == 1.0
    assert all(abs(s - step / 4) < 0.08 for step, s in enumerate(shares))
    mixture.set_step(2)
    again = await mixture.generate(messages=messages, sampling=SamplingParams(seed=7))
    first = await mixture.generate(messages=messages, sampling=SamplingParams(seed=7))
    assert again.text == first.text and again.info["mixture_arm"] in ("guide", "learned")
    learned.version = 3
    assert (
        mixture.version == 3
        and (await mixture.generate(messages=messages, sampling=SamplingParams())).policy_version == 3
    )
