"""Free loopback ports for the servers and services that tests, benches and dev tools start.

A port the kernel hands out for port 0 comes from its ephemeral range, the same range it draws
the local ports of outgoing connections from: between the moment a port is found free and the
moment a server binds it, a client's connection (to Kafka, to Redis) can take it, and the
server fails with "Address already in use". The ports handed out here lie below that range,
where no outgoing connection takes one, and a process never hands out the same port twice.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"

# Below Linux's default ephemeral range (32768-60999) and above the ports services commonly use.
_LOWEST = 20_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, outside the kernel's ephemeral range when that range
    leaves room below it (else one the kernel picks)."""
    below = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(_LOWEST, below) if below > _LOWEST else 0  # noqa: S311 - not a secret
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            found: int = sock.getsockname()[1]
        _handed_out.add(found)
        return found
    raise RuntimeError(f"no free loopback port found in {_LOWEST}-{below}")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
