"""Exceptions with enough context (file, line, key) to fix the input without a debugger."""

from __future__ import annotations

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
