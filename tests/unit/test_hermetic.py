"""The unit tier's guard (tests/unit/conftest.py): a test that reaches past the checkout fails."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def test_a_tool_in_a_subprocess_is_refused() -> None:
    with pytest.raises(AssertionError, match="tests/deploy"):
        subprocess.run(["promtool", "--version"], capture_output=True, check=False)
    with pytest.raises(AssertionError, match="tests/integration"):
        subprocess.Popen([sys.executable, "-c", "print(1)"])


def test_the_service_command_line_on_files_is_allowed() -> None:
    run = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "--help"], capture_output=True, check=False)
    assert run.returncode == 0 and b"replay" in run.stdout


def test_another_host_is_neither_reached_nor_looked_up() -> None:
    with socket.socket() as sock, pytest.raises(AssertionError, match="connected to"):
        sock.connect(("192.0.2.1", 80))  # TEST-NET-1: refused before any packet is sent
    with pytest.raises(AssertionError, match="looked up"):
        socket.getaddrinfo("example.com", 443)
    assert socket.getaddrinfo("127.0.0.1", 80)
    assert socket.getaddrinfo("localhost", 80)
