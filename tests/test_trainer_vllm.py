"""rollout_policy='vllm': config checks, and a real run on the session's vLLM server (tests/conftest.py) that is
killed (kill -9) in the middle of a step: the server is restarted on the same URL, the adapter it served is loaded
again, and the step's episodes are played again, never scored as failures."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from taskrl.env import make
from taskrl.policies.base import SamplingParams
from taskrl.policies.vllm_server import VLLMServer, free_port
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.runlog import read_trajectories
from taskrl.training.config import ConfigError, TrainConfig, config_from_dict
from taskrl.training.trainer import Trainer
from taskrl.training.vllm_rollout import server_of
from taskrl.types import Trajectory


def _config(tmp_path: Path, **changes: Any) -> TrainConfig:
    base = {"run_dir": str(tmp_path / "run"), "env": "price", "model": "smollm2", "lora.rank": 4, "lr": 1e-3,
            "steps": 2, "rollout.tasks_per_step": 1, "rollout.group_size": 2, "rollout.max_turns": 1,
            "rollout.max_new_tokens": 12,
            "checkpoint_every": 0, "progress": False, "placement.rollout_policy": "vllm", "seed": 3}  # fmt: skip
    return config_from_dict({**{**base, **changes}})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rollout.top_p": 0.9}, "rollout.top_p must be 1 with placement.rollout_policy='vllm'"),
        ({"placement.vllm": {"threads": "all"}}, r"placement.vllm: .*threads must name CPU cores"),
        ({"placement.vllm": {"gpu_memory": 1}}, r"placement.vllm: unknown field\(s\) gpu_memory"),
        (
            {"placement.vllm": {"max_lora_rank": 8}, "lora.rank": 16},
            r"max_lora_rank \(8\) must be >= the trainer's lora_rank",
        ),
        (
            {"placement.vllm": {"max_loras": 1}, "rollout.max_staleness": 2},
            r"max_loras \(1\) must be >= max_staleness \+ 1",
        ),
        ({"placement.rollout_url": "http://127.0.0.1:1/v1"}, "rollout_model must name the served base model"),
        ({"placement.rollout_restarts": -1}, "rollout_restarts must be an integer >= 0"),
        ({"placement.rollout_policy": "copy", "placement.vllm": {"threads": "0-1"}}, "vllm is the vLLM server's table"),
    ],
)
def test_vllm_config_is_checked_by_field(tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, **changes)


def test_server_of_a_config_follows_the_trainer(tmp_path: Path) -> None:
    local = server_of(_config(tmp_path, **{"lora.rank": 20}, **{"placement.vllm": {"threads": "0",
                                                                                   "kv_cache_gib": 1.5}}))
    assert local.local and local.config.max_lora_rank == 32 and local.config.threads == "0"
    assert local.config.kv_cache_gib == 1.5 and (Path(local.config.model) / "config.json").is_file()
    assert local.config.dtype == "float32"  # the trainer's dtype: the server samples in the learner's weights dtype
    assert server_of(_config(tmp_path, dtype="auto")).config.dtype == "auto"
    pinned = server_of(_config(tmp_path, dtype="float32", **{"placement.vllm": {"dtype": "bfloat16"}}))
    assert pinned.config.dtype == "bfloat16"  # a server dtype set in placement.vllm wins
    remote = server_of(_config(tmp_path, **{"placement.rollout_url": "http://10.0.0.1:8000/v1"},
                               **{"placement.rollout_model": "qwen"}))
    assert not remote.local and remote.base_url == "http://10.0.0.1:8000/v1" and remote.served_model == "qwen"


def test_a_down_vllm_url_fails_the_trainer_with_a_clear_error(tmp_path: Path) -> None:
    from taskrl.policies.vllm_server import VLLMServerError, free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    config = _config(tmp_path, **{"placement.rollout_url": url}, **{"placement.rollout_model": "base"},
                     **{"placement.vllm": {"startup_timeout_s": 1.0}})
    with pytest.raises(VLLMServerError, match=rf"{url} did not answer .*/health within 1s"):
        Trainer(config)


def spread(step: int, trajectories: list[Trajectory]) -> None:
    """A reward that differs inside every group, so each step updates and makes a new adapter version."""
    for i, t in enumerate(trajectories):
        t.terms["spread"] = 0.25 * (i % 2)


class KillOnReset:
    """Env factory: the ``price`` env, but the ``kill_at``-th reset kills the vLLM server's process group (-9)."""

    def __init__(self, server: VLLMServer, kill_at: int) -> None:
        self.server, self.kill_at, self.resets, self.killed = server, kill_at, 0, []

    def __call__(self) -> Any:
        env = make("price")
        reset = env.reset

        def killing_reset(task: Any, seed: int | None = None) -> Any:
            self.resets += 1
            if self.resets == self.kill_at and self.server.pid is not None:
                self.killed.append(self.server.pid)
                os.killpg(self.server.pid, signal.SIGKILL)
            return reset(task, seed=seed)

        env.reset = killing_reset
        return env


