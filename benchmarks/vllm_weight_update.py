"""Full-weight updates into a running vLLM server: in place vs a restart onto the new weights, side by side.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/vllm_weight_update.py --versions 3

For each version the SmolLM2 weights are perturbed (one parameter group at a time, then all of them), saved with
``save_pretrained`` and handed to the server: in place (``VLLMPolicy.load_weights``: pause until in-flight requests
finish, ``reload_weights``, drop the prefix cache, resume), and, as the baseline, by restarting the server onto
that directory (``VLLMServer.restart(model=...)``, what ``weight_reload = "restart"`` does). After each update one
turn is sampled and its logprobs are compared with transformers' forward of the weights that were meant to serve:
``max |served - meant|`` says whether the update really arrived (float32 server: ~1e-5 when it did).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from taskrl.chat import ChatFormat  # noqa: E402
from taskrl.policies.base import SamplingParams  # noqa: E402
from taskrl.policies.models import smollm2_cache_path  # noqa: E402
from taskrl.policies.vllm import VLLMPolicy  # noqa: E402
from taskrl.policies.vllm_server import VLLMServer, VLLMServerConfig  # noqa: E402
from taskrl.types import Message  # noqa: E402

GROUPS = ("model.embed_tokens", "layers.0.self_attn.q_proj", "layers.3.mlp.down_proj", "model.norm", "")
"""Parameter-name substrings perturbed per version ("" = every parameter)."""


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def logprobs_of(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", type=int, default=len(GROUPS), help="updates per side (cycling through GROUPS)")
    ap.add_argument("--restart-args", nargs="*", default=["-O0"], help="extra vLLM arguments of the restart side")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = smollm2_cache_path()
    print(f"cpu: {cpu_model()}; SmolLM2-135M-Instruct float32 ({sum(p.stat().st_size for p in base.glob('*.safetensors')) / 2**30:.2f} GiB)")  # noqa: E501
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    fmt = ChatFormat(tokenizer)
    prompt = fmt.prompt_ids([Message("user", "Name three colours.")])
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
    rows: dict[str, list[tuple[str, float, float]]] = {"in_place": [], "restart": []}
    with tempfile.TemporaryDirectory(prefix="vllm_weight_update_") as tmp:
        for side in ("in_place", "restart"):
            extra = list(args.restart_args) if side == "restart" else []
            server = VLLMServer(VLLMServerConfig(model=str(base), served_name="base", dtype="float32",
                                                 enable_lora=False, weight_updates=True, extra_args=extra))  # fmt: skip
            started = time.perf_counter()
            server.start()
            print(f"{side}: server start {time.perf_counter() - started:.1f} s", flush=True)
            policy = VLLMPolicy(server.base_url, "base", fmt, max_positions=2048, timeout_s=600)
            try:
                for v in range(1, args.versions + 1):
                    group = GROUPS[(v - 1) % len(GROUPS)]
                    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
                    gen = torch.Generator().manual_seed(v)
                    with torch.no_grad():
                        for name, p in model.named_parameters():
                            if group in name:
                                p.add_(torch.randn(p.shape, generator=gen) * 0.02 * p.abs().mean())
                    path = Path(tmp) / side / f"v{v}"
                    t0 = time.perf_counter()
                    model.save_pretrained(str(path))
                    saved = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    if side == "in_place":
                        asyncio.run(policy.load_weights(path, v))
                    else:
                        tokenizer.save_pretrained(str(path))
                        server.restart(model=path)
                        policy.use_weights(v)
                    loaded = time.perf_counter() - t0
                    turn = asyncio.run(policy.generate(token_ids=prompt, sampling=sampling))
                    off = (torch.tensor(turn.logprobs) - logprobs_of(model, prompt, turn.token_ids)).abs().max().item()
                    rows[side].append((group or "all", loaded, off))
                    print(f"  v{v} {group or 'all':28} save {saved:5.2f} s  load {loaded:7.2f} s  "
                          f"max |served - meant| {off:.1e}", flush=True)  # fmt: skip
            finally:
                server.stop()
    print("\n| update | group | in place: load s | max off | restart: load s | max off |")
    print("|---:|---|---:|---:|---:|---:|")
    for v, (a, b) in enumerate(zip(rows["in_place"], rows["restart"], strict=True), 1):
        print(f"| {v} | {a[0]} | {a[1]:.2f} | {a[2]:.1e} | {b[1]:.1f} | {b[2]:.1e} |")
    med_in, med_re = (statistics.median(r[1] for r in rows[s]) for s in ("in_place", "restart"))
    print(f"\nmedian load: in place {med_in:.2f} s, restart {med_re:.1f} s: in place is {med_re / med_in:.0f}x faster")


if __name__ == "__main__":
    main()
