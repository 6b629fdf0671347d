"""Exceptions with enough context (file, line, key) to fix the input without a debugger."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ToolgraphError(Exception):
    """Base class: every error toolgraph raises on purpose."""


class DataError(ToolgraphError, ValueError):
    """Bad input data. The message starts with ``file:line:`` when a location is known."""

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None):
        self.path = str(path) if path is not None else None
        self.line = line
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(where + message)


class ConfigError(ToolgraphError, ValueError):
    """Bad configuration. The message names the key and, when known, the file."""


class ModelNotFoundError(ToolgraphError, OSError):
    """A text encoder name or path that cannot be resolved offline."""


@contextmanager
def no_space_is_a_data_error(where: str | Path, writing: str, left: str) -> Iterator[None]:
    """A full disk (or quota) inside the block: a DataError naming ``where``, saying what was being
    written and what is ``left``, instead of a traceback. Any other OSError passes through."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DataError(f"no space left on the device while writing {writing} ({e.strerror}); {left}", where) from None
