"""The command line: listing and checking envs, rollouts to JSONL, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from taskrl.types import read_jsonl


def taskrl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from taskrl.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_env_list_and_check() -> None:
    out = taskrl("env", "list")
    assert out.returncode == 0, out.stderr
    assert "shop" in out.stdout and "noop" in out.stdout
    check = taskrl("env", "check", "shop")
    assert check.returncode == 0 and "passes check_env" in check.stdout and "lookup_price" in check.stdout


def test_rollout_writes_trajectories_and_run_info(tmp_path: Path) -> None:
    out = tmp_path / "shop.jsonl"
    run = taskrl("rollout", "--env", "shop", "--policy", "scripted", "--n", "3", "--group-size", "2",
                 "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    trajs = read_jsonl(str(out))
    assert len(trajs) == 6 and all(t.reward == 1.0 for t in trajs)
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["summary"]["charts/episodes"] == 6 and meta["config"]["group_size"] == 2
    again = taskrl("rollout", "--env", "shop", "--policy", "scripted", "--out", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert len(read_jsonl(str(out))) == 6, "a refused rerun must not touch the earlier results"


def test_user_errors_are_one_line_with_the_fix(tmp_path: Path) -> None:
    cases = {
        ("--env", "nope"): "registered envs: ",
        ("--env", "shop", "--policy", "bogus"): "choose one of: hf, openai, scripted",
        ("--env", "shop", "--policy", "openai"): "needs --base-url",
        ("--env", "shop", "--policy", "openai", "--base-url", "http://127.0.0.1:9/v1"): "start the server",
        ("--env", "shop", "--policy", "hf", "--model", str(tmp_path / "missing")): "no model at",
        ("--env", "shop", "--policy", "scripted", "--max-turns", "0"): "RolloutConfig.max_turns",
    }
    for i, (args, fix) in enumerate(cases.items()):
        run = taskrl("rollout", *args, "--out", str(tmp_path / f"{i}.jsonl"))
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and fix in lines[0], (args, run.stderr)


def test_rollout_eval_and_env_check_on_the_users_own_corpus(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from taskrl.cli import app

    sys.path.insert(0, str(Path(__file__).parent / "envs" / "search"))
    from search_planted import write_namespaced

    corpus = tmp_path / "corpus"
    runner = CliRunner()
    built = runner.invoke(app, ["corpus", "build", str(write_namespaced(tmp_path / "src")), "--out", str(corpus),
                                "--embedder", "hashing-384", "--chunk-tokens", "64"])  # fmt: skip
    assert built.exit_code == 0, built.output
    made = runner.invoke(app, ["datagen", "multihop", "--corpus", str(corpus), "--n", "6"])
    assert made.exit_code == 0, made.output
    check = runner.invoke(app, ["env", "check", "search", "--corpus", str(corpus)])
    assert check.exit_code == 0 and "passes check_env" in check.output, check.output
    out = tmp_path / "runs.jsonl"
    played = runner.invoke(app, ["rollout", "--env", "search", "--policy", "scripted", "--n", "2", "--split", "train",
                                 "--corpus", str(corpus), "--out", str(out)])  # fmt: skip
    assert played.exit_code == 0, played.output
    trajs = read_jsonl(str(out))
    assert len(trajs) == 2 and all(t.metrics["search/output_recall"] == 1.0 for t in trajs)
    assert all(d.count(":") or "++" in d for t in trajs for d in t.info["output_doc_ids"])  # the user's ids
    assert json.loads(out.with_suffix(".meta.json").read_text())["env_kwargs"] == {"corpus": str(corpus)}
    kwargs = json.dumps({"corpus": str(corpus), "reward": {"answer_weight": 0.5}})
    evaluated = runner.invoke(app, ["eval", "--env", "search", "--env-kwargs", kwargs, "--n", "2", "--k", "1",
                                    "--out", str(tmp_path / "eval")])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    result = json.loads((tmp_path / "eval" / "eval" / "eval.json").read_text())
    assert result["policies"]["scripted"]["mean_reward"]["value"] == 2.5  # the answer term was on


def test_bad_env_kwargs_are_one_line_naming_the_field(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from taskrl.cli import app
    from taskrl.cli_options import EnvOptionsError

    cases = {
        ("--env-kwargs", "{not json"): "--env-kwargs is not valid JSON",
        ("--env-kwargs", "[1, 2]"): "--env-kwargs must be a JSON object",
        ("--env-kwargs", '{"per_call_budget": "big"}'): "SearchEnvConfig.per_call_budget must be int",
        ("--env-kwargs", '{"reward": {"answer_wieght": 1}}'): "unexpected keyword argument 'answer_wieght'",
        ("--corpus", str(tmp_path / "nowhere")): "no corpus at",
    }
    for i, (args, fix) in enumerate(cases.items()):
        out = tmp_path / f"{i}.jsonl"
        run = CliRunner().invoke(app, ["rollout", "--env", "search", "--policy", "scripted", *args, "--out", str(out)])
        assert isinstance(run.exception, EnvOptionsError) and fix in str(run.exception), (args, run.exception)
        assert not out.exists()  # it failed before writing anything
    shop = taskrl("env", "check", "shop", "--env-kwargs", '{"colour": "red"}')  # through main(): one line, exit 2
    lines = [line for line in shop.stderr.splitlines() if line.strip()]
    assert shop.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --env-kwargs for env 'shop'")
    assert "colour" in lines[0]


def test_a_typo_in_env_kwargs_or_a_config_key_is_one_line_with_did_you_mean(tmp_path: Path) -> None:
    """Issue 38 item 8: `train --set env_kwargs=...` printed a 60-line TypeError traceback."""
    cases = {
        ("env", "check", "shop", "--env-kwargs", '{"num_task": 3}'):
            "error: --env-kwargs for env 'shop' takes no argument 'num_task' (did you mean 'num_tasks'?); its "
            "arguments: num_tasks, min_items, max_items, lookup_credit",
        ("train", "--set", "env_kwargs={num_task=3}", "--set", f"run_dir='{tmp_path / 'run'}'"):
            "error: env 'shop' takes no argument 'num_task' (did you mean 'num_tasks'?)",
        ("train", "--set", "stepz=3"): "error: unknown config key(s): stepz (did you mean 'steps'?)",
    }  # fmt: skip
    for args, message in cases.items():
        run = taskrl(*args)
        lines = [line for line in " ".join(run.stderr.split()).split("error:") if line.strip()]
        assert run.returncode == 2 and len(lines) == 1 and message in "error:" + lines[0], (args, run.stderr)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_version_python_m_typed_and_train_help_lists_the_config_fields() -> None:
    """Issue 38, expected and missing: `taskrl --version`, `python -m taskrl`, py.typed, fields in `train --help`."""
    import tomllib

    from taskrl import __file__ as package_init
    from taskrl import __version__
    from taskrl.training.config import field_docs

    version = subprocess.run([sys.executable, "-m", "taskrl", "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"taskrl {__version__}", version.stderr
    root = Path(package_init).parent
    assert (root / "py.typed").is_file()
    pyproject = tomllib.loads((root.parent / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["taskrl"]
    help_text = " ".join(taskrl("train", "--help").stdout.split())
    for field in ("steps = 100", "sft_warmup_steps = 0", "env = 'shop'", "lora.rank = 16",
                  "rollout.temperature = 1.0", "algo.clip_eps_high = 0.2", "placement.rollout_policy = 'inprocess'"):
        assert field in help_text, field
    assert [key for key in field_docs() if f"{key} = " not in help_text] == []
