"""free_port: ports below the kernel's ephemeral range, free, never the same one twice."""

from __future__ import annotations

import socket

import pytest

from stream_ndcg.devtools import ports


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low = ports._ephemeral_low()
    handed = [ports.free_port() for _ in range(50)]
    assert len(set(handed)) == len(handed)
    for port in handed:
        if low - ports._LOWEST >= ports._LEAST_ROOM:
            assert ports._LOWEST <= port < low
        with socket.socket() as sock:
            sock.bind((ports.LOOPBACK, port))


def test_a_port_in_use_or_handed_out_before_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    handed_before = ports.free_port()
    with socket.socket() as spare:
        spare.bind((ports.LOOPBACK, 0))
        free = spare.getsockname()[1]
    with socket.socket() as taken:
        taken.bind((ports.LOOPBACK, 0))
        taken.listen()
        picks = iter([taken.getsockname()[1], handed_before, free])
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65_000)
        monkeypatch.setattr(ports._picks, "randrange", lambda low, high: next(picks))
        assert ports.free_port() == free


def test_without_room_below_the_range_the_kernel_picks_and_no_port_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    handed_before = ports.free_port()
    asked: list[int] = []
    fresh = next(port for port in range(1024, 65_536) if port not in ports._handed_out)
    kernel_picks = iter([handed_before, fresh])

    def bound(port: int) -> int:
        asked.append(port)
        return next(kernel_picks)

    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports._LOWEST + 10)
    monkeypatch.setattr(ports, "_bound", bound)
    assert ports.free_port() == fresh
    assert asked == [0, 0]
