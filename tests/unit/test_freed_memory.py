"""The service hands the C heap's free pages back to the system (`service.return_freed_memory`)."""

from __future__ import annotations

import platform
import threading
import time

import pytest

from stream_ndcg import service


def trimming_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "return-freed-memory"]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_trims_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    trim = service.malloc_trim()
    assert trim is not None
    calls: list[int] = []

    def counted(pad: int) -> int:
        calls.append(pad)
        return trim(pad)

    monkeypatch.setattr(service, "malloc_trim", lambda: counted)
    stop = service.return_freed_memory(every_s=0.01)
    deadline = time.monotonic() + 10
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls[:2] == [0, 0]
    stop()
    deadline = time.monotonic() + 10
    while trimming_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not trimming_threads()


def test_without_malloc_trim_no_thread_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "malloc_trim", lambda: None)
    before = len(trimming_threads())
    stop = service.return_freed_memory(every_s=0.01)
    assert len(trimming_threads()) == before
    stop()
