"""The continuous engine: joining mid-decode, KV reuse, eviction, weight changes and cancellation never change a
sample (same seed -> same tokens, logprobs within 1e-4 of a fresh full forward), and one bad request or row
never fails its neighbours."""

from __future__ import annotations

import asyncio
import copy
import gc
import math
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from taskrl.policies.base import InvalidRequestError, PolicyError, SamplingParams
from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.policies.kvcache import PrefixCache

TOL = 1e-4


def make_policy(tiny: tuple[Any, Any], *, own_weights: bool = False, **kwargs: Any) -> HFPolicy:
    model, tokenizer = tiny
    engine_config = EngineConfig(**kwargs)  # the engine settings under test
    policy = HFPolicy(copy.deepcopy(model) if own_weights else model, tokenizer, device="cpu",
                      engine_config=engine_config)
    policy.chat_format.stop_token_ids = set()  # every request decodes exactly max_new_tokens
    return policy


@pytest.fixture
def policy(tiny: tuple[Any, Any]) -> Iterator[HFPolicy]:
    p = make_policy(tiny)
    yield p
    p.close()


@pytest.fixture
def reference(tiny: tuple[Any, Any]) -> Iterator[HFPolicy]:
    """No KV reuse: every prompt prefilled from scratch, one request at a time."""
    p = make_policy(tiny, prefix_cache_bytes=0)
    yield p
    p.close()


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text)


def sampling(n: int, seed: int, temperature: float = 1.0, **kwargs: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=temperature, seed=seed, **kwargs)


def assert_exact(policy: HFPolicy, prompt: list[int], got: Any, expected: Any, temperature: float = 1.0) -> None:
    """Same tokens as ``expected``; logprobs equal to a fresh full forward pass within TOL."""
    assert got.token_ids == expected.token_ids
    full = policy.logprobs_of(prompt + got.token_ids, temperature=temperature)[len(prompt) :]
    assert max(abs(a - b) for a, b in zip(full, got.logprobs, strict=True)) < TOL


async def wait_until(condition: Any, timeout: float = 120.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.001)


async def test_join_mid_decode_is_exact(policy: HFPolicy, reference: HFPolicy, tiny: tuple[Any, Any]) -> None:
    long_prompt, short_prompt = ids(tiny[1], "A long story begins"), ids(tiny[1], "Meanwhile, elsewhere:")
    long_task = asyncio.create_task(policy.generate(token_ids=long_prompt, sampling=sampling(60, 1)))
    await wait_until(lambda: policy.engine_stats().get("decode_tokens", 0) >= 5)
    # 12 tokens: above the priority lane's 8, so it joins the running batch
    short = await policy.generate(token_ids=short_prompt, sampling=sampling(12, 2, 0.7, top_p=0.9))
    assert not long_task.done(), "the short request waited for the long one"
    assert short.info["batch_size"] == 2  # it decoded next to the long row
    long = await long_task
    assert_exact(
        policy,
        short_prompt,
        short,
        await reference.generate(token_ids=short_prompt, sampling=sampling(12, 2, 0.7, top_p=0.9)),
        0.7,
    )
    assert_exact(policy, long_prompt, long, await reference.generate(token_ids=long_prompt, sampling=sampling(60, 1)))


async def test_next_turn_prefills_only_new_tokens(policy: HFPolicy, reference: HFPolicy, tiny) -> None:
    turn1 = ids(tiny[1], "System prompt with tool schemas. User: what is the price?")
    first = await policy.generate(token_ids=turn1, sampling=sampling(12, 3))
    turn2 = turn1 + first.token_ids + ids(tiny[1], " Tool output: 42. Assistant:")
    hit = await policy.generate(token_ids=turn2, sampling=sampling(12, 4))
    assert hit.info["cached_tokens"] == len(turn1) + len(first.token_ids) - 1  # the last sampled token was never fed
    assert hit.info["prefill_tokens"] == len(turn2) - hit.info["cached_tokens"]
    miss = await reference.generate(token_ids=turn2, sampling=sampling(12, 4))
    assert miss.info["cached_tokens"] == 0
    assert_exact(policy, turn2, hit, miss)
    # A non-append change (pruning, a summary) shares only the unchanged prefix, and stays exact.
    pruned = turn1[:5] + ids(tiny[1], " [summary] ") + turn2[-4:]
    partial = await policy.generate(token_ids=pruned, sampling=sampling(12, 5))
    assert partial.info["cached_tokens"] == 5
    assert_exact(policy, pruned, partial, await reference.generate(token_ids=pruned, sampling=sampling(12, 5)))


