"""Intervals and verdicts for the evaluation's signals.

The unit is the conversation: arms are assigned per conversation, so each signal is a ratio of sums over
conversations (repeated calls per request: the conversations' repeated calls over their requests). Its
95% interval is the ratio estimator's, with the variance of the conversations' residuals (the usual
cluster-robust, delta-method form), which for a ratio over 1 per conversation is the mean's. The
difference between arms (projected minus held out) has the two variances summed. A share of yes/no
outcomes (shadow agreement) has a Wilson interval.

A verdict says what the difference means for the agents: `better` or `worse` when its interval excludes
zero (in the direction the signal counts as good), `no_difference` when it includes zero, and
`insufficient_data` when either arm has fewer than `MIN_CONVERSATIONS` conversations (or nothing to
divide by).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

Z95 = 1.959963984540054
MIN_CONVERSATIONS = 10


@dataclass(frozen=True)
class Estimate:
    count: float  # the numerator's sum
    base: float  # the denominator's sum
    units: int  # conversations
    rate: float | None
    variance: float | None

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.rate is None or self.variance is None:
            return None
        half = Z95 * math.sqrt(self.variance)
        return (self.rate - half, self.rate + half)


def ratio(pairs: Sequence[tuple[float, float]]) -> Estimate:
    """Σy / Σx over conversations' (y, x), with the ratio estimator's variance."""
    n = len(pairs)
    total_y = sum(y for y, _ in pairs)
    total_x = sum(x for _, x in pairs)
    if n == 0 or total_x <= 0:
        return Estimate(total_y, total_x, n, None, None)
    rate = total_y / total_x
    if n < 2:
        return Estimate(total_y, total_x, n, rate, None)
    mean_x = total_x / n
    residuals = sum((y - rate * x) ** 2 for y, x in pairs)
    variance = residuals / (n * (n - 1) * mean_x ** 2)
    return Estimate(total_y, total_x, n, rate, variance)


def difference(treated: Estimate, control: Estimate) -> tuple[float, tuple[float, float]] | None:
    """treated - control, with its 95% interval (None when either has no rate or variance)."""
    if treated.rate is None or control.rate is None or treated.variance is None or control.variance is None:
        return None
    value = treated.rate - control.rate
    half = Z95 * math.sqrt(treated.variance + control.variance)
    return value, (value - half, value + half)


def verdict(treated: Estimate, control: Estimate, lower_is_better: bool) -> str:
    if min(treated.units, control.units) < MIN_CONVERSATIONS:
        return "insufficient_data"
    found = difference(treated, control)
    if found is None:
        return "insufficient_data"
    _, (low, high) = found
    if low > 0:
        return "worse" if lower_is_better else "better"
    if high < 0:
        return "better" if lower_is_better else "worse"
    return "no_difference"


def wilson(successes: int, trials: int) -> tuple[float, float] | None:
    """The Wilson score 95% interval of a share."""
    if trials <= 0:
        return None
    share = successes / trials
    z2 = Z95 * Z95
    centre = (share + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z95 * math.sqrt(share * (1 - share) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (no rounding off zero)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return (low, high)
