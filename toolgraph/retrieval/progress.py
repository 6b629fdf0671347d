"""Progress bars with an ETA for the long steps of a command: encoding, indexing, ranking a split.

A bar is tqdm on stderr, e.g. ``encoding tools:  40%|████      | 4096/10240 [00:55<01:22, 74.30text/s]``
(elapsed<remaining). ``TQDM_DISABLE=1``, tqdm's own switch, silences them all: ours, bm25s's, and
Lightning's (Rich, ``Epoch 1/3 ━━━ 5/15 0:00:01 • 0:00:04``: ``training`` and ``depgraph`` pass
``progress_enabled()`` as ``enable_progress_bar``). It is read here, when a bar starts, because tqdm reads it only once at import and ignores it
whenever the caller passes ``disable=`` (bm25s and Lightning always do).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from tqdm.auto import tqdm


def progress_enabled(wanted: bool = True) -> bool:
    """``wanted``, unless ``TQDM_DISABLE`` is set (to anything but "", "0" or "false")."""
    return bool(wanted) and os.environ.get("TQDM_DISABLE", "").strip().lower() in ("", "0", "false")


def batches(n: int, size: int, progress: bool | str = False, unit: str = "query",
            leave: bool = True) -> Iterator[slice]:
    """Slices of ``size`` covering ``range(n)``. With ``progress`` (True, or the bar's label) a bar
    over the ``n`` items advances as the loop body finishes each slice; ``leave``: its last state
    stays on screen (False for a step inside another bar's step)."""
    bar = tqdm(total=n, desc=progress if isinstance(progress, str) else None, unit=unit, leave=leave,
               disable=not progress_enabled(bool(progress)))
    try:
        for lo in range(0, n, size):
            yield slice(lo, lo + size)
            bar.update(min(size, n - lo))
    finally:
        bar.close()