async def test_group_shares_one_prefill(policy: HFPolicy, reference: HFPolicy, tiny) -> None:
    """A GRPO group: 4 episodes start together on one prompt; it is prefilled once, samples stay exact."""
    prompt = ids(tiny[1], "You are a shop assistant with tools: lookup(item), calc(expr). " * 3 + "Order: 2 pens.")
    group = await asyncio.gather(*(policy.generate(token_ids=prompt, sampling=sampling(10, s)) for s in range(4)))
    assert sorted(c.info["cached_tokens"] for c in group) == [0] + [len(prompt) - 1] * 3
    assert policy.engine_stats()["prefill_tokens"] == len(prompt) + 3
    for seed, completion in enumerate(group):
        assert_exact(
            policy, prompt, completion, await reference.generate(token_ids=prompt, sampling=sampling(10, seed))
        )


async def test_eviction_is_lru_and_bounded(tiny) -> None:
    config = tiny[0].config
    per_token = (
        config.num_hidden_layers
        * 2
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    a, b = ids(tiny[1], "first prompt " * 3), ids(tiny[1], "second prompt " * 3)
    assert len(a) == len(b)
    one_prompt = (len(a) + 3) * per_token * 3 // 2  # room for one finished request's KV, not two
    policy = make_policy(tiny, prefix_cache_bytes=one_prompt)
    reference = make_policy(tiny, prefix_cache_bytes=0)
    try:
        await policy.generate(token_ids=a, sampling=sampling(4, 1))
        await policy.generate(token_ids=b, sampling=sampling(4, 1))
        stats = policy.engine_stats()
        assert stats["prefix_evictions"] >= 1 and stats["prefix_bytes"] <= one_prompt
        again = await policy.generate(token_ids=a + [11], sampling=sampling(6, 7))
        assert again.info["cached_tokens"] == 0  # a was evicted for b
        assert_exact(policy, a + [11], again, await reference.generate(token_ids=a + [11], sampling=sampling(6, 7)))
    finally:
        policy.close()
        reference.close()


def test_prefix_cache_unit() -> None:
    def kv(n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32).view(1, 1, 1, n, 1).expand(2, 2, 1, n, 1).contiguous()

    cache = PrefixCache(max_bytes=kv(10).numel() * 4 * 2)  # two 10-token entries
    t = torch.tensor
    assert cache.insert(t([1, 2, 3]), kv(3))
    assert cache.insert(t([1, 2, 3, 4, 5]), kv(5)) and len(cache) == 1  # extends (replaces) the first
    assert not cache.insert(t([1, 2]), kv(2))  # already covered
    n, got = cache.match(t([1, 2, 3, 9]), limit=3)
    assert n == 3 and got is not None and got.shape[3] == 3
    assert cache.match(t([1, 2, 3, 4, 5, 6]), limit=5)[0] == 5
    assert cache.match(t([1, 2, 3, 4, 5]), limit=4)[0] == 4  # at least one token is left to prefill
    assert cache.match(t([7, 1, 2]), limit=2) == (0, None)
    cache.insert(t(list(range(20, 30))), kv(10))
    cache.match(t([1, 2, 3]), limit=2)  # touch: the 5-token entry is now the most recent
    cache.insert(t(list(range(40, 50))), kv(10))  # evicts the least recently used: 20..29
    assert cache.match(t(list(range(20, 30))), limit=9)[0] == 0
    assert cache.match(t([1, 2, 3]), limit=2)[0] == 2
    assert cache.bytes <= cache.max_bytes
    assert not cache.insert(t(list(range(100, 130))), kv(30))  # larger than the whole cache
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0


async def test_version_bump_invalidates(policy: HFPolicy, tiny) -> None:
    prompt = ids(tiny[1], "Weights may change between turns.")
    first = await policy.generate(token_ids=prompt, sampling=sampling(6, 1))
    assert first.policy_version == 0 and policy.engine_stats()["prefix_entries"] >= 1
    policy.version = 1
    after = await policy.generate(token_ids=prompt + first.token_ids, sampling=sampling(6, 2))
    assert after.info["cached_tokens"] == 0 and after.policy_version == 1
    policy.set_version(2)
    policy.invalidate_kv_cache()
    again = await policy.generate(token_ids=prompt + first.token_ids, sampling=sampling(6, 2))
    assert again.info["cached_tokens"] == 0 and again.policy_version == 2
    assert again.token_ids == after.token_ids  # same weights, same seed


async def test_in_place_weight_change_never_reuses_stale_kv(tiny) -> None:
    """An optimizer-style in-place update, with or without a version bump, empties the cache; a row decoding
    while it happens restarts and samples entirely from the new weights."""
    policy = make_policy(tiny, own_weights=True)
    try:
        prompt = ids(tiny[1], "The learner is about to step.")
        warm = await policy.generate(token_ids=prompt, sampling=sampling(4, 1))
        decoding = threading.Event()

        def step() -> int:
            with torch.no_grad():
                for p in policy.model.parameters():
                    p.mul_(1.5)
            return policy.engine_stats()["running"]

        def learner() -> int:  # the trainer's thread: waits for the row to decode, then updates in place
            decoding.wait(30)
            return policy.run_exclusive(step)

        update = asyncio.create_task(asyncio.to_thread(learner))
        await asyncio.sleep(0.05)  # the learner thread is up and waiting
        running = asyncio.create_task(policy.generate(token_ids=prompt + warm.token_ids, sampling=sampling(600, 9)))
        await wait_until(lambda: policy.engine_stats().get("running", 0) == 1)
        decoding.set()
        # Between two decode steps, without a version bump, while the row is decoding.
        assert await update == 1
        completion = await running
        assert policy.engine_stats()["restarts"] == 1
        fresh = make_policy((policy.model, tiny[1]), prefix_cache_bytes=0)
        try:
            expected = await fresh.generate(token_ids=prompt + warm.token_ids, sampling=sampling(600, 9))
        finally:
            fresh.close()
        assert completion.info["cached_tokens"] == 0
        assert_exact(policy, prompt + warm.token_ids, completion, expected)
    finally:
        policy.close()


async def test_cancelled_row_leaves_at_next_step(policy: HFPolicy, reference: HFPolicy, tiny) -> None:
    a, b = ids(tiny[1], "Keep going"), ids(tiny[1], "Client disconnects")
    keep = asyncio.create_task(policy.generate(token_ids=a, sampling=sampling(80, 1)))
    drop = asyncio.create_task(policy.generate(token_ids=b, sampling=sampling(80, 2)))
    await wait_until(lambda: policy.engine_stats().get("running", 0) == 2)
    drop.cancel()
    tokens_then = policy.engine_stats().get("decode_tokens", 0)
    await wait_until(lambda: policy.engine_stats().get("running", 0) == 1)
    stats = policy.engine_stats()
    assert (
        stats["cancelled"] == 1 and stats["decode_tokens"] - tokens_then <= 3 * 2
    )  # the step in flight, then it is gone
    assert policy._engine.decoding.rows == 1  # its row (and KV slot) is gone
    with pytest.raises(asyncio.CancelledError):
        await drop
    assert_exact(policy, a, await keep, await reference.generate(token_ids=a, sampling=sampling(80, 1)))
    assert policy._engine.decoding.rows == 0
    policy._engine.idle_release_s = 0.0  # an engine idle for idle_release_s frees its batch KV
    await policy.generate(token_ids=a, sampling=sampling(2, 3))
    await wait_until(lambda: policy.engine_stats()["kv_bytes"] == 0)


async def test_invalid_requests_fail_alone_before_batching(policy: HFPolicy, tiny) -> None:
    good = ids(tiny[1], "A fine request")
    bad_seed = sampling(4, 1)
    bad_seed.seed = 2**64
    nan_temperature, inf_temperature, negative = sampling(4, 1), sampling(4, 1), sampling(4, 1)
    nan_temperature.temperature, inf_temperature.temperature, negative.temperature = math.nan, math.inf, -1.0
    requests = [
        dict(token_ids=good, sampling=sampling(6, 3)),
        dict(token_ids=good, sampling=bad_seed),
        dict(token_ids=good, sampling=nan_temperature),
        dict(token_ids=good, sampling=inf_temperature),
        dict(token_ids=good, sampling=negative),
        dict(token_ids=[1] * policy.max_positions, sampling=sampling(4, 1)),
        dict(token_ids=[1, 2.5], sampling=sampling(4, 1)),
        dict(token_ids=[], sampling=sampling(4, 1)),
    ]
    results = await asyncio.gather(*(policy.generate(**r) for r in requests), return_exceptions=True)
    assert not isinstance(results[0], BaseException)
    for result, needle in zip(results[1:], ["seed", "temperature", "temperature", "temperature", "no room",
                                            "integers", "empty prompt"], strict=True):  # fmt: skip
        assert isinstance(result, InvalidRequestError) and isinstance(result, ValueError), result
        assert needle in str(result)
    assert policy.engine_stats().get("failed", 0) == 0  # nothing invalid reached the engine
    with pytest.raises(InvalidRequestError, match="seed"):
        SamplingParams(seed=-(2**63) - 1)
    with pytest.raises(InvalidRequestError, match="top_p"):
        SamplingParams(top_p=math.nan)


async def test_a_failing_row_fails_alone(tiny, reference: HFPolicy) -> None:
    """Faults injected into the real model for rows holding a poison token: an exception in the forward, and
    NaN activations. The poisoned requests fail; their neighbours finish exactly as they would alone."""
    policy = make_policy(tiny, own_weights=True)
    poison_raise, poison_nan = 1234, 4321
    embeddings = policy.model.get_input_embeddings()

    def pre_hook(module: Any, args: tuple[Any, ...]) -> None:
        if (args[0] == poison_raise).any():
            raise RuntimeError("injected fault")

    def hook(module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        return output.masked_fill((args[0] == poison_nan)[..., None], math.nan)

    handles = [embeddings.register_forward_pre_hook(pre_hook), embeddings.register_forward_hook(hook)]
    try:
        fine = [ids(tiny[1], "neighbour one"), ids(tiny[1], "neighbour two is longer than one")]
        bad = [ids(tiny[1], "raises") + [poison_raise], ids(tiny[1], "nan") + [poison_nan]]
        results = await asyncio.gather(
            *(policy.generate(token_ids=p, sampling=sampling(20, i)) for i, p in enumerate(fine + bad)),
            return_exceptions=True,
        )
        assert isinstance(results[2], PolicyError) and "injected fault" in str(results[2])
        assert isinstance(results[3], PolicyError) and "non-finite" in str(results[3])
        for i, prompt in enumerate(fine):
            assert_exact(
                reference, prompt, results[i], await reference.generate(token_ids=prompt, sampling=sampling(20, i))
            )
        # The slots the NaN row used are clean: later requests in them are still exact.
        later = await asyncio.gather(*(policy.generate(token_ids=p, sampling=sampling(20, 5)) for p in fine))
        for prompt, completion in zip(fine, later, strict=True):
            assert_exact(
                reference, prompt, completion, await reference.generate(token_ids=prompt, sampling=sampling(20, 5))
            )
    finally:
        for handle in handles:
            handle.remove()
        policy.close()


async def test_run_exclusive_runs_between_steps(policy: HFPolicy, tiny) -> None:
    """The learner's work (on the decode thread) need not wait for a long generation to end."""
    task = asyncio.create_task(policy.generate(token_ids=ids(tiny[1], "long"), sampling=sampling(150, 1)))
    await wait_until(lambda: policy.engine_stats().get("running", 0) == 1)
    ran_on = await asyncio.to_thread(policy.run_exclusive, lambda: policy._decode_thread)
    assert ran_on == policy._decode_thread
    assert not task.done()
    await task


def test_requests_from_several_event_loops(policy: HFPolicy, reference: HFPolicy, tiny) -> None:
    prompts = [ids(tiny[1], f"loop {i} says hello") for i in range(3)]
    results: dict[int, Any] = {}

    def run(i: int) -> None:
        results[i] = asyncio.run(policy.generate(token_ids=prompts[i], sampling=sampling(12, i)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, prompt in enumerate(prompts):
        expected = asyncio.run(reference.generate(token_ids=prompt, sampling=sampling(12, i)))
        assert_exact(policy, prompt, results[i], expected)


def test_close_finishes_submitted_work_and_refuses_new(tiny) -> None:
    policy = make_policy(tiny)

    async def main() -> None:
        task = asyncio.create_task(policy.generate(token_ids=ids(tiny[1], "last words"), sampling=sampling(30, 1)))
        await asyncio.sleep(0)
        await asyncio.to_thread(policy.close)
        assert len((await task).token_ids) == 30
        with pytest.raises(PolicyError, match="closed"):
            await policy.generate(token_ids=[1, 2], sampling=sampling(2, 1))

    asyncio.run(main())


def test_a_closed_policy_frees_its_model_and_kv_at_once(tiny) -> None:
    # the engine's idle-release timer held the engine, and so the model and its KV, for idle_release_s (30 s)
    # after close: a ladder's next arm built its model beside the last one's (an OOM kill at 13.9 GB)
    policy = make_policy(tiny, own_weights=True)
    asyncio.run(policy.generate(token_ids=ids(tiny[1], "some words"), sampling=sampling(8, 1)))
    assert policy._engine.wait_idle(5) and policy._engine._idle.timer is not None  # idle: a release is pending
    model = weakref.ref(policy.model)
    policy.close()
    assert all(kv.buffer is None for kv in policy._engine._kvs()) and len(policy._engine.prefix) == 0
    del policy
    gc.collect()
    assert model() is None


async def test_weight_sync_invalidates(policy: HFPolicy, tiny) -> None:
    """The trainer's in-process sync only sets the version: that alone must empty the prefix cache."""
    from taskrl.training.sync import InProcessSync

    prompt = ids(tiny[1], "Synced weights, new version.")
    first = await policy.generate(token_ids=prompt, sampling=sampling(6, 1))
    InProcessSync(policy, policy.model)(7)
    after = await policy.generate(token_ids=prompt + first.token_ids, sampling=sampling(6, 2))
    assert after.info["cached_tokens"] == 0 and after.policy_version == 7


def test_rollout_copy_keeps_engine_settings(tiny) -> None:
    """A rollout copy decodes with the learner policy's engine, prefill budget and prefix-cache bound."""
    from taskrl.training.sync import rollout_copy

    source = make_policy(tiny, engine="static", prefill_chunk_tokens=48, prefix_cache_bytes=12345, max_batch_size=5,
                         draft_tokens=2, decode_token_budget=9, schedule="throughput", priority_tokens=3,
                         fast_forward=False)  # fmt: skip
    copy_policy = rollout_copy(source)
    try:
        assert copy_policy.engine_config == source.engine_config  # one value carries every setting
        assert (copy_policy.engine_config.engine, copy_policy.engine_config.prefill_chunk_tokens) == ("static", 48)
        assert copy_policy._engine.prefix.max_bytes == 12345 and copy_policy._engine.max_batch_size == 5
        engine = copy_policy._engine
        assert (engine.draft_tokens, engine.decode_token_budget, engine.schedule) == (2, 9, "throughput")
        assert engine.priority_tokens == 3 and engine.fast.enabled is False
    finally:
        copy_policy.close()
        source.close()


async def test_short_prompt_skips_ahead_of_a_long_prefill(tiny, reference: HFPolicy) -> None:
    """Prefill is chunked (no step reads a whole long prompt) and a short prompt joins a long one's prefill in
    progress, finishing first; both samples stay exactly what they are alone."""
    policy = make_policy(tiny, prefill_chunk_tokens=32)
    try:
        long_prompt = ids(tiny[1], " ".join(f"line {i} of a long tool output." for i in range(40)))
        short_prompt = ids(tiny[1], "Quick one")
        assert len(long_prompt) > 6 * 32
        done: list[str] = []

        async def run(name: str, prompt: list[int], n: int, seed: int) -> Any:
            out = await policy.generate(token_ids=prompt, sampling=sampling(n, seed))
            done.append(name)
            return out

        long_task = asyncio.create_task(run("long", long_prompt, 4, 1))
        await wait_until(lambda: policy.engine_stats()["prefill_tokens"] > 0)
        short = await run("short", short_prompt, 2, 2)
        long = await long_task
        assert done == ["short", "long"]
        assert policy.engine_stats()["prefill_padded_tokens"] <= 32 * policy.engine_stats()["steps"]
        assert_exact(
            policy, short_prompt, short, await reference.generate(token_ids=short_prompt, sampling=sampling(2, 2))
        )
        assert_exact(
            policy, long_prompt, long, await reference.generate(token_ids=long_prompt, sampling=sampling(4, 1))
        )
    finally:
        policy.close()


@pytest.mark.parametrize(
    ("short_tokens", "priority_tokens", "prefix_cache_bytes", "shared"),
    [(12, 0, 2**26, False), (4, 8, 2**26, False), (12, 0, 0, True)],
    ids=["main-lane", "priority-lane", "shares-inflight-kv"],
)
def test_a_long_prompt_is_not_starved_by_a_stream_of_cheap_ones(
    tiny, reference: HFPolicy, short_tokens: int, priority_tokens: int, prefix_cache_bytes: int, shared: bool
) -> None:
    """Admission starts the cheapest prompts first, yet a long uncached one must not wait forever behind a steady
    stream of cheaper ones (one arrives every step, so a cheaper candidate always waits): short prompts, short
    requests of the priority lane, or requests that share its prefix with in-flight KV (which it would wait to
    reuse). Once passed over ``AGING_PASSES`` times it starts ahead of them, and still samples exactly.
    The engine is stepped on this thread, so arrivals are exact whatever the machine's load."""
    from taskrl.policies.engine import AGING_PASSES
    from taskrl.policies.sampling import Request

    policy = make_policy(tiny, max_batch_size=2, prefill_chunk_tokens=64, priority_tokens=priority_tokens,
                         prefix_cache_bytes=prefix_cache_bytes)  # fmt: skip
    engine, loop = policy._engine, asyncio.new_event_loop()
    long_prompt = ids(tiny[1], " ".join(f"line {i} of a long tool output." for i in range(20)))
    short_prompt = long_prompt[:40] if shared else ids(tiny[1], "Quick one")
    assert len(long_prompt) > 4 * len(short_prompt) and len(short_prompt) - 1 >= engine.share_min_tokens * shared

    def request(prompt: list[int], n: int, seed: int) -> Request:
        return Request(prompt_ids=prompt, sampling=sampling(n, seed), seed=seed, max_new_tokens=n,
                       future=loop.create_future(), loop=loop)  # fmt: skip

    try:
        shorts = [request(short_prompt + [seed], short_tokens, seed) for seed in range(2)]
        long = request(long_prompt, 12, 99)
        bound = AGING_PASSES * engine.max_batch_size  # each pass starts at most max_batch_size requests
        with torch.inference_mode():
            # Both row slots go to cheap ones, a step apart (as under sustained load: rows free one at a time).
            engine.queue.append(shorts[0])
            engine.step()
            engine.queue.extend([shorts[1], long])
            while long.generator is None:  # set when the engine starts the request
                ahead = sum(r.generator is not None for r in shorts)
                assert ahead <= bound, f"{ahead} cheaper requests started while the long one waited"
                shorts.append(request(short_prompt + [len(shorts)], short_tokens, len(shorts)))
                engine.queue.append(shorts[-1])
                engine.step()
            for r in shorts:  # the stream stops; the long request finishes
                r.cancelled = True
            while long.finish_reason is None:
                engine.step()
        loop.run_until_complete(asyncio.sleep(0))  # deliver the completion
        expected = asyncio.run(reference.generate(token_ids=long_prompt, sampling=sampling(12, 99)))
        assert_exact(policy, long_prompt, long.future.result(), expected)
    finally:
        policy.close()
        loop.close()
