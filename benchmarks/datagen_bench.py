"""Datagen benchmark: building the multi-hop bridge index (which sentences mention which document id).

    .venv/bin/python benchmarks/datagen_bench.py               # old vs new at 1k/2k/4k docs, new alone at 20k
    .venv/bin/python benchmarks/datagen_bench.py --full        # also the old index at 20k docs (minutes)

Old: one case-insensitive regex alternation of every document id, matched against every sentence (what
``taskrl datagen multihop`` did before issue 18): each position of each sentence tries every id, so the time
grows with documents x ids. New: ``BridgeIndex`` (``taskrl/datagen/bridges.py``) tokenises each sentence into
whole id tokens and looks each up in a dict of normalised ids: one pass over the text. Both run in this process
on the same synthetic corpus of namespaced, hyphenated ids (``pkg7:name-part``), so machine load affects both
sides alike. Target: 20k documents in < 30 s. Besides speed it prints how many (target, source, sentence)
bridges each finds: the old one also counts ``a-b`` inside ``a-b-c`` (prefix matches), the new one does not.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import time

from taskrl.datagen.bridges import BridgeIndex

WORDS = ("harbor", "ledger", "module", "parses", "record", "release", "loader", "archive", "signed", "table",
         "quietly", "under", "every", "zone", "yield", "version", "with", "in", "on", "build")  # fmt: skip


def synthetic_corpus(n_docs: int, sentences_per_doc: int = 10, seed: int = 0) -> tuple[list[str], dict[str, list]]:
    """About ``n_docs`` ids like ``qwfx:abcde-part`` and ``qwfx:abcde-part-x`` (the first a prefix of the second),
    each with sentences naming two other documents; a tenth of the mentions name ``ID-legacy``, no document."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    names = ["".join(rng.choice(letters) for _ in range(rng.randint(4, 9))) for _ in range(n_docs // 2 + 1)]
    ids = list(dict.fromkeys(f"{names[i // 2]}:{names[(i // 2 + 1) % len(names)]}-part" + ("-x" if i % 2 else "")
                             for i in range(n_docs)))  # fmt: skip
    sentences = {}
    for doc_id in ids:
        lines = []
        for j in range(sentences_per_doc):
            words = " ".join(rng.choice(WORDS) for _ in range(10))
            if j < 2:  # one mention in ten names a variant that is no document (``...-legacy``)
                suffix = "-legacy" if rng.random() < 0.1 else ""
                words += f" depends on {ids[rng.randrange(len(ids))]}{suffix} for builds"
            lines.append(f"The {words}.")
        sentences[doc_id] = lines
    return ids, sentences


def old_mentions(ids: list[str], sentences: dict[str, list[str]]) -> dict[str, list[tuple[str, str]]]:
    """The pre-issue-18 index: one alternation over all ids, longest first, matched with word boundaries."""
    by_lower = {d.lower(): d for d in ids}
    names = "|".join(re.escape(d) for d in sorted(ids, key=len, reverse=True))
    mention_re = re.compile(rf"(?<![\w])(?:{names})(?![\w])", re.I)
    found: dict[str, list[tuple[str, str]]] = {}
    for source, texts in sentences.items():
        for sentence in dict.fromkeys(texts):
            for target in sorted({by_lower[m.lower()] for m in mention_re.findall(sentence)} - {source}):
                found.setdefault(target, []).append((source, sentence))
    return found


def new_mentions(ids: list[str], sentences: dict[str, list[str]]) -> dict[str, list[tuple[str, str]]]:
    return BridgeIndex(ids, "casefold").mentions(sentences)


def timed(fn, *args) -> tuple[float, int]:  # noqa: ANN001, ANN002 - a bench helper
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, sum(len(v) for v in result.values())


def cpu_model() -> tuple[str, bool]:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "?")
    return model, "amx_bf16" in text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,2000,4000", help="documents at which old and new both run")
    parser.add_argument("--target-docs", type=int, default=20_000, help="documents for the < 30 s target")
    parser.add_argument("--full", action="store_true", help="also run the old index at --target-docs")
    args = parser.parse_args()
    model, amx = cpu_model()
    print(f"CPU: {model}; amx_bf16: {'yes' if amx else 'no'}")
    print(f"{'documents':>10} {'old s':>10} {'new s':>10} {'speed-up':>9} {'old bridges':>12} {'new bridges':>12}")
    sizes = [int(s) for s in args.sizes.split(",")]
    for n in [*sizes, args.target_docs]:
        ids, sentences = synthetic_corpus(n)
        new_s, new_count = timed(new_mentions, ids, sentences)
        if n in sizes or args.full:
            old_s, old_count = timed(old_mentions, ids, sentences)
            print(f"{n:>10} {old_s:>10.2f} {new_s:>10.3f} {old_s / new_s:>8.0f}x {old_count:>12} {new_count:>12}")
        else:
            print(f"{n:>10} {'(--full)':>10} {new_s:>10.3f} {'':>9} {'':>12} {new_count:>12}")
    print(f"target: {args.target_docs} documents in < 30 s with the new index: {'met' if new_s < 30 else 'MISSED'}")


if __name__ == "__main__":
    main()
