"""Device memory handed between processes as file descriptors: a trial output goes from a candidate's child
to the judge without leaving the GPU.

The sender copies a tensor into an allocation of CUDA's virtual memory management made exportable as a POSIX
file descriptor (``cuMemCreate``), and sends the descriptor over a Unix socket (``SCM_RIGHTS``). The receiver
imports it, maps it and clones the bytes into memory of its own, then lets the mapping go: what it judges can
no longer change under it, whatever the sender does with its own mapping afterwards. A descriptor names one
allocation, so a sender can hand over only memory it made; legacy CUDA IPC handles, which torch's
multiprocessing uses, do not cross the sandbox's PID namespace at all.

No library the platform depends on wraps these calls (torch exposes neither export nor import of a
shareable handle; ``cuda-python`` would be a dependency for nine functions), so they are bound here through
ctypes, against the driver every CUDA process already loads.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

_ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED: device memory that stays resident
_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
MAX_MESSAGE_BYTES = 1 << 16
# At most this many tensors an output, of at most this many dimensions, is sent (more goes as a file): a message
# holds a descriptor per tensor in the judge's process while it waits its turn there.
MAX_SENT_TENSORS = 16
MAX_SENT_DIMS = 16
OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"  # a shortage, not a lie
# What the driver answers for a descriptor or a size that is not what the message says: the sender's doing. Any
# other failure (no context, no descriptors left) is the receiving process's own.
_SENDERS_ERRORS = frozenset(
    {"CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_INVALID_HANDLE", "CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_NOT_PERMITTED"}
)


class DeviceExchangeError(RuntimeError):
    """A driver call of the exchange failed (its name and CUDA's error name, ``error``), or what a descriptor
    names is not memory the exchange sends."""

    def __init__(self, message: str, error: str, *, ours: bool = False) -> None:
        super().__init__(message)
        self.error, self.ours = error, ours

    @property
    def senders_fault(self) -> bool:
        """Whether the descriptor or its size made it fail (not this process's state, a shortage, or a step
        before the descriptor was touched: ``ours``)."""
        return not self.ours and self.error in _SENDERS_ERRORS


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


@functools.cache
def _driver() -> ctypes.CDLL:
    driver = ctypes.CDLL("libcuda.so.1")
    u64, size, ref = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
    signatures = {
        "cuMemGetAllocationGranularity": [ref, ref, ctypes.c_int],
        "cuMemAddressReserve": [ref, size, size, u64, u64],
        "cuMemMap": [u64, size, size, u64, u64],
        "cuMemSetAccess": [u64, size, ref, size],
        "cuMemCreate": [ref, size, ref, u64],
        "cuMemExportToShareableHandle": [ref, u64, ctypes.c_int, u64],
        "cuMemImportFromShareableHandle": [ref, ref, ctypes.c_int],
        "cuMemUnmap": [u64, size],
        "cuMemAddressFree": [u64, size],
        "cuMemRelease": [u64],
        "cuMemGetAllocationPropertiesFromHandle": [ref, u64],
        "cuCtxGetCurrent": [ref],
        "cuCtxSetCurrent": [ref],
        "cuDeviceGet": [ref, ctypes.c_int],
        "cuDevicePrimaryCtxRetain": [ref, ctypes.c_int],
        "cuGetErrorName": [ctypes.c_int, ref],
    }
    for name, argtypes in signatures.items():
        getattr(driver, name).argtypes = argtypes
    return driver


def _call(name: str, *args: Any) -> None:
    result = getattr(_driver(), name)(*args)
    if result:
        error = ctypes.c_char_p()
        _driver().cuGetErrorName(result, ctypes.byref(error))
        error_name = error.value.decode() if error.value else str(result)
        raise DeviceExchangeError(f"{name}: {error_name}", error_name)


def _use_device(device: int) -> None:
    """Make ``device``'s primary context (the one torch's runtime uses) current on this thread for the driver
    calls that follow. A thread that has not used CUDA has none, and ``torch.cuda.set_device`` makes none
    where the thread's device is already ``device``."""
    current = ctypes.c_void_p()
    _call("cuCtxGetCurrent", ctypes.byref(current))
    if current.value != _primary_context(device):
        _call("cuCtxSetCurrent", ctypes.c_void_p(_primary_context(device)))


@functools.cache
def _primary_context(device: int) -> int:
    """``device``'s primary context, retained once for this process's life (torch's runtime holds it anyway)."""
    torch.cuda.init()  # the driver initialised, and the device ordinals torch uses
    ordinal, context = ctypes.c_int(), ctypes.c_void_p()
    _call("cuDeviceGet", ctypes.byref(ordinal), device)
    _call("cuDevicePrimaryCtxRetain", ctypes.byref(context), ordinal)
    if not context.value:
        raise DeviceExchangeError("cuDevicePrimaryCtxRetain: no context", "CUDA_ERROR_INVALID_CONTEXT")
    return context.value


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type, prop.requestedHandleTypes = _ALLOCATION_PINNED, _POSIX_FD
    prop.location.type, prop.location.id = _ON_DEVICE, device
    return prop


