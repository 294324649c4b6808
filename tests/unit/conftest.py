"""tests/unit is hermetic: no network, no server and no tool in a subprocess. This makes it so rather
than hoping: a unit test that connects to anything but loopback, looks up another host's name, or
starts a program other than this interpreter running stream_ndcg's own command line fails at once
and says which tier it belongs to. (In-process servers on loopback, such as the exporter's HTTP
listener, and `python -m stream_ndcg.cli` run on files stay: they need nothing outside the checkout.)
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

ELSEWHERE = ("a test that needs a server belongs in tests/integration; helm, checkov or promtool in tests/deploy; "
             "a browser in tests/browser; a fuzzer in tests/fuzz")


def _loopback(host: object) -> bool:
    if host in (None, "", "localhost", b"localhost"):
        return True
    try:
        return ipaddress.ip_address(host.decode() if isinstance(host, bytes) else str(host)).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def hermetic(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    popen_init = subprocess.Popen.__init__
    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def guarded_popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **options: Any) -> None:
        argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        if [str(a) for a in argv[:3]] != [sys.executable, "-m", "stream_ndcg.cli"]:
            raise AssertionError(f"a unit test started {argv[:3]}: {ELSEWHERE}")
        popen_init(self, args, *rest, **options)

    def check_address(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            raise AssertionError(f"a unit test connected to {address}: {ELSEWHERE}")

    def guarded_connect(sock: socket.socket, address: Any) -> None:
        check_address(sock, address)
        connect(sock, address)

    def guarded_connect_ex(sock: socket.socket, address: Any) -> int:
        check_address(sock, address)
        return connect_ex(sock, address)

    def guarded_getaddrinfo(host: Any, *rest: Any, **options: Any) -> Any:
        if not _loopback(host):
            raise AssertionError(f"a unit test looked up {host!r}: {ELSEWHERE}")
        return getaddrinfo(host, *rest, **options)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    yield
