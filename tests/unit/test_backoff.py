"""The service's backoff: it never spins and never waits past its cap."""

from __future__ import annotations

from stream_ndcg.backoff import Backoff


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    backoff = Backoff(base=0.1, cap=2.0)
    delays = [backoff.next_delay() for _ in range(20)]
    assert all(0.1 <= d <= 2.0 for d in delays)
    assert max(delays[10:]) > 0.2
    backoff.reset()
    assert backoff.next_delay() <= 0.2