@functools.cache
def _granularity(device: int) -> int:
    granularity = ctypes.c_size_t()
    _call("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(_prop(device)), 0)
    return granularity.value


def _rounded(nbytes: int, device: int) -> int:
    step = _granularity(device)
    return max(step, -(-nbytes // step) * step)


class _Mapping:
    """An allocation handle mapped into this process, readable and writable on ``device``; ``close`` unmaps
    it and lets the handle go (the memory itself lives on while another process holds it)."""

    def __init__(self, handle: int, size: int, device: int) -> None:
        self.handle, self.size, self.ptr = handle, size, 0
        try:
            ptr = ctypes.c_uint64()
            _call("cuMemAddressReserve", ctypes.byref(ptr), size, 0, 0, 0)
            self.ptr = ptr.value
            _call("cuMemMap", self.ptr, size, 0, handle, 0)
            access = _AccessDesc()
            access.location.type, access.location.id, access.flags = _ON_DEVICE, device, _READ_WRITE
            _call("cuMemSetAccess", self.ptr, size, ctypes.byref(access), 1)
        except DeviceExchangeError:
            self.close()
            raise

    def bytes(self, nbytes: int, device: int) -> torch.Tensor:
        """The first ``nbytes`` as a uint8 tensor over the mapping (valid until ``close``)."""
        interface = {"shape": (nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}
        return torch.as_tensor(_ArrayInterface(interface), device=f"cuda:{device}")

    def close(self) -> None:
        driver = _driver()
        if self.ptr:
            driver.cuMemUnmap(self.ptr, self.size)
            driver.cuMemAddressFree(self.ptr, self.size)
            self.ptr = 0
        if self.handle:
            driver.cuMemRelease(self.handle)
            self.handle = 0


@dataclass
class _ArrayInterface:
    __cuda_array_interface__: dict[str, Any]


@dataclass
class Exported:
    """A tensor's bytes in an exportable allocation: ``fd`` to send, ``close`` once it is sent."""

    fd: int
    _mapping: _Mapping

    def close(self) -> None:
        os.close(self.fd)
        self._mapping.close()


def export(t: torch.Tensor) -> Exported:
    """``t``'s bytes copied on the device into a new exportable allocation, the copy complete on return:
    the mapping may be let go at once after (``Exported.close``), and a copy still queued would then
    write to an address no longer mapped (an illegal address, which poisons the process's CUDA context)."""
    device = t.device.index if t.device.index is not None else torch.cuda.current_device()
    _use_device(device)
    nbytes = t.numel() * t.element_size()
    size = _rounded(nbytes, device)
    handle = ctypes.c_uint64()
    _call("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(_prop(device)), 0)
    mapping = _Mapping(handle.value, size, device)
    try:
        if nbytes:
            # lazy conjugate or negative views have no bytes of their own to copy as they are
            plain = t.detach().resolve_conj().resolve_neg().contiguous()
            mapping.bytes(nbytes, device).copy_(plain.reshape(-1).view(torch.uint8))
        torch.cuda.current_stream(device).synchronize()
        fd = ctypes.c_int()
        _call("cuMemExportToShareableHandle", ctypes.byref(fd), mapping.handle, _POSIX_FD, 0)
    except BaseException:
        mapping.close()
        raise
    return Exported(fd.value, mapping)


def import_clone(fd: int, dtype: torch.dtype, shape: list[int], device: int, *, to_host: bool = False) -> torch.Tensor:
    """The bytes behind ``fd`` cloned into this process's own memory on ``device`` (``to_host``: in host
    memory, where the device has no room for a clone), as ``dtype`` of ``shape``. The mapping covers exactly
    those bytes (rounded up to the driver's granularity): an allocation smaller than that fails to map
    (``DeviceExchangeError``) rather than be read past."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    try:
        _use_device(device)  # a judge's thread may not have used CUDA yet
        size = _rounded(nbytes, device)
    except DeviceExchangeError as exc:  # nothing of the sender's touched yet
        raise DeviceExchangeError(str(exc), exc.error, ours=True) from exc
    handle = ctypes.c_uint64()
    _call("cuMemImportFromShareableHandle", ctypes.byref(handle), fd, _POSIX_FD)
    try:
        _check_sent_memory(handle.value)
    except DeviceExchangeError:
        _driver().cuMemRelease(handle.value)
        raise
    mapping = _Mapping(handle.value, size, device)
    try:
        mapped = mapping.bytes(nbytes, device) if nbytes else torch.empty(0, dtype=torch.uint8, device=device)
        raw = mapped.cpu() if to_host else mapped.clone()
        torch.cuda.current_stream(device).synchronize()  # the clone is done before the mapping goes
    finally:
        mapping.close()
    return raw.view(dtype).view(shape)


def _check_sent_memory(handle: int) -> None:
    """Memory of the kind ``export`` makes: resident device memory (not host memory). Which device is not
    compared: a sandboxed child numbers its devices apart from the worker. The driver's documentation does not
    say what it reports for an imported handle, so a failed query or other properties are this side's failure
    (``ours``: not judged, never tampering): a wrong guess here must not make honest outputs tampering."""
    prop = _AllocationProp()
    try:
        _call("cuMemGetAllocationPropertiesFromHandle", ctypes.byref(prop), handle)
    except DeviceExchangeError as exc:
        raise DeviceExchangeError(str(exc), exc.error, ours=True) from exc
    where = (prop.type, prop.location.type)
    if where != (_ALLOCATION_PINNED, _ON_DEVICE):
        raise DeviceExchangeError(
            f"the descriptor names memory the exchange does not send (allocation type, location type): {where}",
            "KZ_OTHER_MEMORY",
            ours=True,
        )


@functools.cache
def available(device: int = 0) -> bool:
    """Whether this process can export device memory as descriptors (a driver with virtual memory
    management and POSIX descriptor handles), tried once with the smallest allocation."""
    try:
        exported = export(torch.zeros(1, device=f"cuda:{device}"))
    except (OSError, DeviceExchangeError, RuntimeError):
        return False
    exported.close()
    return True


# The dtypes an output may be sent with, by torch's name for them (the judge looks a message's up here,
# never by a name the child chose); an output of another dtype goes as a file.
SENT_DTYPES = {
    str(dtype): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.complex128,
        torch.complex64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


class SentTensor(TypedDict):
    """One tensor of a sent output, as the message describes it (the bytes travel as its descriptor)."""

    dtype: str
    shape: list[int]


class OutputMessage(TypedDict):
    """A trial output sent over the exchange socket, its tensors' descriptors in the same message."""

    name: str
    tensors: list[SentTensor]


def send(sock: socket.socket, message: OutputMessage, fds: list[int]) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds)


@dataclass
class Received:
    """One message off the exchange socket: what it says (untrusted JSON, or None where it does not
    parse), the descriptors that came with it (the receiver closes them), and whether the kernel dropped
    some of those (``truncated``: more than ``max_fds`` were sent, or this process had no room for them)."""

    message: Any
    fds: list[int]
    truncated: bool
    empty: bool  # no bytes: the sender hung up, or sent an empty record (the two look alike)

    def close(self) -> None:
        while self.fds:  # each out of the list before it is closed: a second close never meets a reused number
            os.close(self.fds.pop())


def receive(sock: socket.socket, max_fds: int = MAX_SENT_TENSORS) -> Received:
    # close-on-exec from the start: no process this one starts inherits the sender's descriptors
    data, fds, flags, _address = socket.recv_fds(sock, MAX_MESSAGE_BYTES, max_fds, socket.MSG_CMSG_CLOEXEC)
    try:
        message = json.loads(data) if data else None
    except Exception:  # not JSON, or nested past the parser's depth (RecursionError)
        message = None
    return Received(message, fds, bool(flags & socket.MSG_CTRUNC), not data)


class Sender:
    """The child's end of the exchange socket: a trial output whose tensors are all on the device and
    together at least ``min_bytes`` goes over it (``send``), the rest is left to the file exchange. At
    most ``in_flight`` sent outputs wait for the judge's acknowledgement (it acknowledges once it has judged
    one); after ``wait_s`` the next is sent anyway (the judge is late, not gone). The copies into exportable
    memory run under ``hold`` (the device lock, shared): they are device work at the memory's full bandwidth,
    which a timing elsewhere must not share the GPU with."""

    def __init__(
        self,
        sock: socket.socket,
        min_bytes: int,
        in_flight: int,
        wait_s: float = 60.0,
        hold: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
        *,
        device: torch.device,
    ) -> None:
        self.sock, self.min_bytes, self.in_flight, self.wait_s = sock, min_bytes, max(1, in_flight), wait_s
        self.hold = hold
        self.device = device  # the child's one device: an output elsewhere goes as a file
        self._unacknowledged = 0

    def takes(self, tensors: list[torch.Tensor]) -> bool:
        return (
            0 < len(tensors) <= MAX_SENT_TENSORS
            and all(
                t.device == self.device and t.layout == torch.strided and str(t.dtype) in SENT_DTYPES and t.dim() <= MAX_SENT_DIMS
                for t in tensors
            )
            and sum(t.numel() * t.element_size() for t in tensors) >= self.min_bytes
        )

    def send(self, name: str, tensors: list[torch.Tensor]) -> None:
        self._wait_for_room()
        exported: list[Exported] = []
        try:
            with self.hold():
                for t in tensors:
                    exported.append(export(t))  # each copy complete before the judge reads it
            described: list[SentTensor] = [{"dtype": str(t.dtype), "shape": list(t.shape)} for t in tensors]
            send(self.sock, {"name": name, "tensors": described}, [e.fd for e in exported])
        finally:
            for e in exported:  # the descriptors in flight keep the memory until the judge has its copy
                e.close()
        self._unacknowledged += 1

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while self._unacknowledged >= self.in_flight and (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                acknowledged = len(self.sock.recv(64))
            except TimeoutError:
                break
            finally:
                self.sock.settimeout(None)
            if not acknowledged:  # the judge's end is gone
                break
            self._unacknowledged = max(0, self._unacknowledged - acknowledged)  # one per output; more is not the judge's
