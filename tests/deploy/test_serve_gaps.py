"""Issue 37.4: serving gaps an operator expects, on a real server over a tiny random HFPolicy: a LoRA name is never
given new weights, the row records the adapter that served it, an unanswered ``tool_call_id`` is a 400, an oversize
chunked body is a 413, and every response carries an ``X-Request-Id`` (the client's own when it is well-formed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from taskrl.deploy.config import ServeConfig
from taskrl.deploy.router import RouterConfig
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from tests.deploy.test_deploy_lora import save_adapter

ADMIN = {"Authorization": "Bearer admin"}
HELLO = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InteractionStore, Path]]:
    root = tmp_path_factory.mktemp("gaps")
    model, tokenizer = tiny_model(seed=0)
    save_adapter(model, root / "adapter")
    policy = HFPolicy(model, tokenizer, device="cpu")
    config = ServeConfig(api_keys={"k": "t"}, admin_keys=("admin",), router=RouterConfig(holdout=0.0),
                         max_body_bytes=8 * 1024)  # fmt: skip
    with InteractionStore(f"sqlite:///{root / 's.db'}", sqlite_synchronous="NORMAL") as store:
        try:
            with running_server(create_app({"tiny": policy}, store=store, config=config)) as url:
                yield url, store, root
        finally:
            policy.close()


def chat(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(url + "/chat/completions", json=body, headers={"Authorization": "Bearer k", **headers},
                      timeout=60)  # fmt: skip


def test_a_lora_name_is_never_given_new_weights_and_rows_record_their_adapter(served: tuple) -> None:
    url, store, root = served
    load = {"lora_name": "tiny-a1", "lora_path": str(root / "adapter"), "model": "tiny", "rollout": "activate"}
    first = httpx.post(url + "/load_lora_adapter", json=load, headers=ADMIN, timeout=60)
    assert first.status_code == 200, first.text
    again = httpx.post(url + "/load_lora_adapter", json=load, headers=ADMIN, timeout=60)
    assert again.status_code == 409 and again.json()["error"]["param"] == "lora_name"
    assert "tiny-a1-v2" in again.json()["error"]["message"]  # the fix is named
    as_model = httpx.post(url + "/load_lora_adapter", json={**load, "lora_name": "tiny", "model": None}, headers=ADMIN,
                          timeout=60)  # fmt: skip
    assert as_model.status_code == 409  # a served model's name is taken too
    missing = httpx.post(url + "/load_lora_adapter", json={**load, "lora_name": "tiny-a2", "lora_path": str(root)},
                         headers=ADMIN, timeout=60)  # fmt: skip
    assert missing.status_code == 400  # a failed load does not burn the name
    retry = httpx.post(url + "/load_lora_adapter", json={**load, "lora_name": "tiny-a2"}, headers=ADMIN, timeout=60)
    assert retry.status_code == 200, retry.text
    reply = chat(url, HELLO, **{"x-session-id": "after-a2"})
    assert reply.status_code == 200, reply.text
    row = store.get_interaction(reply.json()["id"], tenant="t")
    version = retry.json()["version"]
    assert row is not None and row.policy_version == version
    assert row.adapter == {"name": "tiny-a2", "path": str((root / "adapter").resolve()), "version": version}


def test_a_base_weights_row_records_no_adapter(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu")
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        with running_server(create_app({"tiny": policy}, store=store)) as url:
            reply = httpx.post(url + "/chat/completions", json=HELLO, timeout=60)
        row = store.get_interaction(reply.json()["id"], tenant="default")
    policy.close()
    assert row is not None and row.adapter is None


def test_a_tool_message_answering_no_call_is_400_naming_it(served: tuple) -> None:
    url, _, _ = served
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    answered = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]  # fmt: skip
    assert chat(url, {**HELLO, "messages": answered}).status_code == 200
    orphan = [*answered, {"role": "tool", "tool_call_id": "call_9", "content": "?"}]
    refused = chat(url, {**HELLO, "messages": orphan})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "messages[3].tool_call_id" and "call_9" in refused.text
    early = [{"role": "tool", "tool_call_id": "call_1", "content": "ok"}, *answered]  # answered before it was made
    assert chat(url, {**HELLO, "messages": early}).json()["error"]["param"] == "messages[0].tool_call_id"


def test_an_oversize_chunked_body_is_413(served: tuple) -> None:
    url, _, _ = served

    def chunks() -> Iterator[bytes]:  # a generator body is sent chunked, with no Content-Length
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"x" * 1024
        yield b'"}]}'

    response = httpx.post(url + "/chat/completions", content=chunks(), headers={"Authorization": "Bearer k",
                          "Content-Type": "application/json"}, timeout=60)  # fmt: skip
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def small() -> Iterator[bytes]:
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], '
        yield b'"max_tokens": 2}'

    ok = httpx.post(url + "/chat/completions", content=small(), headers={"Authorization": "Bearer k",
                    "Content-Type": "application/json"}, timeout=60)  # fmt: skip
    assert ok.status_code == 200, ok.text  # a chunked body under the limit is read whole


@pytest.mark.parametrize("sent", [None, "trace-42.a:b_c", "x" * 129, "bad id\twith tab", "évil"])
def test_x_request_id_is_echoed_or_replaced(served: tuple, sent: str | None) -> None:
    url, _, _ = served
    headers = {} if sent is None else {"X-Request-Id": sent}
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]  # httpx would refuse the non-ASCII one as str
    for response in (chat(url, HELLO) if sent is None else _raw_chat(url, raw), httpx.get(url[:-3] + "/ready")):
        echoed = response.headers["x-request-id"]
        if sent == "trace-42.a:b_c" and response.request.url.path.endswith("completions"):
            assert echoed == sent
        else:
            assert echoed.startswith("req-") and len(echoed) == 36
    missing = chat(url, {"model": "tiny"})  # an error response carries it too
    assert missing.status_code == 400 and missing.headers["x-request-id"].startswith("req-")


def _raw_chat(url: str, headers: list[tuple[bytes, bytes]]) -> httpx.Response:
    return httpx.post(url + "/chat/completions", json=HELLO,
                      headers=[(b"Authorization", b"Bearer k"), *headers], timeout=60)  # fmt: skip
