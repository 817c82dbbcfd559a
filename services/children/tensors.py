"""Tensor plumbing shared by both roles: moving, cloning, saving and poisoning nested arguments."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from services.children import tensor_files

# The tolerance a candidate's output is held to (KernelBench's), atol and rtol alike. The reward
# service judges with it; the Proposer rejects tasks whose outputs it cannot tell from a constant.
DEFAULT_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def default_tolerance(dtype: torch.dtype) -> float:
    return DEFAULT_TOLERANCE.get(dtype, 1e-4)


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


PLAIN_CONTAINERS = (list, tuple, dict)


def walk(obj: Any) -> Any:
    """Every value in a nested output, containers included, descending only into plain lists, tuples,
    dicts and torch's own named tuples (``torch.return_types``): a container of another type is
    yielded, never iterated, so no code of the candidate's runs while the harness looks."""
    yield obj
    if type(obj) in PLAIN_CONTAINERS or type(obj).__module__ == "torch.return_types":
        for value in obj.values() if isinstance(obj, dict) else obj:
            yield from walk(value)


def tensors_in(obj: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    map_tensors(obj, collect)
    return found


def to_device(obj: Any, device: str) -> Any:
    return map_tensors(obj, lambda t: t.to(device))


def clone(obj: Any) -> Any:
    return map_tensors(obj, lambda t: t.clone())


def to_cpu(obj: Any) -> Any:
    """A host snapshot: a device tensor's copy is already new memory, so only host tensors are cloned."""
    return map_tensors(obj, lambda t: _to_host(t) if t.device.type != "cpu" else t.detach().clone())


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A device tensor's copy on the host, in page-locked memory: a copy into pageable memory is staged
    by the driver and faults in each new page, about 1.3 GB/s for a GB-sized output on the H200 host.
    The pinned block is torch's caching host allocator's, so a child's next output of the size reuses it."""
    t = t.detach()
    if t.device.type == "cpu" or t.layout != torch.strided or not torch.cuda.is_available():
        return t.cpu()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t)
    return host


def nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(obj))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality that treats NaN as equal to NaN (poisoned buffers hold NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))


POISON_SCALES = (0.5, 2.0)  # each value scaled by a random factor in this range...
POISON_SHIFTS = (0.5, 1.5)  # ...then moved up by a random amount in this one


def poison_(t: torch.Tensor) -> None:
    """Overwrite a tensor with wrong values a computation could still go on with: floating values
    rolled round by a random offset (so glue that picks among them, an argmax, picks another place even
    where one value dwarfs the rest; a flip, undone by a matmul of two flipped operands, did not),
    each then scaled by a random factor in ``POISON_SCALES`` and moved up by one in ``POISON_SHIFTS``
    (finite, so a decoy that folds its kernel's output in as ``torch_result + out * 0`` stays
    right, where NaN spread through ``* 0`` and hid it; non-negative values stay non-negative, so
    glue after a kernel — the square root of a sum of squares — computes a wrong answer instead
    of raising; the shift, because scaling alone leaves an output that is rounding noise around
    zero within the tolerance); booleans inverted; integers each moved to another value of the
    range they span (indices stay in range; a shuffle left a constant tensor, a lone index or two
    rows half the time as they were, so an honest argmax looked like a decoy)."""
    if t.numel() == 0:
        return
    memory = memory_of(t)
    if memory is not t:  # an expanded view: its memory is poisoned, each place once
        poison_(memory)
        return
    if t.is_floating_point() and t.element_size() == 1:  # float8: no random draws of its own, poisoned in float32
        wide = t.float()
        poison_(wide)
        t.copy_(wide)
        return
    generator = torch.Generator(device=t.device).manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    if t.is_floating_point() or t.is_complex():
        target = torch.view_as_real(t) if t.is_complex() else t
        (low, high), (shift_low, shift_high) = POISON_SCALES, POISON_SHIFTS
        if target.numel() > 1:
            offset = int(torch.randint(1, target.numel(), (), generator=generator, device=target.device))
            target.copy_(target.reshape(-1).roll(offset).view_as(target))
        target.mul_(torch.empty_like(target).uniform_(low, high, generator=generator))
        target.add_(torch.empty_like(target).uniform_(shift_low, shift_high, generator=generator))
    elif t.dtype == torch.bool:
        t.logical_not_()
    else:
        low, high = (int(v) for v in torch.aminmax(t))
        span = high - low + 1
        if span == 1:  # one value: the nearest other one, toward zero's side kept non-negative
            t.add_(-1 if low > 0 else 1)
        elif span > 1 << 62:  # no room for the arithmetic below: every value still changes
            t.bitwise_xor_(1)
        else:  # each value moved by 1..span-1 around the range: another value of it
            offsets = torch.randint(1, span, t.shape, generator=generator, device=t.device, dtype=torch.int64)
            t.copy_((t.to(torch.int64) - low + offsets) % span + low)


