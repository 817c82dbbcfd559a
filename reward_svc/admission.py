"""Admission of candidate children by the bytes of output files they will write.

Every trial's output crosses from the candidate's child to the judge as a file. A KernelBench
level-1 output is 6.4 GB, so a group of such candidates, or several groups on a GPU worker, would
fill the disk together: children whose outputs would pass the budget wait for earlier ones to be
judged, and one larger than the whole budget runs alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class ByteBudget:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self.in_use == 0 or self.in_use + nbytes <= self.capacity)
            self.in_use += nbytes
        try:
            yield
        finally:
            with self._changed:
                self.in_use -= nbytes
                self._changed.notify_all()
