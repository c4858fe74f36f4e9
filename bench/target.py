"""One speed target of a bench, as every bench reports it and ``bench/summary.py`` lists it.

Each bench's closing JSON line carries ``"summary"``: one row per target, the same shape in
every bench (``Target.row``), so ``make bench`` can end with one table of every target
across the benches without knowing how each bench lays out its figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Target"]


@dataclass(frozen=True)
class Target:
    """``figure`` (None: not measured in this run) held to ``goal``: at most it when lower
    is better, at least it when higher is."""

    name: str
    figure: float | None
    goal: float
    better: Literal["lower", "higher"]
    unit: str = ""

    @property
    def met(self) -> bool | None:
        if self.figure is None:
            return None
        return self.figure <= self.goal if self.better == "lower" else self.figure >= self.goal

    def row(self) -> dict[str, Any]:
        return {
            "target": self.name,
            "figure": None if self.figure is None else round(self.figure, 4),
            "goal": f"{'<=' if self.better == 'lower' else '>='} {self.goal:.4g}{self.unit}",
            "unit": self.unit,
            "met": self.met,
        }
