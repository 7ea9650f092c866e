"""Issue 38 item 9: one request past ``--timeout-s`` fails its episode (counted, printed), not the whole
``taskrl rollout --policy openai`` run. The server is a real HTTP server on loopback that answers in the OpenAI
chat-completions shape and takes its time on one prompt, as a long generation would."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from taskrl.types import read_jsonl

SLOW_TASK = "How much do 3 apples cost"


class SlowOnOnePrompt(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if any(SLOW_TASK in (m.get("content") or "") for m in body["messages"]):
            time.sleep(4)
        reply = {"choices": [{"message": {"role": "assistant", "content": "The total is 6."}, "finish_reason": "stop"}]}
        data = json.dumps(reply).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), SlowOnOnePrompt)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_one_timeout_fails_its_episode_and_the_run_goes_on(server: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from taskrl.cli import app
    from taskrl.env import ToolEnv, register
    from taskrl.types import Task

    class Questions(ToolEnv):
        def tasks(self, split: str = "train") -> list[Task]:
            return [Task(f"q{i}", f"How much do {i} apples cost?", answer=2 * i) for i in (1, 3, 4)]

    register("timeout-questions", Questions, overwrite=True)
    out = tmp_path / "r.jsonl"
    run = CliRunner().invoke(app, ["rollout", "--env", "timeout-questions", "--policy", "openai", "--base-url", server,
                                   "--model", "m", "--timeout-s", "1", "--n", "3", "--out", str(out)])  # fmt: skip
    assert run.exit_code == 0, (run.output, run.exception)
    trajectories = {t.task_id: t for t in read_jsonl(str(out))}
    assert set(trajectories) == {"q1", "q3", "q4"}
    assert trajectories["q3"].error.startswith("PolicyTimeoutError: request to ") and "timed out after 1s" in (
        trajectories["q3"].error
    )
    assert trajectories["q1"].error is None and trajectories["q4"].error is None
    assert "1 of 3 episodes ended in an error" in " ".join(run.output.split())
