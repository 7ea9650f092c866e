"""``taskrl serve --backend vllm``: vLLM generates, the gateway keeps everything else (exact-token store, keys,
limits, feedback, router, canary, rollback).

    server, policy = start_vllm_backend("smollm2", settings={"threads": "0-1"})   # a supervised local vLLM
    serve({"taskrl": policy}, ...)                                                # then server.stop()

The served policy is a token-mode ``VLLMPolicy``: the gateway renders the chat and parses tool calls itself, as with
its in-process engine, so stored token ids are exactly what vLLM sampled. A canary version is a LoRA adapter loaded
into the same vLLM under its own name (``adapter_policy``); unloading it frees it there.
"""

from __future__ import annotations

from typing import Any

from taskrl.policies.vllm_server import VLLMServer, vllm_server_config


def start_vllm_backend(
    model: str, *, base_url: str | None = None, served_name: str = "base", settings: dict[str, Any] | None = None
) -> tuple[VLLMServer, Any]:
    """Start a local vLLM over ``model`` (smollm2 or a save_pretrained directory), or reach the vLLM at
    ``base_url`` serving ``served_name``, and return it with the ``VLLMPolicy`` the gateway serves.
    ``settings`` are ``VLLMServerConfig`` fields (threads, kv_cache_gib, max_model_len, port, ...)."""
    from taskrl.training.vllm_rollout import chat_format_of, model_dir, vllm_policy

    config = vllm_server_config(
        dict(settings or {}), model="" if base_url else model_dir(model), url=base_url or "", served_name=served_name
    )
    server = VLLMServer(config)
    server.start()
    try:
        policy = vllm_policy(server.base_url, server.served_model, chat_format_of(model),
                             max_positions=config.max_model_len, max_staleness=0,
                             logprobs_mode=config.logprobs_mode)  # fmt: skip
    except BaseException:
        server.stop()
        raise
    return server, policy


async def adapter_policy(base: Any, name: str, path: str) -> Any:
    """A ``VLLMPolicy`` on the LoRA adapter at ``path``, loaded into ``base``'s vLLM as ``name``; ``base`` keeps
    serving unchanged (a canary or new version of the gateway's router)."""
    from taskrl.policies.vllm import VLLMPolicy

    policy = VLLMPolicy(
        base.base_url, base.base_model, base.chat_format, name=name, api_key=base.api_key, timeout_s=base.timeout_s,
        max_positions=base.max_positions, max_staleness=0, logprobs_mode=base.logprobs_mode,
    )  # fmt: skip
    await policy.load_lora_adapter(name, path)
    return policy


async def unload_adapter(policy: Any, name: str) -> None:
    """Unload ``name`` from vLLM; ``policy`` (the one serving it) falls back to the base model for stragglers."""
    policy.use_base()
    await policy.unload_lora_adapter(name)
