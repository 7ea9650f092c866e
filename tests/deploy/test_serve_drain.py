"""Issue 37.3: SIGTERM to a real ``taskrl serve`` (tiny model) under concurrent client sessions that keep sending
(bounded loops, loopback): ``/ready`` goes false first, every request accepted before the signal completes and is
stored, what comes after is refused (503 ``server_draining`` with ``Retry-After``, or connection refused once the
listener closes), nothing is cut, and the server exits 0. The scenario is ``benchmarks/drain_bench.py``'s."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx

from benchmarks.drain_bench import drain_under_load, free_port, save_tiny_model, start_server, wait_ready


def test_a_drain_under_load_cuts_nothing(tmp_path: Path) -> None:
    result = asyncio.run(drain_under_load(24, 8, drain_s=120.0, max_requests=40, workdir=tmp_path))
    log = result.server_log[-3000:]
    assert result.exit_code == 0, log
    assert result.outcomes["cut"] == 0, (dict(result.cut_reasons), log)
    assert result.refused_before_signal == 0
    assert result.outcomes["refused"] >= 1 and result.outcomes["completed"] >= 24
    assert result.ready_false_after_s is not None  # /ready said 503 while the server still answered
    assert result.in_flight_at_signal >= 1  # the signal came under load
    assert result.missing_from_store == 0  # every completed response was logged


def test_no_connection_outlives_the_drain_unanswered(tmp_path: Path) -> None:
    """A response finished during the drain closes its connection, and a kept-alive connection that was idle when
    the last request finished still gets an answer (503) rather than being closed under a request on the wire."""
    port = free_port()
    proc = start_server(save_tiny_model(tmp_path), tmp_path / "s.db", port, drain_s=120.0)
    root = f"http://127.0.0.1:{port}"

    async def scenario() -> tuple[httpx.Response, httpx.Response | Exception]:
        await wait_ready(root, proc)
        long = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 48}
        async with httpx.AsyncClient(base_url=root, timeout=120) as idle, httpx.AsyncClient(
            base_url=root, timeout=120
        ) as busy:
            assert (await idle.get("/ready")).status_code == 200  # a kept-alive connection, idle from here on
            flight = asyncio.create_task(busy.post("/v1/chat/completions", json=long))
            while (await idle.get("/ready")).json().get("in_flight", 0) < 1:
                await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            finished = await flight
            await asyncio.sleep(0.5)  # the drain is over; the server closes up
            try:
                late: httpx.Response | Exception = await idle.post("/v1/chat/completions", json=long)
            except httpx.HTTPError as exc:
                late = exc
        return finished, late

    try:
        finished, late = asyncio.run(scenario())
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert finished.status_code == 200 and finished.headers.get("connection") == "close"
    assert isinstance(late, httpx.Response), f"the idle connection was closed under a request: {late!r}"
    assert late.status_code == 503 and late.headers["retry-after"] and late.headers["connection"] == "close"
