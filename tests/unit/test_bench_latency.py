"""The latency bench's search for the sustained maximum: which paced load counts as kept up with,
and which rate it tries next."""

from __future__ import annotations

import math

from bench.latency_bench import BACKLOG_S, REACHED, kept_up, next_rate


def test_a_load_is_kept_up_with_when_it_reached_its_rate_and_the_service_is_at_most_a_second_behind() -> None:
    assert kept_up(2000, 2000, int(BACKLOG_S * 2000))
    assert not kept_up(2000, 2000, int(BACKLOG_S * 2000) + 1)
    # A load that did not reach its rate measures the load's producer, not the service.
    assert kept_up(2000, REACHED * 2000, 0)
    assert not kept_up(2000, REACHED * 2000 - 1, 0)


def test_the_rate_doubles_until_one_fails_halves_until_one_holds_then_bisects_geometrically() -> None:
    assert next_rate(2000, None, 2000) == 4000
    assert next_rate(2000, 2000, None) == 1000
    assert math.isclose(next_rate(4000, 4000, 2000), math.sqrt(8_000_000))
    # A search of five steps from 2000 where 3000 is the service's limit ends within 10% of it.
    rate, failed, kept = 2000.0, None, None
    for _ in range(5):
        if rate <= 3000:
            kept = max(rate, kept or 0.0)
        else:
            failed = min(rate, failed or math.inf)
        rate = next_rate(rate, failed, kept)
    assert kept is not None and failed is not None and 3000 / 1.1 <= kept <= 3000 < failed <= 3000 * 1.1
