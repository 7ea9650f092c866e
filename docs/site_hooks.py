"""MkDocs hooks: the repository's README becomes the site's home page and benchmarks/RESULTS.md its results page.
Their repository-relative links are rewritten to site pages; a link to a file outside docs/ (a script, a recipe)
becomes its path in code, since the offline site does not carry the sources."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"index.md": ROOT / "README.md", "results.md": ROOT / "benchmarks" / "RESULTS.md"}


def on_files(files, config):  # noqa: ANN001, ANN201 (mkdocs hook signature)
    for name in PAGES:
        files.append(File.generated(config, name, content=""))
    return files


def _link(match: re.Match[str], source: Path) -> str:
    """A link written relative to ``source``'s folder, as it should read from the site's root."""
    text, target = match.group(1), match.group(2)
    if re.match(r"^[a-z]+:|^#", target):
        return match.group(0)
    path, _, anchor = target.partition("#")
    resolved = (source.parent / path).resolve()
    site_page = next((name for name, path in PAGES.items() if path == resolved), None)
    if site_page is None and not resolved.is_relative_to(ROOT / "docs"):
        shown = str(resolved.relative_to(ROOT))
        return text if text.strip("`") == shown else f"{text} (`{shown}`)"
    where = site_page or str(resolved.relative_to(ROOT / "docs"))
    return f"{text}({where}{'#' + anchor if anchor else ''})"


def on_page_read_source(page, config):  # noqa: ANN001, ANN201 (mkdocs hook signature)
    source = PAGES.get(page.file.src_uri)
    return source.read_text() if source is not None else None


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001, ANN201 (mkdocs hook signature)
    """Links as written for the repository (relative to the file's own folder) made to work on the site, whose
    pages live where docs/ is the root; generated pages are placed in docs/ at the site page's path."""
    source = PAGES.get(page.file.src_uri) or ROOT / "docs" / page.file.src_uri
    relocated = ROOT / "docs" / page.file.src_uri

    def rewrite(match: re.Match[str]) -> str:
        link = _link(match, source)
        if link == match.group(0) or "](" not in link:
            return link
        text, target = link[: link.index("](") + 1], link[link.index("](") + 2 : -1]
        path, _, anchor = target.partition("#")
        relative = os.path.relpath(ROOT / "docs" / path, relocated.parent)
        return f"{text}({relative}{'#' + anchor if anchor else ''})"

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", rewrite, markdown)
