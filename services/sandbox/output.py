"""Concurrent, capped capture of a child's stdout and stderr.

One thread drains both pipes from the moment the child starts (a warm child may print while it
waits for its job), so a chatty child never blocks on a full pipe; bytes past the cap are read
and dropped.
"""

from __future__ import annotations

import os
import selectors
import threading
from dataclasses import dataclass
from typing import IO


@dataclass
class Captured:
    data: bytes
    truncated: bool


class OutputCollector:
    def __init__(self, streams: tuple[IO[bytes], ...], limit: int) -> None:
        self._streams = streams
        self._limit = limit
        self._buffers = {s.fileno(): bytearray() for s in streams}
        self._truncated = {s.fileno(): False for s in streams}
        self._selector = selectors.DefaultSelector()
        for stream in streams:
            self._selector.register(stream.fileno(), selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="sandbox-output", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        # The short select timeout only bounds how long finish() waits for a stop.
        while self._selector.get_map() and not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    self._selector.unregister(key.fd)
                    continue
                buf = self._buffers[key.fd]
                room = self._limit - len(buf)
                if len(chunk) > room:
                    self._truncated[key.fd] = True
                if room > 0:
                    buf += chunk[:room]

    def finish(self, grace_s: float = 1.0) -> list[Captured]:
        """Wait for end of file on every stream (the tree is dead by now, so it comes at once;
        ``grace_s`` only guards against an escaped process holding a pipe), then close them."""
        self._thread.join(grace_s)
        self._stop.set()
        self._thread.join()
        captured = [Captured(bytes(self._buffers[fd]), self._truncated[fd]) for fd in self._buffers]
        self._selector.close()
        for stream in self._streams:
            stream.close()
        return captured
