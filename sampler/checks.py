"""Integer arguments as torch takes them: Python ints and numpy integers, never bools."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["IntLike", "as_int"]

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
