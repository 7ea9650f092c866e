"""The planted corpus source shared by the search tests (an importable module, not a conftest)."""

from __future__ import annotations

import json
import random
from pathlib import Path

# Eight short documents about an invented port town. Each mentions the id of another (bridges for
# multi-hop tasks) and holds rare terms (answers). "lighthouse" holds the planted needle for search tests.
PLANTED = {
    "harbor": (
        "The harbor office registers every ship that docks in Wendmouth. Each manifest is sealed with a "
        "quillstamp before the ship may leave. Manifests older than ten years are sent to the archive for "
        "safekeeping. The harbor master reports to the council every spring."
    ),
    "archive": (
        "The archive keeps sealed records in stone vaults below the town hall. Every vault door opens only with "
        "a brasskey issued by the warden. Records about debts are copied into the ledger once a month. Visitors "
        "may read the records on the first day of each season."
    ),
    "ledger": (
        "The ledger lists every debt owed to the town treasury. Entries are written in oxblood ink so that "
        "nobody can erase them. Disputed entries are settled by the council in a public hearing. The ledger has "
        "been kept without a gap since the great flood."
    ),
    "council": (
        "The council of Wendmouth has seven members chosen by lot. Its meetings open with the ringing of the "
        "marrowbell in the market square. The council sets the fees of the harbor and approves repairs to the "
        "lighthouse. Members serve for three years and may not serve twice in a row."
    ),
    "lighthouse": (
        "The lighthouse on Gull Point was rebuilt after the storm of the red winter. Its lamp burns "
        "whalefat mixed with pinewax, which gives the beam a green edge visible from forty miles. The keeper "
        "writes the weather into the logbook every hour. Repairs are paid from the harbor fees."
    ),
    "market": (
        "The market opens at dawn on the square beside the town hall. Fishmongers pay a stall fee to the "
        "treasury, recorded in the ledger. Spice traders weigh their goods on a bronze tallyscale kept by the "
        "market warden. The market closes when the marrowbell rings at noon."
    ),
    "warden": (
        "The warden guards the keys of the town and walks the walls at night. The warden carries a lantern of "
        "hammered tin and a staff of blackthorn. Lost keys must be reported to the archive within a day. The "
        "warden is appointed by the council for life."
    ),
    "storm": (
        "The storm of the red winter flooded the lower streets for nine days. Afterwards the town built a "
        "seawall of granite blocks cut at the Fellgate quarry. The lighthouse was the first building to be "
        "rebuilt. Survivors marked the high water line with a row of iron nails."
    ),
}


def write_planted(directory: Path) -> Path:
    """The planted documents as a JSONL corpus source."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "planted.jsonl"
    rows = [{"id": doc_id, "title": doc_id, "text": text} for doc_id, text in PLANTED.items()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- a corpus of namespaced, hyphenated ids (package-metadata style), for datagen and the search env ---------
_SYLLABLES = ("zor", "vik", "mal", "tren", "quo", "bas", "fel", "nir", "dov", "kes", "lum", "pra", "gid", "rho")
_ID_FORMS = ("pkg:{a}-{b}", "acme:{a}-{b}-2", "lib:{a}-{b}", "ns/{a}:{b}-x", "{a}++-12", "org.{a}:{b}-core")


def _word(rng: random.Random, used: set[str]) -> str:
    while True:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(3))
        if word not in used:
            used.add(word)
            return word


def namespaced_documents(n: int = 30, seed: int = 0) -> dict[str, str]:
    """``n`` documents whose ids look like ``pkg:name-part``, ``g++-12``, ``lib:a-b`` next to ``lib:a-b-c``.

    Every document holds rare invented words (answers) and names two others in whole sentences (bridges);
    ``lib:a-b-c`` is mentioned where ``lib:a-b`` is not, so prefix matching would make false bridges.
    """
    rng = random.Random(seed)
    used: set[str] = set()
    ids = [_ID_FORMS[i % len(_ID_FORMS)].format(a=_word(rng, used), b=_word(rng, used)) for i in range(n - 2)]
    ids += ["lib:a-b", "lib:a-b-c"]
    docs = {}
    for i, doc_id in enumerate(ids):
        others = [ids[(i + 1) % len(ids)], ids[(i + 7) % len(ids)]]
        lines = [
            f"The {_word(rng, used)} module parses every {_word(rng, used)} record before the build starts.",
            f"Its loader depends on {others[0]} for the {_word(rng, used)} step of each release.",
            f"Maintainers keep the {_word(rng, used)} table sorted by the {_word(rng, used)} column.",
            f"Older releases were replaced by {others[1]} after the {_word(rng, used)} migration.",
            f"Each archive is signed with a {_word(rng, used)} key and checked by the {_word(rng, used)} tool.",
        ]
        if doc_id == "lib:a-b":
            lines.append("Its successor lib:a-b-c keeps the same interface for the plugin loader.")
        docs[doc_id] = " ".join(lines)
    return docs


def write_namespaced(directory: Path, n: int = 30, seed: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "namespaced.jsonl"
    rows = [{"id": d, "title": d, "text": t} for d, t in namespaced_documents(n, seed).items()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
