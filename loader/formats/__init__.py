"""Shard formats, registered in one place, chosen by file suffix."""

from __future__ import annotations

from typing import Any

from .arrow_ipc import ArrowFormat
from .base import Format
from .parquet import ParquetFormat
from .tar import TarFormat

__all__ = ["FORMATS", "Format", "format_for", "format_of_url"]

FORMATS: dict[str, Any] = {"parquet": ParquetFormat, "arrow": ArrowFormat, "tar": TarFormat}
_BY_SUFFIX = {s: name for name, cls in FORMATS.items() for s in cls.suffixes}


def format_of_url(url: str) -> str | None:
    """The format a file's suffix names, or None."""
    lower = url.lower()
    return next((name for s, name in _BY_SUFFIX.items() if lower.endswith(s)), None)


def known_suffixes() -> str:
    return ", ".join(sorted(_BY_SUFFIX))


def format_for(name: str, **options: Any) -> Format:
    """An instance of the named format; unknown names list the known ones."""
    if name not in FORMATS:
        raise ValueError(f"unknown shard format {name!r}; known formats: {sorted(FORMATS)}")
    instance: Format = FORMATS[name](**options)
    return instance
