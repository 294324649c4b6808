"""The segment label policy: which labels an impression's segment is exported by, and how many values."""

from __future__ import annotations

from stream_ndcg.events import Impression
from stream_ndcg.state.base import StateStore
from stream_ndcg.vocabulary import MISSING, OVERFLOW


class SegmentProjector:
    """Maps an impression's segment to the allowlisted labels, each capped in distinct values.

    A label the impression lacks becomes `vocabulary.MISSING`; a value past the cap becomes
    `vocabulary.OVERFLOW`. The admitted values live in the store, so every instance agrees.
    """

    # Segments seen, remembered with their projection (admission never changes its answer);
    # forgotten all at once when this many, since producers may send any number of them.
    REMEMBERED = 10_000

    def __init__(self, store: StateStore, labels: tuple[str, ...], cap: int) -> None:
        self.store = store
        self.labels = labels
        self.cap = cap
        self._projections: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}

    def project(self, event: Impression) -> Impression:
        projected = self._projections.get(event.segment)
        if projected is None:
            projected = self._project(event.segment)
            if projected == event.segment:
                # Remembered as the segment itself, so that the usual impression is passed on as it is.
                projected = event.segment
            if len(self._projections) >= self.REMEMBERED:
                self._projections.clear()
            self._projections[event.segment] = projected
        if projected is event.segment:
            return event
        return Impression(event.impression_id, event.query_id, event.ts, event.results, projected, event.event_id)

    def _project(self, segment: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        given = dict(segment)
        projected = []
        for label in self.labels:
            value = given.get(label)
            if value is None:
                value = MISSING
            elif value in (MISSING, OVERFLOW) or not self.store.admit(label, value, self.cap):
                value = OVERFLOW
            projected.append((label, value))
        return tuple(projected)
