"""A syslog socket for tests: what logger(1) or Python's syslog module sends to it arrives
as one datagram per message, as at /dev/log where syslogd or journald listens
(RFC 3164 framing, ``<PRI>TIMESTAMP TAG: MESSAGE``)."""

from __future__ import annotations

import socket
import time
from pathlib import Path


class SyslogSink:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        path.chmod(0o666)
        self.sock.setblocking(False)
        self.seen: list[str] = []

    def lines(self) -> list[str]:
        """Every message received since the last call."""
        out = []
        while True:
            try:
                out.append(self.sock.recv(65536).decode(errors="replace"))
            except BlockingIOError:
                self.seen += out
                return out

    def wait_for(self, count: int, timeout: float) -> list[str]:
        """All messages so far, once at least ``count`` arrived (or the timeout passed)."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < count and time.monotonic() < deadline:
            self.lines()
            time.sleep(0.2)
        self.lines()
        return list(self.seen)

    def close(self) -> None:
        self.sock.close()
