"""A self-contained HTML page opened in headless Chromium (Debian's package): its DOM after the page's
script ran, checked for script errors and network references, and a screenshot that is a real PNG.
Skips where Chromium is missing, fails in CI (.ci/run installs it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def rendered_dom(page: Path, tmp: Path, window: str = "1000,800") -> str:
    """The DOM of ``page`` once its script ran to its end (``data-ready="1"``, an empty ``#errors``)."""
    browser = chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Chromium (.ci/run installs Debian's chromium package)")
        pytest.skip("Chromium is not installed (apt-get install chromium): the page is not rendered here")
    assert not re.search(r"""(src|href)=["']?https?:""", page.read_text())  # nothing fetched from the network
    flags = ["--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert 'data-ready="1"' in dom  # the page's script ran to its end
    assert re.search(r'<pre id="errors">\s*</pre>', dom), "script errors on the page"
    shot = tmp / "page.png"
    subprocess.run([browser, *flags, f"--window-size={window}", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
    return dom
