"""The services' foreground run: metrics served with the loop's readiness, SIGTERM and SIGINT
handed to its shutdown, and what was opened closed in order, however the loop ends."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest

from stream_ndcg.foreground import run_in_foreground


class Loop:
    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.handlers: list[object] = []

    def run(self) -> None:
        self.handlers = [signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)]
        if self.fails:
            raise RuntimeError("the loop failed")

    def shutdown(self, *_: object) -> None:
        return None

    def ready(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def handlers_restored() -> Iterator[None]:
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGTERM, saved[0])
    signal.signal(signal.SIGINT, saved[1])


@pytest.mark.parametrize("fails", [False, True])
def test_the_loop_runs_with_the_signals_handed_to_it_and_everything_is_closed(fails: bool) -> None:
    loop, done = Loop(fails), []
    served: list[Callable[[], bool]] = []

    def serve(ready: Callable[[], bool]) -> int:
        served.append(ready)
        return 9999

    def run() -> int:
        return run_in_foreground(loop, serve, "127.0.0.1", closing=[lambda: done.append("metrics"),
                                                                     lambda: done.append("api")])

    if fails:
        with pytest.raises(RuntimeError):
            run()
    else:
        assert run() == 0
    assert served == [loop.ready] and loop.handlers == [loop.shutdown, loop.shutdown]
    assert done == ["metrics", "api"]
