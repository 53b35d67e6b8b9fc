"""Change points in a series: where its mean shifts, and which run of raised segments is "the"
regression.

In:  a series of values (e.g. log p99 TTFT per step, or one 0/1 indicator per request).
Out: ``change_points`` -> the indices where the mean shifts (binary segmentation on squared
     error with a penalty from the series' own noise); ``best_split`` -> the single best split
     and what it gains; ``episode`` -> the run of segments that stays raised above the last
     level before it seen for a few steps, with the largest excess (what ``analytics.explain``
     explains); ``regression`` -> both at once: the segments' bounds and levels, and the episode.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

__all__ = ["Regression", "best_split", "change_points", "episode", "regression"]


def _noise(x: np.ndarray) -> float:
    diffs = np.diff(x)
    if len(diffs) < 2:
        return float(np.std(x)) or 1e-6
    mad = float(np.median(np.abs(diffs - np.median(diffs))))
    return max(1.4826 * mad / math.sqrt(2), 1e-6)


def best_split(x: np.ndarray, min_size: int) -> tuple[int, float]:
    n = len(x)
    if n < 2 * min_size:
        return -1, 0.0
    c1, c2 = np.cumsum(x), np.cumsum(x * x)
    total = c2[-1] - c1[-1] ** 2 / n
    k = np.arange(min_size, n - min_size + 1)
    left = c2[k - 1] - c1[k - 1] ** 2 / k
    right = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    gain = total - (left + right)
    i = int(np.argmax(gain))
    return int(k[i]), float(gain[i])


def change_points(
    values: np.ndarray, *, min_size: int = 3, penalty: float | None = None, max_breaks: int = 6
) -> list[int]:
    """Indices where the mean of ``values`` shifts (binary segmentation on squared error; a split
    is kept when it removes more than ``penalty``, by default 3 x noise variance x ln n, with the
    noise estimated robustly from successive differences)."""
    x = np.asarray(values, dtype=float)
    if penalty is None:
        penalty = 3.0 * _noise(x) ** 2 * math.log(max(len(x), 2))
    found: list[int] = []
    segments = [(0, len(x))]
    while segments and len(found) < max_breaks:
        best = None
        for a, b in segments:
            k, gain = best_split(x[a:b], min_size)
            if k > 0 and gain > penalty and (best is None or gain > best[2]):
                best = (a, b, gain, a + k)
        if best is None:
            break
        a, b, _gain, k = best
        found.append(k)
        segments.remove((a, b))
        segments += [(a, k), (k, b)]
    return sorted(found)


def episode(
    levels: list[float], bounds: list[int], rise: float = math.log(1.5), gap: int = 8, min_base: int = 3
) -> tuple[int, int, int] | None:
    """The regression to explain: (base, first, end) segment indices: the run of segments
    [first, end) that stay ``rise`` above segment ``base`` (dips back shorter than ``gap`` steps
    do not end it), with the largest excess (log level x steps). A short blip that falls back
    before the rise proper does not start it: the run starts at the first segment that is long
    or followed by another raised one. The base is the last segment before the run at least
    ``min_base`` steps long: a level seen for a step or two (a quiet first few seconds, a dip)
    is no baseline to measure a rise against."""
    best, best_excess = None, 0.0
    for first in range(1, len(levels)):
        based = next((b for b in range(first - 1, -1, -1) if bounds[b + 1] - bounds[b] >= min_base), None)
        if based is None:
            continue
        base = levels[based]
        if levels[first] - base < rise:
            continue
        last, end, excess = first, first + 1, 0.0
        while last < len(levels):
            width = bounds[last + 1] - bounds[last]
            if levels[last] - base >= rise:
                excess += (levels[last] - base) * width
                end = last + 1
            elif width >= gap or last == len(levels) - 1:
                break
            last += 1
        if excess > best_excess:
            best, best_excess = (based, first, end), excess
    if best is None:
        return None
    base, first, end = best
    base, first = _rise_proper(levels, bounds, (base, first, end), rise, min_base)
    raised = [i for i in range(first, end) if levels[i] - levels[base] >= rise]
    while len(raised) > 1 and bounds[raised[0] + 1] - bounds[raised[0]] < gap and raised[1] != raised[0] + 1:
        raised.pop(0)  # a blip, then a dip, then the rise proper
    return base, raised[0], end


# a later step up this many times the run's first (in log) is the rise proper. Not 2: seen on real engines
# (2026-12-07), a baseline whose first steps held a 17 ms p99 of 6 requests entered the run 3.9x up (0.13 ->
# 0.52 s, noise at 91 % busy); the rollout's step after it, 13.9x (ln 2.63 against 2 x 1.36), was not counted
# the rise, and the onset came a minute before the switch
PROPER = 1.5


def _rise_proper(
    levels: list[float], bounds: list[int], run: tuple[int, int, int], rise: float, min_base: int
) -> tuple[int, int]:
    """(base, first) of the rise proper inside a run: where a step up later in the run is more than
    ``PROPER`` times (in log) the run's first step and the level before it held for ``min_base``
    steps, that level is the baseline and the step is the regression (seen on real engines: a quiet
    first 20 s at p99 0.17 s, steady traffic at 0.45 s, then the rollout at 15 s; the steady level is
    no regression next to the rollout). A ramp of equal steps (1, 2, 4 s) stays one regression."""
    base, first, end = run
    entry = levels[first] - levels[base]
    for j in range(first + 1, end):
        if bounds[j] - bounds[first] < min_base or levels[j] - max(levels[first:j]) < max(rise, PROPER * entry):
            continue
        held = next((b for b in range(j - 1, first - 1, -1) if bounds[b + 1] - bounds[b] >= min_base), None)
        if held is not None:
            return held, j
    return base, first


class Regression(NamedTuple):
    bounds: list[int]  # 0, the change points, len(values)
    levels: list[float]  # each segment's mean
    found: tuple[int, int, int] | None  # ``episode``'s (base, first, end), or None


def regression(values: np.ndarray) -> Regression:
    """``change_points`` and ``episode`` on ``values`` at once: the segments and the regression."""
    x = np.asarray(values, dtype=float)
    bounds = [0, *change_points(x), len(x)]
    levels = [float(x[a:b].mean()) for a, b in itertools.pairwise(bounds)]
    return Regression(bounds, levels, episode(levels, bounds))
