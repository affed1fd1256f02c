"""The documentation: README.md stays short, and every relative link in README.md, docs/*.md and
benchmarks/README.md resolves to a file (and heading) inside the repository."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [
    REPO / "README.md",
    REPO / "benchmarks" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
]
README_MAX_LINES = 250

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    return _CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for h in _HEADING.findall(_FENCE.sub("", path.read_text())):
        s = slug(h)
        n = seen.get(s, 0)
        found.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return found


def links(path: Path) -> list[str]:
    return _LINK.findall(_prose(path.read_text()))


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if REPO not in dest.parents and dest != REPO:
            bad.append(f"{target} (outside the repository)")
        elif not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no such heading)")
    return bad


def test_readme_is_short():
    n = len(REPO.joinpath("README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    assert doc.exists()
    assert broken_links(doc) == []


def test_checker_catches_broken_links(tmp_path, monkeypatch):
    """The checker itself: a missing file, a missing heading and a path leaving the repository
    are reported; a good file link, a good anchor and an external URL are not."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## The `tpuv4` preset, modelled\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#the-tpuv4-preset-modelled) [ok](https://example.org)\n"
        "[bad](docs/b.md) [bad](docs/a.md#nope) [bad](../outside.md)\n"
        "`[not a link](docs/c.md)`\n```\n[not a link](docs/d.md)\n```\n"
    )
    assert broken_links(doc) == [
        "docs/b.md (no such file)",
        "docs/a.md#nope (no such heading)",
        "../outside.md (outside the repository)",
    ]


def test_slug_matches_github():
    assert slug("Config (`schedule:`)") == "config-schedule"
    assert slug("`--instance` mode (upstream's semantics)") == "--instance-mode-upstreams-semantics"
    assert slug("Stage 2: the architecture space") == "stage-2-the-architecture-space"
