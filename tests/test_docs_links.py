"""Every relative link in README.md and docs/ points at a file that exists, and every #anchor at a
heading of its target (GitHub's slugs: lower case, punctuation dropped, spaces to hyphens, a repeated
heading numbered -1, -2, ...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(path: Path) -> list[str]:
    """The page's lines outside code fences."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slugs(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_", "", match.group(1))
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_slugs_follow_githubs_rule():
    page = REPO / "docs/results.md"
    assert (
        "8-is-vacos-smaller-drop-its-correction-or-its-step-size-the-2x2-study-20-seeds-a-cell-36-at-k-1-and-4"
        in slugs(page)
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for line in _prose(page):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(
                    f"{target}: no file {resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved}"
                )
            elif anchor and resolved.suffix == ".md" and anchor not in slugs(resolved):
                broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}")
    assert not broken, "\n".join(broken)
