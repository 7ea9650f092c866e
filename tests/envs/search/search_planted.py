"""The planted corpus source shared by the search tests (an importable module, not a conftest)."""

from __future__ import annotations

import json
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
