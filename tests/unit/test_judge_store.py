"""The in-memory judge store meets the judge-store contract (tests/support/judge_store_contract.py)."""

from __future__ import annotations

import pytest

from stream_ndcg.errors import ConfigError
from stream_ndcg.state.judge_store import JudgeStore, MemoryJudgeStore
from tests.support.judge_store_contract import JudgeStoreContract


class TestMemoryJudgeStore(JudgeStoreContract):
    @pytest.fixture
    def store(self) -> JudgeStore:
        return MemoryJudgeStore()


def test_judge_state_in_another_format_is_refused() -> None:
    store = MemoryJudgeStore()
    store.format = "9"
    with pytest.raises(ConfigError, match="format version '9'"):
        store.adopt()
