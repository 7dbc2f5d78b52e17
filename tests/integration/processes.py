"""Process and port checks shared by the broker lifecycle tests: is a pid still running, is a port open,
and a bounded wait for both to be gone."""

from __future__ import annotations

import socket
import time


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    """Running, not reaped and not a zombie (a zombie still has a pid; /proc tells)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def gone(pid: int, *ports: int, timeout_s: float = 20) -> bool:
    """Whether the process and every port are gone within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while alive(pid) or any(listening(p) for p in ports):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
