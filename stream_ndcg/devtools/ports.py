"""Free loopback ports for the servers and services that tests, benches and dev tools start.

A port the kernel hands out for port 0 comes from its ephemeral range, the same range it draws
the local ports of outgoing connections from: between the moment a port is found free and the
moment a server binds it, a client's connection (to Kafka, to Redis) can take it, and the
server fails with "Address already in use". The ports handed out here lie below that range,
where no outgoing connection takes one, and a process never hands out the same port twice.
Where the range leaves too little room below it, the kernel picks (the race stays possible).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"

# Below Linux's default ephemeral range (32768-60999) and above the ports services commonly use.
_LOWEST = 20_000
# Fewer free ports than this below the ephemeral range: let the kernel pick.
_LEAST_ROOM = 1_000
_TRIES = 200
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Its own generator: a test that seeds the module `random` must not make the picks repeat.
_picks = random.Random()  # noqa: S311 - not a secret
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on and not handed out before by this process, outside the
    kernel's ephemeral range when that range leaves room below it."""
    below = _ephemeral_low()
    room = below - _LOWEST >= _LEAST_ROOM
    for _ in range(_TRIES):
        found = _bound(_picks.randrange(_LOWEST, below) if room else 0)
        if found is not None and found not in _handed_out:
            _handed_out.add(found)
            return found
    raise RuntimeError(f"no free loopback port found in {_TRIES} tries")


def _bound(port: int) -> int | None:
    """The port a socket bound to `port` got (the kernel's pick for 0), None if it is taken."""
    with socket.socket() as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return None
        found: int = sock.getsockname()[1]
        return found


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
