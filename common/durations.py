"""Durations as people write them in configuration: ``"90s"``, ``"5m"``, ``"1h30m"``, ``"3d"``.

In:  a text, or a number of seconds.
Out: ``parse_duration`` -> seconds (a float), ``ValueError`` naming what is wrong; ``Duration``,
     a pydantic field type that holds seconds and reads either form (alert rules, receivers'
     timings, rule tests, ``--since`` on the command line).
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

__all__ = ["Duration", "parse_duration"]

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d|w))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: str | float) -> float:
    """``"90s"``, ``"5m"``, ``"1h30m"``, ``"3d"`` (or a number of seconds) -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0 or math.isnan(value):
            raise ValueError(f"a duration cannot be negative: {value}")
        return float(value)
    text = str(value).strip()
    if text == "0":
        return 0.0
    if not _DURATION.match(text):
        raise ValueError(f"not a duration: {text!r} (write e.g. 30s, 5m, 1h30m, 3d)")
    return sum(float(n) * _UNIT[u] for n, u in _PART.findall(text))


# a duration field: "90s", "5m", "1h30m" or a number of seconds, held as seconds
Duration = Annotated[float, BeforeValidator(parse_duration)]
