"""The README's "Your own env, end to end", run as written: its env module copied to a directory outside the
package, then every command of its shell block as a subprocess (check, rollout, train, eval, serve the trained
adapter), with a tiny model and a few steps appended as overrides."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

import taskrl
from taskrl.policies.models import tiny_model
from taskrl.types import read_jsonl

REPO = Path(taskrl.__file__).resolve().parents[1]
SECTION = "## Your own env, end to end"


def readme_commands() -> list[str]:
    """The tutorial's shell lines, in order."""
    text = (REPO / "README.md").read_text()
    block = text[text.index(SECTION):].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_readme_tutorial_runs_from_the_cli(tmp_path: Path) -> None:
    lines = readme_commands()
    assert lines[0] == "cd examples", lines
    user = tmp_path / "user"  # the user's own directory: nothing of it is inside the taskrl package
    user.mkdir()
    shutil.copy(REPO / "examples" / "unitconv_env.py", user)
    tiny = tmp_path / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(tiny))
    tokenizer.save_pretrained(str(tiny))
    port = free_port()
    fast = {  # appended to the README's commands: later options and --set values win
        "train": [f"--set=model={json.dumps(str(tiny))}", "--set=steps=2", "--set=sft_warmup_steps=1",
                  "--set=rollout.tasks_per_step=1", "--set=rollout.group_size=2", "--set=rollout.max_turns=2",
                  "--set=rollout.max_new_tokens=48",
                  "--set=progress=false", "--set=device=cpu"],
        "eval": ["--n", "2", "--k", "1", "--max-turns", "1", "--max-new-tokens", "8", "--device", "cpu"],
        "serve": ["--port", str(port), "--device", "cpu"],
    }  # fmt: skip
    base_env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    outputs = {}
    for line in lines[1:]:
        words = shlex.split(line)
        env = dict(base_env)
        while "=" in words[0]:  # VAR=value prefixes
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        assert words[0] == "taskrl", line
        # -P: the current directory is not on sys.path, as with the installed `taskrl` script
        command = [sys.executable, "-P", "-c", "from taskrl.cli import main; main()", *words[1:],
                   *fast.get(words[1], [])]  # fmt: skip
        if words[1] == "serve":
            serve_and_ask(command, env, user, port)
            continue
        run = subprocess.run(command, cwd=user, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, (line, run.stdout[-2000:], run.stderr[-3000:])
        outputs[words[1]] = " ".join(run.stdout.split())
    assert "passes check_env" in outputs["env"]
    expert = read_jsonl(str(user / "runs" / "unitconv-expert.jsonl"))
    assert len(expert) == 4 and all(t.reward == 1.0 and t.env == "unitconv_env:UnitConvEnv" for t in expert)
    assert "train env 'unitconv_env:UnitConvEnv'" in outputs["train"] and "2 steps (1 SFT" in outputs["train"]
    adapter = json.loads((user / "runs" / "unitconv" / "policy" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tiny)
    result = json.loads((user / "runs" / "unitconv-eval" / "eval" / "eval.json").read_text())
    assert result["env"] == "unitconv_env:UnitConvEnv"
    assert list(result["policies"]) == ["hf:runs/unitconv/policy"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_ask(command: list[str], env: dict[str, str], cwd: Path, port: int) -> None:
    """Start the server, ask the trained adapter one question with the README's key, stop it with SIGTERM."""
    key = env["TASKRL_API_KEYS"].split(":")[0]
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "taskrl serve did not become healthy in 120 s"
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "unitconv", "messages": [{"role": "user", "content": "How many m is 3 km?"}],
                  "max_tokens": 8},
            timeout=120,
        )  # fmt: skip
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "unitconv" and reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
