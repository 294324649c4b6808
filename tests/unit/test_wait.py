"""tests/support/wait.py: waiting on an observable state with a deadline, and checking a state holds."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.support.wait import holds, wait_until


def test_wait_until_returns_the_first_true_value_without_waiting_further() -> None:
    calls = itertools.count()
    started = time.monotonic()
    assert wait_until(lambda: [n for n in [next(calls)] if n >= 2], timeout=5, describe="third call",
                      interval=0.01) == [2]
    assert time.monotonic() - started < 1


def test_wait_until_fails_at_the_deadline_saying_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"not so after 0.2s: the gauge at 1, read at the deadline \(last: 0\)"):
        wait_until(lambda: 0, timeout=0.2, describe=lambda: "the gauge at 1, read at the deadline", interval=0.05)
    assert 0.2 <= time.monotonic() - started < 2


def test_an_assertion_inside_the_predicate_ends_the_wait() -> None:
    def never_more() -> bool:
        raise AssertionError("counted twice")

    with pytest.raises(AssertionError, match="counted twice"):
        wait_until(never_more, timeout=60, describe="unreached")


def test_holds_checks_all_along_and_fails_at_the_first_break() -> None:
    values = iter([True, True, False, True])
    with pytest.raises(AssertionError, match="no longer so after .*: ready"):
        holds(lambda: next(values), seconds=60, describe="ready", interval=0.01)
    started = time.monotonic()
    holds(lambda: True, seconds=0.2, describe="ready", interval=0.05)
    assert time.monotonic() - started >= 0.2


def test_an_exception_it_is_told_to_ignore_counts_as_not_yet() -> None:
    calls = itertools.count(1)

    def predicate() -> int:
        call = next(calls)
        if call < 3:
            raise ValueError("moving")
        return call

    assert wait_until(predicate, timeout=5, describe="a third try", interval=0.01, ignoring=(ValueError,)) == 3
    with pytest.raises(KeyError):
        wait_until(lambda: {"present": 1}["missing"], timeout=5, describe="never", interval=0.01,
                   ignoring=(ValueError,))
