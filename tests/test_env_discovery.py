"""A user's own env from the command line: by ``module:Class`` / ``module:factory`` (beside the module or as a
``.py`` path), by an installed package's ``taskrl.envs`` entry point, and named by its registered name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import taskrl
from taskrl.types import read_jsonl

REPO = Path(taskrl.__file__).resolve().parents[1]
UNITCONV = textwrap.dedent('''
    from taskrl.env import ToolEnv
    from taskrl.tools import tool
    from taskrl.types import Task
    from taskrl.chat import format_tool_call

    FACTORS = {("km", "m"): 1000.0, ("m", "cm"): 100.0, ("kg", "g"): 1000.0}


    class UnitConvEnv(ToolEnv):
        system_prompt = "Convert units with the convert tool, then answer with the number only."

        def tasks(self, split="train"):
            return [Task(f"{v}{a}", f"How many {b} is {v} {a}?", answer=v * FACTORS[a, b], info={"q": [v, a, b]})
                    for v in (2, 3) for (a, b) in FACTORS]

        @tool
        def convert(self, value: float, from_unit: str, to_unit: str) -> str:
            """Convert a value between units.

            Args:
                value: the number to convert.
                from_unit: its unit, e.g. "km".
                to_unit: the unit wanted, e.g. "m".
            """
            return f"{value * FACTORS[from_unit, to_unit]:g}"

        @staticmethod
        def scripted_rule(messages, tools):  # the expert sees only the conversation
            if messages[-1].role != "tool":
                words = messages[-1].content.rstrip("?").split()  # How many B is V A
                b, v, a = words[2], words[4], words[5]
                return format_tool_call("convert", {"value": float(v), "from_unit": a, "to_unit": b})
            return messages[-1].content

        def reward(self, trajectory):
            answer = (trajectory.final_answer or "").strip()
            return {"correct": float(answer.replace(".", "", 1).isdigit() and float(answer) == self.task.answer)}


    def make_unitconv(**kwargs):
        return UnitConvEnv(**kwargs)
''')


def taskrl_cli(*args: str, cwd: Path, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess[str]:
    """The CLI as the ``taskrl`` console script runs it: ``-P`` keeps the current directory off ``sys.path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in [REPO, *pythonpath])}
    cmd = [sys.executable, "-P", "-c", "from taskrl.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


@pytest.fixture()
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "unitconv_env.py").write_text(UNITCONV)
    return tmp_path


def test_env_check_and_rollout_find_module_class_and_factory_beside_the_module(user_dir: Path) -> None:
    check = taskrl_cli("env", "check", "unitconv_env:UnitConvEnv", cwd=user_dir)
    assert check.returncode == 0 and "passes check_env" in check.stdout and "convert" in check.stdout, check.stderr
    by_path = taskrl_cli("env", "check", f"{user_dir / 'unitconv_env.py'}:make_unitconv", cwd=REPO)
    assert by_path.returncode == 0, by_path.stderr
    out = user_dir / "r.jsonl"
    run = taskrl_cli("rollout", "--env", "unitconv_env:make_unitconv", "--policy", "scripted", "--n", "3",
                     "--out", str(out), cwd=user_dir)  # fmt: skip
    assert run.returncode == 0, run.stderr
    trajectories = read_jsonl(str(out))
    assert [t.reward for t in trajectories] == [1.0, 1.0, 1.0]
    assert {t.env for t in trajectories} == {"unitconv_env:make_unitconv"}  # not ToolEnv's 'tool_env'


def test_missing_module_or_attribute_is_one_line_naming_it(user_dir: Path) -> None:
    for spec, fix in {"nowhere_env:Env": "no module named 'nowhere_env'",
                      "unitconv_env:Nope": "module 'unitconv_env' has no attribute 'Nope'",
                      "unitconv_env:FACTORS": "not an env class or a factory function",
                      "unitconv": "my_module:MyEnv"}.items():  # fmt: skip
        run = taskrl_cli("env", "check", spec, cwd=user_dir)
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert run.returncode == 2 and len(lines) == 1 and fix in lines[0], (spec, run.stderr)


def test_installed_package_envs_come_from_the_taskrl_envs_entry_point_group(user_dir: Path) -> None:
    site = user_dir / "site"
    dist = site / "unitconv_pkg-0.1.dist-info"  # what `pip install` writes for a package declaring the entry point
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: unitconv-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[taskrl.envs]\nunitconv = unitconv_env:UnitConvEnv\n")
    (site / "unitconv_env.py").write_text(UNITCONV)
    listed = taskrl_cli("env", "list", cwd=REPO, pythonpath=[site])
    assert listed.returncode == 0 and "unitconv" in listed.stdout and "unitconv-pkg" in listed.stdout, listed.stderr
    check = taskrl_cli("env", "check", "unitconv", cwd=REPO, pythonpath=[site])
    assert check.returncode == 0 and "passes check_env" in check.stdout, check.stderr
    out = user_dir / "e"
    run = taskrl_cli("eval", "--env", "unitconv", "--policy", "scripted", "--n", "2", "--k", "1", "--out", str(out),
                     cwd=REPO, pythonpath=[site])  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads((out / "eval" / "eval.json").read_text())
    assert result["env"] == "unitconv" and result["policies"]["scripted"]["mean_reward"]["value"] == 1.0


def test_train_config_env_accepts_module_class(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from taskrl.env import make
    from taskrl.training.config import load_config

    monkeypatch.chdir(user_dir)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(user_dir))])
    config = load_config(None, ["env=unitconv_env:UnitConvEnv", "steps=1"])
    env = make(config.env, **config.env_kwargs)  # what the trainer's env factory calls
    assert env.name == "unitconv_env:UnitConvEnv" and env.tools.names == ["convert"]


def test_a_registered_user_env_is_named_by_its_registered_name(user_dir: Path) -> None:
    """Item 7: ToolEnv's default name 'tool_env' no longer wins over the name the env was registered under."""
    import asyncio
    import importlib.util

    from taskrl.env import make, register
    from taskrl.policies.scripted import ScriptedPolicy
    from taskrl.rollout import RolloutConfig, run_episodes

    spec = importlib.util.spec_from_file_location("unitconv_env_registered", user_dir / "unitconv_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    register("unitconv-test", module.UnitConvEnv, description="unit conversion", overwrite=True)
    env = make("unitconv-test")
    assert env.name == "unitconv-test"
    policy = ScriptedPolicy(env.scripted_rule)
    [traj] = asyncio.run(run_episodes(lambda: env, policy, env.tasks()[:1], RolloutConfig()))
    assert traj.env == "unitconv-test" and traj.reward == 1.0
