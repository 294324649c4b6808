"""The state-store contract, run for the in-memory store (the Redis stores run it in tests/integration)."""

from __future__ import annotations

import pytest

from stream_ndcg.state.base import StateStore
from stream_ndcg.state.memory import MemoryStore
from tests.support.store_contract import BUCKET, DEDUP_HORIZON, HORIZON, StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> StateStore:
        return MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)
