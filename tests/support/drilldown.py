"""The replay's side of the drill-down comparisons: its rows summed per query, as the index sums them."""

from __future__ import annotations

from collections.abc import Mapping

from stream_ndcg.drilldown.index import SegmentFilter, matches
from stream_ndcg.rows import add_into


def query_table(rows: Mapping[tuple[str, str], list[float]], wanted: SegmentFilter) -> dict[str, list[float]]:
    """Rows by (segment key, query) summed per query, over the segments `wanted` admits."""
    table: dict[str, list[float]] = {}
    for (segment, query_id), row in rows.items():
        if matches(segment, wanted):
            total = table.get(query_id)
            if total is None:
                table[query_id] = list(row)
            else:
                add_into(total, row)
    return table
