"""Stable seeds derived from any parts: the one seed function of the package (a leaf module, no imports).

    derive_seed(run_seed, "rollout", step)  # same value in every process, whatever PYTHONHASHSEED says
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int | str) -> int:
    """A stable 31-bit seed from any parts (independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def sft_only_seed(seed: int) -> int:
    """The seed of an SFT-only control arm that continues a warm start made with ``seed``. Its demonstrations come
    from the warm start's task file in a seeded order, so with the warm start's own seed its first steps would
    replay exactly the warm start's batches (a swarm run: 10 of 15 steps), an overfitting control instead of
    more SFT."""
    return derive_seed(seed, "sft_only")
