"""The stored form of the experiments' cells (state format 6).

An experiment's cells of one partition are a hash of ``<figure>\x1f<arm>\x1f<query>`` -> sum
(figures from `experiments.figures`; a figure name and an arm hold no control character, so the
first two \x1f end them), and ``from`` -> the first bucket the partition counts (`state.base`).
Sums are written as `state.format.encode_sum` writes them.
"""

from __future__ import annotations

from stream_ndcg.experiments import CellChanges
from stream_ndcg.state.format import encode_sum


def cell_field(arm: str, query_id: str, figure: str) -> str:
    """An experiment cell's field (the module docstring)."""
    return f"{figure}\x1f{arm}\x1f{query_id}"


def decode_cell_field(raw: bytes | str) -> tuple[str, str, str] | None:
    """(arm, query, figure) of an experiment hash's field; None for its first bucket's."""
    figure, _, rest = (raw.decode() if isinstance(raw, bytes) else raw).partition("\x1f")
    if not rest:
        return None
    arm, _, query_id = rest.partition("\x1f")
    return arm, query_id, figure


def cell_increments(changes: CellChanges) -> list[tuple[str, int, list[tuple[int, str, str]]]]:
    """A commit's experiment changes: [(name, its first bucket, [(bucket, field, increment)])]."""
    return [(name, first_bucket, [(bucket, cell_field(arm, query_id, figure), encode_sum(change))
                                  for (bucket, arm, query_id, figure), change in cells.items() if change])
            for name, (first_bucket, cells) in changes.items()]
