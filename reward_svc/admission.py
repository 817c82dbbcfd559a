"""Admission by bytes: of trial files in the scratch dir, and of device memory.

Every trial's tensors cross between children as files. A KernelBench level-1 case is 13 GB of
input and output, so a group of such candidates, or several groups on a GPU worker, would fill
the scratch dir (a tmpfs: memory) together. Two kinds of files, admitted differently:

- a reference's files (inputs and expected outputs) are known only once it ran: they are *held*
  while its group runs, and a new reference starts only while the files in use are below the
  budget, so heavy groups queue instead of piling up;
- a candidate's output files are known beforehand: candidates *reserve* them, and wait while
  other candidates' reservations would pass the budget (one larger than it runs alone).

Candidates wait only for other children's runs, never for a group's held bytes, so a group that
has run its reference always finishes and lets the next one in.

Device memory is budgeted the same way (a second ``ByteBudget``): a candidate reserves what its
reference's run peaked at plus its harness's own copies (``candidate_device_bytes``) before it
takes a child; a reference starts only while the bytes in use leave room, and reserves the largest
peak it reached on this worker, or a share of the budget if it never ran here (``ReferencePeaks``).
An estimate is not a bound (a candidate's own buffers are its own), so a child that runs out of
memory while other children of this worker ran too still runs again once one of them is done
(``DeviceUsers``): the memory was theirs, not a fault of the code under test. It reserves twice as
much when it runs again (``after_shortage``). A reservation that has waited ``DRAIN_AFTER_S`` turns
later ones away until it is made, so one larger than the running leave is made once they end.
Host memory beyond the scratch files is not budgeted: a GPU child has no address-space limit, so
the host's OOM killer ends a child (its first choice) and that child is run again the same way.

References and candidates take a child only with a slot (``ChildSlots``): a worker's slots are
shared by all its groups, each free one going to the group running fewest (the oldest first), so
under load the groups share them evenly and a group alone uses them all. A candidate takes its slot
before it reserves bytes, so one in line reserves nothing; a reference takes its slot after the wait
for room, and checks the room again once it has the slot (the wait in line may have been long),
giving the slot back to wait again if there is none; with the slot it reserves its device memory as
a candidate does. A slot holder waits only for other holders (byte reservations, which end with
their children's runs) or for its own child, so the reasoning above holds.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Iterator

# A reservation waiting this long turns later ones away until it is made: one larger than what the running
# leave would otherwise wait for ever while smaller ones keep fitting beside them. Long beside a run (a
# shorter wait is common under load, and a drain idles the slots of those it turns away).
DRAIN_AFTER_S = 60.0


class ByteBudget:
    """Bytes held (known once used) and reserved (known beforehand) against a capacity."""

    def __init__(self, capacity: int, drain_after_s: float = DRAIN_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.drain_after_s = drain_after_s
        self._clock = clock
        self.held = 0  # for a group's life: a reference's files, a group's expected outputs on the device
        self.reserved = 0  # for a child's run: a candidate's output files, a child's device memory
        self._waiting: dict[object, float] = {}  # reservations waiting to be made, each since when (monotonic)
        self._changed = threading.Condition()

    @property
    def in_use(self) -> int:
        return self.held + self.reserved

    @property
    def waiting(self) -> int:
        """Reservations waiting to be made."""
        with self._changed:
            return len(self._waiting)

    def fits(self, nbytes: int) -> bool:
        """Whether ``reserve(nbytes)`` would not wait now."""
        with self._changed:
            return self._fits(nbytes, None)

    def _fits(self, nbytes: int, ticket: object) -> bool:
        if nbytes == 0:
            return True
        room = self.reserved == 0 or self.reserved + nbytes <= self.capacity
        return room and not self._draining_for(ticket)

    def _draining_for(self, ticket: object) -> bool:
        """Whether the oldest reservation waiting, another than ``ticket``, has waited past ``drain_after_s``
        (the running then drain for it)."""
        if not self._waiting:
            return False
        oldest, since = min(self._waiting.items(), key=lambda waiting: waiting[1])
        return oldest is not ticket and self._clock() - since > self.drain_after_s

    def has_room(self) -> bool:
        """Whether a reference may start now (it is to hold bytes): the bytes in use are below the budget."""
        with self._changed:
            return self.in_use < self.capacity

    def wait_for_room(self) -> None:
        """Before a reference runs: until the bytes in use are below the budget."""
        with self._changed:
            self._changed.wait_for(self.has_room)

    def wait_for_release(self, timeout_s: float) -> bool:
        """After a reference found no room on the filesystem: until some files in use go (True), or
        False at once when none are in use (nothing of ours will free room) or when the time is up."""
        with self._changed:
            in_use = self.in_use
            return in_use > 0 and self._changed.wait_for(lambda: self.in_use < in_use, timeout=timeout_s)

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """A reference's files, from when they exist until its group is done."""
        with self._changed:
            self.held += nbytes
        try:
            yield
        finally:
            self._release("held", nbytes)

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """A child's bytes, before it runs; one larger than the capacity waits for none reserved. Those
        waiting go in the order they came once the oldest has waited past ``drain_after_s``."""
        ticket = object()
        with self._changed:
            try:
                self._waiting[ticket] = self._clock()
                self._changed.wait_for(lambda: self._fits(nbytes, ticket))
            finally:  # made, or interrupted (a time limit raised in the thread): it waits no more
                self._waiting.pop(ticket, None)
                self._changed.notify_all()  # the next oldest may be made now, or turned away no longer
            self.reserved += nbytes
        try:
            yield
        finally:
            self._release("reserved", nbytes)

    def _release(self, kind: str, nbytes: int) -> None:
        with self._changed:
            setattr(self, kind, getattr(self, kind) - nbytes)
            self._changed.notify_all()


