"""Integer arguments as torch takes them: Python ints and numpy integers, never bools."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["IntLike", "as_int", "parse_size"]

IntLike = int | np.integer[Any]  # what integer arguments accept


def as_int(name: str, value: object, minimum: int | None = None, what: str | None = None) -> int:
    """`value` as a Python int.

    Ints and numpy integers (``np.int64(2)``, ``np.int32(1)``: what ``np.arange`` or a
    config array hands out, and what torch's samplers accept) are taken; bools (Python's
    or numpy's), floats, strings and anything else raise ValueError quoting the value and
    its type, as does a value below `minimum`. `what` replaces "an int [>= minimum]" in
    the message.
    """
    expected = what or ("an int" if minimum is None else f"an int >= {minimum}")
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be {expected}, got {number}")
    return number


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(value: object, name: str = "cache_limit") -> int | None:
    """Bytes from an int or a string like ``"50GB"`` / ``"512MiB"`` (None stays None);
    ValueError naming the value otherwise."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        if found and found.group(2).upper() in _UNITS:
            size = int(float(found.group(1)) * _UNITS[found.group(2).upper()])
            if size > 0:
                return size
    raise ValueError(f"{name} must be bytes > 0 (an int, or a string like '50GB'), got {value!r}")
