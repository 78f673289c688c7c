"""MkDocs hooks (mkdocs.yml): links from docs/ to the rest of the repository, checked as strictly as
MkDocs checks links between pages.

A page may link to a file outside docs/ (``../manifests/admission.yaml``, ``../README.md#tests``):
it works on GitHub, but MkDocs only knows docs/ and would call it broken. Each such link is checked
here instead (the file exists; a Markdown file has the heading the anchor names, by GitHub's
slugs, which the site uses too) and pointed at the repository: ``GPUSLICE_REPO_URL`` (mkdocs.yml's
``repo_url``) when the site is published, else the file in this checkout. A broken one is a warning,
which ``mkdocs build --strict`` (``make docs``) turns into a failure.
"""

from __future__ import annotations

import logging
import re
from functools import cache
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page
from pymdownx.slugs import slugify

log = logging.getLogger("mkdocs.plugins.gpuslice")
# ](../path#anchor) outside code spans; a link text may end on the line before.
LINK = re.compile(r"\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_slug = slugify(case="lower")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors GitHub gives a Markdown file's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = _slug(heading, "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return frozenset(found)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    docs = Path(config.docs_dir).resolve()
    root = docs.parent
    source = Path(page.file.abs_src_path or docs / page.file.src_path).parent

    def outside(match: re.Match[str]) -> str:
        target = (source / match.group(1)).resolve()
        anchor = match.group(2) or ""
        if target.is_relative_to(docs):
            return match.group(0)  # a page or an image: MkDocs checks it
        where = f"Doc file '{page.file.src_path}' links to '{match.group(1)}{anchor}'"
        if not target.is_relative_to(root) or not target.exists():
            log.warning("%s, which is not in the repository", where)
            return match.group(0)
        if anchor and target.suffix == ".md" and anchor[1:] not in anchors(target):
            log.warning("%s, but there is no heading '%s' in %s", where, anchor[1:], target.relative_to(root))
        relative = target.relative_to(root).as_posix()
        if config.repo_url:
            kind = "tree" if target.is_dir() else "blob"
            return f"]({config.repo_url.rstrip('/')}/{kind}/main/{relative}{anchor})"
        return f"]({target.as_uri()}{anchor})"

    parts = re.split(r"(```.*?```|`[^`\n]*`)", markdown, flags=re.S)
    return "".join(part if i % 2 else LINK.sub(outside, part) for i, part in enumerate(parts))