class ChildSlots:
    """A worker's slots for evaluation children, shared by its groups: a free slot goes to the waiting
    key of the group running fewest, the lowest key first (``(group's arrival, index)``, a reference's
    index -1, so it goes before its candidates). Under load every group gets an even share, as a fixed
    number per group gave; a group alone, or beside groups waiting for scratch room, uses the slots the
    others leave, but a slot beyond its even share only while its child's device memory fits: a
    candidate in a slot waiting for memory idles the slot. ``threading.Semaphore`` wakes its waiters in
    no set order, so this is written out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._waiting: dict[tuple[int, int], Callable[[], bool] | None] = {}  # key: whether its memory fits now
        self._running: collections.Counter[int] = collections.Counter()  # slots held, by group
        self._changed = threading.Condition()

    @property
    def free(self) -> int:
        """Slots neither held nor over the size (negative while a smaller size waits for releases)."""
        with self._changed:
            return self.size - sum(self._running.values())

    def resize(self, size: int) -> None:
        """A new number of slots: more wake the line; fewer take effect as holders release theirs."""
        with self._changed:
            self.size = size
            self._changed.notify_all()

    def recheck(self) -> None:
        """The line looks again at whose memory fits: after a reservation was made (a drain it ended lets
        others fit), which no slot's release announces. Never called holding a budget's lock (``_next``
        asks budgets while it holds this one's)."""
        with self._changed:
            self._changed.notify_all()

    @property
    def waiting(self) -> list[tuple[int, int]]:
        """The keys in line, lowest first."""
        with self._changed:
            return sorted(self._waiting)

    def _next(self) -> tuple[int, int] | None:
        """The key a free slot goes to: of the group running fewest, the lowest, among those within their
        group's even share or whose memory fits; None where none is."""
        groups = {group for group, _ in self._waiting} | set(self._running)
        share = max(1, self.size // len(groups))
        eligible = [key for key, fits in self._waiting.items() if self._running[key[0]] < share or fits is None or fits()]
        return min(eligible, key=lambda key: (self._running[key[0]], key), default=None)

    @contextlib.contextmanager
    def take(self, key: tuple[int, int], fits: Callable[[], bool] | None = None) -> Iterator[None]:
        """A slot for ``key`` (unique), once it is the next in line (above) and one is free; ``fits``:
        whether the child's device memory fits now (None: nothing to fit)."""
        group = key[0]
        granted = False
        try:
            with self._changed:
                self._waiting[key] = fits
                try:
                    self._changed.wait_for(lambda: self.free > 0 and self._next() == key)
                    self._running[group] += 1
                    granted = True
                finally:  # granted or interrupted (a time limit raised in the thread), the key leaves the line
                    self._waiting.pop(key, None)
                    self._changed.notify_all()  # the next in line may find a slot free too
            yield
        finally:
            if granted:
                with self._changed:
                    self._running[group] -= 1
                    if not self._running[group]:
                        del self._running[group]
                    self._changed.notify_all()


class DeviceUsers:
    """This worker's children (and judges) using the device, counted while they run."""

    def __init__(self) -> None:
        self.active = 0
        self.finished = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def use(self) -> Iterator[int]:
        """Yields how many uses had finished when this one began (``others_finished_since`` takes it)."""
        with self._changed:
            self.active += 1
            seen = self.finished
        try:
            yield seen
        finally:
            with self._changed:
                self.active -= 1
                self.finished += 1
                self._changed.notify_all()

    def others_finished_since(self, seen: int, timeout_s: float) -> bool:
        """After a use (ended) that began when ``seen`` uses had finished and ran out of memory:
        True once another use has finished since it began (at once if one did while it ran), False
        at once when no other runs (the shortage was its own), or when the time is up."""
        with self._changed:
            others_done = lambda: self.finished > seen + 1  # noqa: E731 (the +1 is the use that asks)
            if others_done():
                return True
            return self.active > 0 and self._changed.wait_for(others_done, timeout=timeout_s)


# A child's CUDA context, Triton's and the harness's modules on the device: not in the allocator's figures.
DEVICE_CONTEXT_BYTES = 1 << 30


def candidate_device_bytes(peak: int, input_bytes: int, output_bytes: int, judged_at_once: int = 1) -> int:
    """A candidate's device memory, estimated from its reference's peak (the model, a case's inputs
    and an output, the timing's rotation of inputs): plus the harness's copies the reference has not
    (the pristine inputs, the latest trial's inputs the refresh writes into, the returned output's
    clone), the judge's output and expected output for each comparison it runs at once on the device,
    and a context."""
    return peak + 2 * input_bytes + (1 + 2 * judged_at_once) * output_bytes + DEVICE_CONTEXT_BYTES


def device_budget(total_bytes: int, idle_children: int) -> int:
    """What a worker's children may reserve of a GPU's memory: the whole, less a tenth (the worker's own
    context, the judge's tensors, what children use beyond their estimates) and less the contexts of the
    pool's warm children, which hold one each while they wait for a job and which no reservation counts
    (a taken child's is in its reservation). At least half the GPU."""
    return max(total_bytes // 2, total_bytes * 9 // 10 - idle_children * DEVICE_CONTEXT_BYTES)


# A reference never run on this worker reserves this share of the device budget: its peak is known only once it ran.
REFERENCE_FIRST_SHARE = 8


class ReferencePeaks:
    """What a reference reserves on the device: the largest peak it reached on this worker plus a context
    (references are trusted, and their source fixes their shapes), a share of the budget for one never run
    here. The most recently run ``known`` references are remembered."""

    def __init__(self, known: int = 4096) -> None:
        self._known = known
        self._peaks: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def reservation(self, reference: str, capacity: int) -> int:
        with self._lock:
            peak = self._peaks.get(_digest(reference))
        if peak is None:
            return capacity // REFERENCE_FIRST_SHARE
        return min(capacity, peak + DEVICE_CONTEXT_BYTES)

    def learn(self, reference: str, peak: int) -> None:
        """After a run that completed: the peak its allocator reached. The largest seen is kept (a request's
        options move it: timing holds every case's inputs on the device, ``time_compiled`` a compiled model)."""
        with self._lock:
            key = _digest(reference)
            self._peaks[key] = max(peak, self._peaks.get(key, 0))
            self._peaks.move_to_end(key)
            while len(self._peaks) > self._known:
                self._peaks.popitem(last=False)


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def after_shortage(reserved: int, ceiling: int) -> int:
    """What a child that ran out of device memory reserves when it runs again: twice as much, up to
    ``ceiling`` (never less than before). Whose growth the shortage was is not known (a candidate's
    figures are its word): too little again can cost an honest kernel its verdict, too much costs a wait.
    A candidate's ceiling is half the budget, a reference's the whole: any code can raise an out-of-memory
    error, and a candidate's must not grow its reservation to the whole worker's."""
    return max(reserved, min(2 * reserved, ceiling))