def memory_of(t: torch.Tensor) -> torch.Tensor:
    """The memory a tensor's elements lie in, each place once: ``t`` itself, unless places hold several of
    its elements (an ``expand``), which no in-place write takes; then a flat view from its first element's
    place to its last's."""
    if t.numel() == 0 or t.layout != torch.strided or torch._debug_has_internal_overlap(t) != 1:
        return t
    extent = 1 + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))
    return t.as_strided((extent,), (1,), t.storage_offset())


def same_share(a: torch.Tensor, b: torch.Tensor) -> float:
    """The share of places where ``a`` and ``b`` (same number of elements and dtype) hold the same
    bits, NaN equal to NaN; a slice at a time, so it needs little memory beside the two."""
    same = 0
    for part_a, part_b in slices(a.detach(), b.detach()):
        equal = part_a == part_b
        if part_a.is_floating_point() or part_a.is_complex():
            equal |= torch.isnan(part_a) & torch.isnan(part_b)
        same += int(equal.sum())
    return same / a.numel() if a.numel() else 1.0


SLICE_ELEMENTS = 1 << 24  # on a GPU: few launches
HOST_SLICE_ELEMENTS = 1 << 18  # on the host: a slice's temporaries stay in the CPU's caches (a pass from memory is slower)


def slices(*ts: torch.Tensor) -> Iterator[list[torch.Tensor]]:
    """The same flat slice of each tensor in turn (elementwise work without whole-size temporaries)."""
    flat = [t.reshape(-1) for t in ts]
    step = HOST_SLICE_ELEMENTS if flat[0].device.type == "cpu" else SLICE_ELEMENTS
    for start in range(0, flat[0].numel(), step):
        yield [f[start : start + step] for f in flat]


def constant_within_tolerance(t: torch.Tensor, atol: float, rtol: float, constants: tuple[complex, ...]) -> complex | None:
    """The first of ``constants`` that allclose at this tolerance would accept for every value of ``t``
    (a slice at a time: an output may be gigabytes), or None."""
    compute = torch.promote_types(t.dtype, torch.float32)
    for value in constants:
        if all(
            bool(torch.isclose(torch.full_like(part, value, dtype=compute), part.to(compute), atol=atol, rtol=rtol).all())
            for (part,) in slices(t)
        ):
            return value
    return None


def plain(obj: Any) -> Any:
    """Named tuples (``torch.return_types.max`` and kin) as plain tuples: the judge loads with
    ``weights_only``, which refuses any class it does not know."""
    if isinstance(obj, (list, tuple)):
        return (list if isinstance(obj, list) else tuple)(plain(o) for o in obj)
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return obj


def save(path: Path, obj: Any) -> None:
    """Host tensors are written as they are (no snapshot copy: the caller's object is final), views
    compacted (torch.save writes a view's whole storage), and without the zip records' CRC-32. A file
    ``load`` would refuse (``tensor_files``: a value of another kind, thousands of tensors) fails here, where
    its writer learns why, not later as a judge's refusal."""
    on_host = map_tensors(obj, lambda t: _compact(_to_host(t)))
    with _no_checksums():
        torch.save(plain(on_host), path)
    try:
        tensor_files.check(path)
    except tensor_files.ForeignFile as exc:
        raise tensor_files.ForeignFile(f"{path.name} holds what the judge does not read: {exc}") from exc


def _compact(t: torch.Tensor) -> torch.Tensor:
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()


@contextlib.contextmanager
def _no_checksums() -> Iterator[None]:
    previous = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(previous)


_FINGERPRINT_ROW = 1 << 16
_FINGERPRINT_SLAB = 1 << 24  # elements per step (a multiple of the row): int64 temporaries of 128 MiB whatever the size


def fingerprint(obj: Any, key: int) -> list[int]:
    """A keyed checksum of each tensor's bytes, computed where the tensors are (the device, for GPU
    outputs): the candidate's harness takes it the moment a trial's output is final, the judge again
    from the file. The words, laid out as rows of 2**16, are summed as ``a^T X b`` with keyed random
    vectors ``a`` and ``b``: a bilinear form no change to the bytes keeps without knowing them (a
    sum over position-periodic or additive weights would let swaps or rectangles through).
    Arithmetic wraps modulo 2**64, so neither the device nor the order of summation changes it. A tensor met
    twice (returned twice, or fetched twice from a file's pickle memo) is summed once."""
    found = tensors_in(obj)
    summed = {id(t): _fingerprint_tensor(t, key) for t in {id(t): t for t in found}.values()}
    return [summed[id(t)] for t in found]


