"""Exponential backoff with full jitter, for every retry loop of the service."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with full jitter: never spins, never waits more than `cap` seconds."""

    def __init__(self, base: float = 0.2, cap: float = 10.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next_delay(self) -> float:
        self.failures += 1
        return random.uniform(self.base, min(self.cap, self.base * 2 ** self.failures))  # noqa: S311

    def reset(self) -> None:
        self.failures = 0
