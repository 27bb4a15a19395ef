"""Markdown tables and the few number formats the reports share."""
from __future__ import annotations

import math


def table(header: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table; ``align`` has one letter a column: ``l`` (left) or ``r`` (right)."""
    align = align or "l" * len(header)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join("" if cell is None else str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def percent(x, digits: int = 2) -> str:
    """``0.0135`` -> ``1.35%``; None -> ``-``."""
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 4.2 s, 42 s, 4.2 min, 4.2 h."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def mean_spread(values: list[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation (None for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def percent_spread(values: list[float]) -> str:
    """Errors over seeds: ``1.35%`` for one, ``1.35% ± 0.05`` (mean ± s.d., in points) for several."""
    mean, spread = mean_spread(values)
    return percent(mean) if spread is None else f"{percent(mean)} ± {100 * spread:.2f}"
