"""mkdocs hook: the repository's README.md is the site's `readme/` page, and the links between it and
docs/ (``../README.md`` from a page, ``docs/x.md`` from the README) point at the site's pages."""

import re
from pathlib import Path

from mkdocs.structure.files import File

README = Path(__file__).resolve().parents[2] / "README.md"


def on_files(files, config):
    files.append(File.generated(config, "readme.md", content=README.read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "readme.md":
        return re.sub(r"\]\(docs/", "](", markdown)
    return markdown.replace("](../README.md", "](readme.md")