@functools.lru_cache(maxsize=16)  # the refresh replay fingerprints every op's output under one key
def _fingerprint_weights(key: int, rows: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(key)
    a, b = (
        torch.randint(-(2**63), 2**63 - 1, (n,), generator=generator, dtype=torch.int64).to(device)
        for n in (_FINGERPRINT_ROW, rows)
    )
    return a, b


def _fingerprint_tensor(t: torch.Tensor, key: int) -> int:
    # Sparse and kin (a candidate's launch arguments, in its own process): their values. The judge never meets
    # one: ``load`` refuses them, whose indices nothing has checked.
    if t.layout != torch.strided:
        t = t.to_dense()
    flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)  # lazy conj/neg views have no bytes of their own
    if flat.storage_offset():  # a view into a larger buffer: its bytes may not align to words
        flat = flat.clone()
    raw = flat.view(torch.uint8)
    words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw
    a, b = _fingerprint_weights(key, -(-words.numel() // _FINGERPRINT_ROW), str(t.device))
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, words.numel(), _FINGERPRINT_SLAB):
        chunk = words[start : start + _FINGERPRINT_SLAB].to(torch.int64)
        if chunk.numel() % _FINGERPRINT_ROW:  # the tail, padded with zeros (they add nothing)
            chunk = torch.nn.functional.pad(chunk, (0, _FINGERPRINT_ROW - chunk.numel() % _FINGERPRINT_ROW))
        block = chunk.view(-1, _FINGERPRINT_ROW)
        first = start // _FINGERPRINT_ROW
        total += ((block * a).sum(dim=1) * b[first : first + block.shape[0]]).sum()
    return int(total) ^ (words.numel() << 8) ^ words.element_size()


class NotDense(ValueError):
    """A tensor file holds a tensor that is not plain strided memory of its own (sparse, quantized, nested, or
    larger than its storage: an expanded one)."""


def load(path: Path, device: str = "cpu", *, mmap: bool = True) -> Any:
    """Memory-mapped by default (pages are read when touched; host tensors stay private
    copy-on-write mappings, so writing to them never reaches the file), then moved to ``device``.

    Dense tensors only, each no larger than its own storage (``NotDense`` otherwise). An output file is
    the candidate's to write, and ``weights_only`` still rebuilds sparse tensors without checking their
    indices (densifying one whose indices point past its size writes outside its buffer, in the judge's
    process), and expanded ones whatever their size (a 1-KB file that reads as a 4-GiB tensor, which a
    contiguous copy then allocates). Sparse invariants are checked as they load, and the rest is refused
    before anything reads a byte. The harness never writes either: it saves each tensor's own storage,
    compacted (``save``). Before torch reads the file at all, it must be one ``save`` could have written
    (``tensor_files.check``, ``ForeignFile`` otherwise): a few KiB of zip or pickle can cost ``torch.load``
    unbounded memory or time."""
    tensor_files.check(path)
    with torch.sparse.check_sparse_tensor_invariants():
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    for t in tensors_in(loaded):
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise NotDense(f"{path.name} holds a {'quantized' if t.is_quantized else t.layout} tensor; only dense ones are read")
        if t.numel() * t.element_size() > (storage := t.untyped_storage().nbytes()):
            raise NotDense(f"{path.name} holds a tensor of {tuple(t.shape)} over a storage of {storage} bytes")
    return loaded if device == "cpu" else to_device(loaded, device)


COPY_SHARE = 0.99  # a launch's result this much bit for bit one of its inputs, place for place, is a copy


def is_copy_of(t: torch.Tensor, sources: list[torch.Tensor]) -> bool:
    """Whether ``t`` holds (nearly all of) another launch argument's values in the same places: a copy
    kernel computes nothing, so the knockout leaves what it wrote alone and the kernels' share of the
    output shows it."""
    return any(
        source.numel() == t.numel()
        and source.dtype == t.dtype
        and source.data_ptr() != t.data_ptr()
        and t.numel()
        and same_share(t, source) >= COPY_SHARE
        for source in sources
    )


def storage_id(t: torch.Tensor) -> int:
    """The storage's identity, not its address: a ``resize_`` moves a storage's bytes and frees the old
    block for another storage to grow into, and by address that one would take over the first's record
    (a data-free one, say) while the first still lived."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # no storage of its own (sparse, nested): never matches
        return -1
