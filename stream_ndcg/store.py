"""Deprecated import path: the store protocol is `stream_ndcg.state.base`, `MemoryStore`
`stream_ndcg.state.memory`. Kept for one release."""

import warnings

from stream_ndcg.state.base import (
    Commit,
    CommitInFlight,
    DeferredCommit,
    RowRead,
    Snapshot,
    StateStore,
)
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.window_sums import AggregateRead

__all__ = ["AggregateRead", "Commit", "CommitInFlight", "DeferredCommit", "MemoryStore", "RowRead", "Snapshot",
           "StateStore"]

warnings.warn("stream_ndcg.store is deprecated: import from stream_ndcg.state.base and stream_ndcg.state.memory",
              DeprecationWarning, stacklevel=2)
