"""The README and the docs/ pages link to each other: every relative link points to a file of the
repository, and a ``#anchor`` to a heading of that page (GitHub's heading ids)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
DOCS_PAGES = {"index", "getting-started", "configuration", "data", "dense", "usage-and-rerank", "dependencies",
              "graph", "general", "agents-and-serving", "your-own-catalog", "metrics", "results", "development", "architecture", "api"}


def _prose(text: str) -> str:
    """The page without fenced code blocks and inline code (where brackets are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's ids for the headings of a markdown page."""
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.sub(r"^```.*?^```", "", path.read_text(),
                                                                  flags=re.S | re.M), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in out:
            n += 1
            candidate = f"{slug}-{n}"
        out.add(candidate)
    return out


def _links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_point_to_existing_files_and_headings(page):
    bad = []
    for target in _links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.is_relative_to(ROOT):  # outside the repository (e.g. ../shared): not ours to check
            continue
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_readme_is_a_short_front_page_that_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert {p.stem for p in (ROOT / "docs").glob("*.md")} == DOCS_PAGES
    linked = {Path(t.partition("#")[0]).stem for t in _links(ROOT / "README.md") if t.startswith("docs/")}
    assert DOCS_PAGES <= linked, f"README does not link {sorted(DOCS_PAGES - linked)}"
    index = {Path(t.partition("#")[0]).stem for t in _links(ROOT / "docs" / "index.md")}
    assert DOCS_PAGES - {"index"} <= index, f"docs/index.md does not list {sorted(DOCS_PAGES - {'index'} - index)}"
