"""One batch of one partition through a store, by the service's own BatchPipeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from stream_ndcg.engine import BatchOutcome, Engine
from stream_ndcg.events import Event, InvalidEvent, parse_event
from stream_ndcg.pipeline import BatchPipeline
from stream_ndcg.state.base import StateStore


def parsed(messages: Sequence[bytes]) -> list[Event | InvalidEvent]:
    return [parse_event(m) for m in messages]


def apply_batch(store: StateStore, engine: Engine, partition: str, events: Sequence[Event | InvalidEvent], *,
                epoch: str, next_offset: int, expected_offset: int | None | Literal["stored"] = "stored",
                event_clock: bool = True, now_ms: int | None = None) -> BatchOutcome:
    """Load, apply, commit: `BatchPipeline.apply`, with the expected offset read from the store.

    Loads the states of the queries `events` name and which of their impressions were applied
    already, applies the events with `engine`, and commits the outcome with `next_offset` in one
    atomic write under `epoch`. The engine's clock starts from the partition's stored clock with
    `event_clock`, else at `now_ms` (None: nothing expires). `expected_offset` is the offset the
    writer believes stored ("stored": whatever the store holds now). FencedError if the store
    refuses the commit. Returns the outcome written.
    """
    expected = store.next_offset(partition) if expected_offset == "stored" else expected_offset
    pipeline = BatchPipeline(store, engine, event_clock=event_clock)
    return pipeline.apply(partition, epoch, events, next_offset, expected, now_ms).outcome
