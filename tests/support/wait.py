"""Waiting on what a test can observe, with a deadline: never a fixed sleep.

    samples = wait_until(lambda: ready_samples(service), timeout=60, describe="the service ready")
    holds(lambda: not service.ready(), seconds=5, describe="not ready while partition 0 is halted")

`wait_until` returns as soon as the state is reached, so a fast machine does not wait and a slow
one is given the whole deadline; on the deadline it fails and says what it waited for. `holds` is
for the other case, where the duration is what is tested ("stays 0 for a minute"): it checks the
state all along instead of once at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

Describe = str | Callable[[], str]


def _text(describe: Describe) -> str:
    return describe() if callable(describe) else describe


def wait_until(predicate: Callable[[], T | None], timeout: float, describe: Describe, interval: float = 0.2,
               ignoring: tuple[type[Exception], ...] = ()) -> T:
    """Poll `predicate` until it returns a true value and return that value; fail after `timeout`
    seconds with `describe` (a callable is called then: the logs as they are at the deadline).
    An exception raised by `predicate` (an assertion that must hold while waiting) ends the wait,
    except one of `ignoring`, which counts as not yet (a cluster that is moving its leaders)."""
    deadline = time.monotonic() + timeout
    while True:
        value: T | None = None
        try:
            value = predicate()
        except ignoring:
            pass
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not so after {timeout:g}s: {_text(describe)} (last: {value!r})")
        time.sleep(interval)


def holds(predicate: Callable[[], object], seconds: float, describe: Describe, interval: float = 0.2) -> None:
    """Check that `predicate` stays true for `seconds`, polling every `interval`; fail at the first
    time it is not."""
    end = time.monotonic() + seconds
    while True:
        if not predicate():
            raise AssertionError(f"no longer so after {seconds - (end - time.monotonic()):.1f}s: {_text(describe)}")
        if time.monotonic() >= end:
            return
        time.sleep(interval)
