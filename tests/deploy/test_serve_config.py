"""Issue 16, Low: tenant keys out of the process list, bad settings refused by name, adapter-path allow-listing,
and Prometheus metrics (HELP/TYPE, histograms, in-flight, queue depth, tokens) from a real server."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import typer

from taskrl.chat import ChatFormat
from taskrl.deploy.admin import check_adapter_path
from taskrl.deploy.cli import API_KEYS_ENV, _keys, default_spool
from taskrl.deploy.config import ServeConfig
from taskrl.deploy.errors import APIError
from taskrl.deploy.router import RouterConfig
from taskrl.deploy.server import create_app, running_server
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy


def test_tenant_keys_from_a_file_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# tenants\nkf1:file-tenant\n\nkf2 : other\n")
    monkeypatch.setenv(API_KEYS_ENV, "ke1:env-tenant, ke2:env-two")
    assert _keys(["kc:cli"], keys) == {
        "kc": "cli", "ke1": "env-tenant", "ke2": "env-two", "kf1": "file-tenant", "kf2": "other",
    }  # fmt: skip
    keys.write_text("no-colon-here\n")
    with pytest.raises(typer.BadParameter, match="keys:1"):
        _keys(None, keys)
    assert default_spool("sqlite:///runs/x.db") == Path("runs/x.db.spool.jsonl")
    assert default_spool("postgresql+psycopg://a/b") != default_spool("postgresql+psycopg://a/c")


@pytest.mark.parametrize(
    ("field", "value"),
    [("generation_timeout_s", 0), ("rate_limit_per_minute", -1), ("max_concurrent_per_tenant", 0),
     ("drain_timeout_s", -1.0)],
)  # fmt: skip
def test_bad_serve_settings_fail_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ServeConfig(**{field: value})
    with pytest.raises(ValueError, match="max_tenant_share"):
        RouterConfig(max_tenant_share=0.0)


def test_adapter_paths_are_allow_listed(tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    (root / "a").mkdir(parents=True)
    (root / "escape").symlink_to("/etc")
    config = ServeConfig(adapter_root=str(root))
    assert check_adapter_path(config, str(root / "a")) == str((root / "a").resolve())
    for bad in ("/etc", str(root / "escape"), str(root / ".." / "x")):
        with pytest.raises(APIError) as refused:
            check_adapter_path(config, bad)
        assert refused.value.status == 403 and refused.value.code == "path_not_allowed"
    with pytest.raises(APIError) as disabled:
        check_adapter_path(ServeConfig(allow_runtime_lora=False), str(root / "a"))
    assert disabled.value.code == "runtime_lora_disabled"


def test_prometheus_metrics_have_histograms_gauges_and_tokens() -> None:
    policy = ScriptedPolicy(lambda m, t: "hello there", chat_format=ChatFormat(smollm2_tokenizer()))
    with running_server(create_app({"agent": policy})) as url:
        oa = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
        oa.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.BadRequestError):
            oa.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}], temperature=9)
        reply = httpx.get(url.removesuffix("/v1") + "/metrics")
    text = reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=")
    for name in ("taskrl_requests_total", "taskrl_request_seconds", "taskrl_policy_seconds", "taskrl_errors_total",
                 "taskrl_requests_in_flight", "taskrl_generation_queue_depth", "taskrl_tokens_total"):  # fmt: skip
        assert f"# HELP {name.removesuffix('_total')}" in text and f"# TYPE {name.removesuffix('_total')}" in text
    assert 'taskrl_request_seconds_bucket{le="0.005",model="agent"}' in text
    assert 'taskrl_tokens_total{kind="completion",model="agent"}' in text
    assert 'taskrl_errors_total{kind="invalid_request",model=""} 1.0' in text  # refused before routing
    assert "taskrl_requests_in_flight 0.0" in text and 'taskrl_stable_version{model="agent"} 0.0' in text
