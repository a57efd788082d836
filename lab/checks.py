"""The one input check the lab repeats everywhere: a whole number (never a bool) of at least
`minimum`, or a number in a range, with an error that names the parameter, the value given and what
would work."""

from __future__ import annotations

import math
from typing import Any


def positive_int(name: str, value: Any, what: str = "a positive integer", minimum: int = 1) -> int:
    """`value` if it is an int >= `minimum`, else ValueError '`name`=value must be `what`'."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be {what}")
    return value


def number_in(
    name: str, value: Any, low: float, high: float, what: str, *, ends: str = "[]"
) -> float:
    """`value` if it is a real number between `low` and `high`, else ValueError naming it. `ends` as
    an interval is written: "[]" both ends included, "[)" `high` left out, "(]" `low` left out, "()"
    both left out."""
    if ends not in ("[]", "[)", "(]", "()"):
        raise ValueError(f"ends={ends!r} must be one of '[]', '[)', '(]', '()'")
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(value)
    ok = (
        ok
        and (value > low if ends[0] == "(" else value >= low)
        and (value < high if ends[1] == ")" else value <= high)
    )
    if not ok:
        raise ValueError(f"{name}={value!r} must be {what}")
    return value
