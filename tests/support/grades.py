"""A query's gains moved as a test's rounds move them.

    before = move_grades(gains, {"a": 3.0, "b": None})   # "b" ungraded; `before` what they had
"""

from __future__ import annotations


def move_grades(gains: dict[str, float], moves: dict[str, float | None]) -> dict[str, float | None]:
    """`gains` with each document of `moves` given its new gain (None: no grade any more); the
    gains those documents had before, as `ListSquares.sums` takes them."""
    before = {doc: gains.get(doc) for doc in moves}
    for doc, gain in moves.items():
        if gain is None:
            gains.pop(doc, None)
        else:
            gains[doc] = gain
    return before
