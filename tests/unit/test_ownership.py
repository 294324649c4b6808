"""Partition ownership: claims follow the group's assignment, and every doubt leads to a new claim."""

from __future__ import annotations

import logging

import pytest

from stream_ndcg.ownership import Ownership, follow_assignment, to_claim
from stream_ndcg.source.base import Partition
from stream_ndcg.source.local import LocalSource

P0, P1, P2 = (Partition("events", n) for n in range(3))


def test_new_partitions_wait_for_a_claim_and_then_resume_from_the_stored_offset() -> None:
    ownership = Ownership()
    gone, new = ownership.sync({P0, P1}, revoked=set())
    assert (gone, new) == (set(), {P0, P1})
    assert not ownership.settled
    assert ownership.pending({P0, P1}) == [P0, P1]
    ownership.claimed(P0, "e0", 7)
    ownership.claimed(P1, "e1", None)
    assert ownership.settled and ownership.owns(P0)
    assert ownership.offsets() == {P0: 7}
    ownership.committed(P1, 3)
    assert ownership.offsets() == {P0: 7, P1: 3}


def test_a_partition_revoked_and_given_straight_back_is_claimed_again() -> None:
    ownership = Ownership()
    ownership.sync({P0}, revoked=set())
    ownership.claimed(P0, "e0", 1)
    gone, new = ownership.sync({P0}, revoked={P0})
    assert (gone, new) == ({P0}, {P0})
    assert not ownership.owns(P0) and ownership.pending({P0}) == [P0]


def test_partitions_no_longer_assigned_are_forgotten_claimed_or_not() -> None:
    ownership = Ownership()
    ownership.sync({P0, P1}, revoked=set())
    ownership.claimed(P0, "e0", 1)
    gone, new = ownership.sync({P2}, revoked=set())
    assert (gone, new) == ({P0, P1}, {P2})
    assert ownership.pending({P2}) == [P2] and len(ownership) == 0
    # A pending partition the group took away before it was claimed is dropped.
    assert ownership.pending(set()) == [] and ownership.settled


def test_a_store_failure_releases_every_claim() -> None:
    ownership = Ownership()
    ownership.sync({P0, P1}, revoked=set())
    ownership.claimed(P0, "e0", 1)
    ownership.claimed(P1, "e1", 2)
    ownership.release_all()
    assert len(ownership) == 0 and ownership.pending({P0, P1}) == [P0, P1]
    ownership.claimed(P0, "e2", 5)
    ownership.release([P0, P2])
    assert ownership.pending({P0, P1}) == [P0, P1]


def test_both_loops_step_follows_the_source_forgets_what_is_gone_and_claims_in_name_order(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stream_ndcg.ownership")
    source, ownership = LocalSource({"events": 3}), Ownership()
    forgotten: list[Partition] = []
    source.subscribe(["events"])
    follow_assignment(ownership, source, forgotten.append)
    epochs = iter(["e1", "e2", "e3"])
    claims = list(to_claim(ownership, source, lambda name: next(epochs)))
    assert claims == [(P0, "e1"), (P1, "e2"), (P2, "e3")]
    for partition, epoch in claims:
        ownership.claimed(partition, epoch, None)
    source.assign([P0, P2])
    follow_assignment(ownership, source, forgotten.append)
    assert forgotten == [P1] and [p for p, _ in ownership.owned()] == [P0, P2]
    assert [r.getMessage() for r in caplog.records] == ["assigned events:0, events:1, events:2", "revoked events:1"]