@pytest.mark.timeout(2100)  # a server start and a restart: about a minute each on a quiet 2-core machine
def test_server_killed_mid_step_is_restarted_and_the_step_replayed(tmp_path: Path, vllm_server: VLLMServer) -> None:
    url, restarts = vllm_server.base_url, vllm_server.restarts
    # Step 1 is SFT on the expert's episode (one reset; it makes adapter v1 for sure), step 2 is played by vLLM
    # and its first episode's reset kills the server.
    envs = KillOnReset(vllm_server, kill_at=2)
    config = _config(tmp_path, sft_warmup_steps=1, sft_min_reward=0.0)
    trainer = Trainer(config, env_factory=envs, score_fn=spread, rollout_server=vllm_server)
    try:
        rows = trainer.train()
        assert trainer.learner.version >= 1 and trainer.policy.version == trainer.learner.version
    finally:
        trainer.close()
    assert vllm_server.alive(), "the trainer must not stop a server it did not start"
    (old_pid,) = envs.killed
    with pytest.raises(ProcessLookupError):
        os.killpg(old_pid, 0)  # nothing of the killed server's group is left
    assert vllm_server.restarts == restarts + 1 and vllm_server.base_url == url and vllm_server.pid != old_pid
    assert rows[1]["charts/rollout_restarts"] == 1.0 and rows[1]["charts/rollout_replayed"] == 2.0
    assert rows[0]["charts/sync_failed"] == rows[1]["charts/sync_failed"] == 0.0
    second = read_trajectories(trainer.run.dir)[2]
    assert len(second) == 2
    for t in second:  # played again on the restarted server, from the adapter it served before the crash
        assert t.error is None and t.info.get("infra_failure") is None and t.trainable
        assert t.num_sampled_tokens > 0
        assert {s.policy_version for s in t.segments if s.num_sampled} == {1}
    served = {m["id"] for m in httpx.get(f"{url}/models", timeout=30).json()["data"]}
    assert {"base", trainer.policy.model} <= served
    assert trainer.policy.model.endswith(f"-v{trainer.learner.version}")


class Proxy:
    """A real TCP proxy to a port that can be switched off (connections refused, open ones cut) and on again: the
    outage of a vLLM that runs elsewhere (connect mode), restarted by whoever runs it."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self.conns: list[socket.socket] = []
        self.serving: tuple[threading.Event, threading.Thread] | None = None
        self.on()

    def on(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.05)  # a blocked accept() would not notice the socket being closed
        stop = threading.Event()
        thread = threading.Thread(target=self._accept, args=(listener, stop), daemon=True)
        thread.start()
        self.serving = (stop, thread)

    def off(self) -> None:
        serving, self.serving = self.serving, None
        if serving is not None:
            serving[0].set()
            serving[1].join()  # the listener is closed: connections are refused from now on
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self.conns.clear()

    def _accept(self, listener: socket.socket, stop: threading.Event) -> None:
        with listener:
            while not stop.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                client.settimeout(None)
                upstream = socket.create_connection(("127.0.0.1", self.target))
                self.conns += [client, upstream]
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.mark.skipif("engine_failures" not in RolloutConfig.__dataclass_fields__,
                    reason="needs RolloutConfig.engine_failures (per-episode engine failures, issue 37)")  # fmt: skip
async def test_engine_failures_recorded_per_episode_are_replayed_once_the_remote_vllm_is_back(
    tmp_path: Path, vllm_server: VLLMServer
) -> None:
    """Connect mode: the remote vLLM goes away mid-step; the rollout records each failed episode (engine_failures=
    'drop'); the engine waits for the server to answer again and replays exactly those episodes, by their seeds."""
    from taskrl.training.vllm_rollout import VLLMEngine, chat_format_of, vllm_policy

    proxy = Proxy(int(vllm_server.base_url.rsplit(":", 1)[1].split("/")[0]))
    config = _config(tmp_path, **{"placement.rollout_url": f"http://127.0.0.1:{proxy.port}/v1"},
                     **{"placement.rollout_model": "base"},
                     **{"placement.vllm": {"startup_timeout_s": 120.0}})  # fmt: skip
    engine = VLLMEngine.start(config)
    engine.policy = vllm_policy(engine.server.base_url, "base", chat_format_of("smollm2"), max_positions=2048,
                                max_staleness=1)  # fmt: skip
    engine.policy.max_retries = 0
    tasks = list(make("price").tasks("train"))[:2]
    # one episode at a time, greedy: the replayed episodes must sample exactly what they would have
    rollout = RolloutConfig(max_turns=1, sampling=SamplingParams(max_new_tokens=6, temperature=0.0), group_size=2,
                            seed=5, concurrency=1, engine_failures="drop")  # fmt: skip
    expected = await run_episodes(lambda: make("price"), engine.policy, tasks, rollout)
    state = {"down": False}

    # The second episode's reset takes the server away; it is back 20 s later, long after the episodes left failed
    # fast (no retries), so the engine finds it down and waits for it.
    def factory() -> Any:
        env = make("price")
        reset = env.reset

        def outage(task: Any, seed: int | None = None) -> Any:
            if seed == expected[1].seed and not state["down"]:
                state["down"] = True
                proxy.off()
                threading.Timer(20.0, proxy.on).start()
            return reset(task, seed=seed)

        env.reset = outage
        return env

    try:
        got = await engine.play(lambda: run_episodes(factory, engine.policy, tasks, rollout), step=0, episodes=4,
                                tasks=tasks, rollout=rollout, env_factory=factory)  # fmt: skip
    finally:
        await engine.policy.aclose()
        proxy.off()
    metrics = engine.step_metrics(0)
    failures = [t.info.get("infra_failure") for t in got]
    assert metrics["charts/rollout_restarts"] == 1.0, (metrics, failures)
    assert metrics["charts/rollout_replayed"] == 3.0, metrics  # episodes 2, 3 and 4 met the outage
    assert engine.server.restarts == 1  # connect mode: waited for, not restarted by taskrl
    assert [t.seed for t in got] == [t.seed for t in expected]
    for t, e in zip(got, expected, strict=True):  # every episode completed, none scored as a failure
        assert t.error is None and t.info.get("infra_failure") is None
        assert [s.token_ids for s in t.segments] == [s.token_ids for s in e.segments]  # same seeds, same samples
