"""What ``tensors.load`` checks in a tensor file before ``torch.load`` reads it: that ``tensors.save`` could
have written it. ``weights_only`` keeps a file's code out, not its cost: a few KiB can make torch's reader
inflate gigabytes (a compressed record) or its unpickler build an object any walk of which takes 2**n steps
(lists shared through the pickle's memo), before the caller sees what was built. Nothing here executes the
pickle or reads a tensor's bytes: the zip's central directory and the pickle's opcodes are read as data."""

from __future__ import annotations

import os
import pickletools
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

MAX_PICKLE_BYTES = 64 << 10  # ``save``'s of ~900 tensors; unpickled in 0.3 s at worst (dict keys hashing alike: quadratic)
MAX_RECORDS = 4096  # torch's six records and one per storage: more storages than a pickle of that size can name
MAX_DIRECTORY_BYTES = MAX_RECORDS * 512  # an entry is its name and zip64 sizes: about a hundred bytes
MAX_DEPTH = 32  # containers in containers: an output, or a case's inputs, nests a few deep
# Each tensor costs the judge its dims squared (a contiguous copy's strides) however few its bytes, and a tensor
# fetched again from the memo costs the pickle 2 bytes: bounds on both keep the judge's work the file's size.
MAX_DIMS = 64
MAX_TENSORS = 1024


class ForeignFile(ValueError):
    """A tensor file ``save`` did not write: a compressed or outsized record, or a pickle that builds more
    than plain lists, tuples and dicts (none shared) of scalars, strings, dtypes and dense tensors."""


def check(path: Path) -> None:
    """Refuses (``ForeignFile``) what ``save`` never writes, before torch reads a record of it."""
    _check_directory(path)
    reader = torch._C.PyTorchFileReader(str(path))  # every record it can read is now stored and small
    if reader.get_record("byteorder") != sys.byteorder.encode():  # torch would swap every storage's bytes in place
        raise ForeignFile("its byte order is not this host's")
    _check_pickle(reader.get_record("data.pkl"))


# The zip records torch's writer ends an archive with (always zip64, no comment), and a central directory entry.
_ENTRY = struct.Struct("<IHHHHHHIIIHHHHHII")
_ZIP64_END = struct.Struct("<IQHHIIQQQQ")
_ZIP64_LOCATOR = struct.Struct("<IIQI")
_END = struct.Struct("<IHHHHIIH")
_ENTRY_SIG, _ZIP64_END_SIG, _ZIP64_LOCATOR_SIG, _END_SIG = 0x02014B50, 0x06064B50, 0x07064B50, 0x06054B50
_STORED = 0


def _check_directory(path: Path) -> None:
    """Every record stored (torch's reader inflates a compressed one whole: a zip bomb), and each that it
    reads into memory (all but the storages, which are mapped) at most ``MAX_PICKLE_BYTES``."""
    with open(path, "rb") as f:
        entries, directory_at, directory_size = _directory_place(f)
        f.seek(directory_at)
        directory = f.read(directory_size)
    for name, method, size in _entries(directory, entries):
        if method != _STORED:
            raise ForeignFile(f"its record {name!r} is compressed")
        if not name.partition(b"/")[2].startswith(b"data/") and size > MAX_PICKLE_BYTES:
            raise ForeignFile(f"its record {name!r} is {size} bytes")


def _directory_place(f: BinaryIO) -> tuple[int, int, int]:
    """(entries, offset, size) of the central directory torch's reader (miniz) finds, read as it reads them:
    the end record must be the file's last bytes, with the zip64 records just before it and the directory just
    before them, as torch writes them."""
    size = os.fstat(f.fileno()).st_size
    tail = _ZIP64_END.size + _ZIP64_LOCATOR.size + _END.size
    if size < tail:
        raise ForeignFile("it is too short for a zip archive")
    f.seek(size - tail)
    end64, locator, end = (record.unpack(f.read(record.size)) for record in (_ZIP64_END, _ZIP64_LOCATOR, _END))
    signatures = (end64[0], locator[0], end[0])
    entries, directory_size, directory_at = end64[7:]
    if (
        signatures != (_ZIP64_END_SIG, _ZIP64_LOCATOR_SIG, _END_SIG)
        or end[7] != 0  # a comment: miniz looks for the end record before it
        or (locator[2], locator[3]) != (size - tail, 1)
        or end64[4:7] != (0, 0, entries)  # one disk
        or directory_at + directory_size != size - tail
    ):
        raise ForeignFile("its zip end records are not where and what torch writes")
    if entries > MAX_RECORDS or directory_size > MAX_DIRECTORY_BYTES:
        raise ForeignFile(f"it holds {entries} records in a directory of {directory_size} bytes")
    return entries, directory_at, directory_size


def _entries(directory: bytes, count: int) -> Iterator[tuple[bytes, int, int]]:
    """(name, compression method, size) of each entry. The size is the 32-bit field: miniz reads a zip64 one
    only where it is 0xFFFFFFFF, which is over any limit here."""
    at = 0
    for _ in range(count):
        if at + _ENTRY.size > len(directory):
            raise ForeignFile("its central directory ends early")
        fields = _ENTRY.unpack_from(directory, at)
        if fields[0] != _ENTRY_SIG:
            raise ForeignFile("its central directory is corrupt")
        name_len, extra_len, comment_len = fields[10:13]
        yield directory[at + _ENTRY.size : at + _ENTRY.size + name_len], fields[4], fields[9]
        at += _ENTRY.size + name_len + extra_len + comment_len
    if at != len(directory):
        raise ForeignFile("its central directory has more than its entries")


# What ``save``'s pickle is made of (torch.save, protocol 2, of plain containers, Python scalars and strings,
# dtypes and tensors). Each value on the scan's stack is one of these kinds:
_PLAIN = frozenset({"scalar", "str", "dtype", "tensor", "list", "dict", "tuple"})  # what an output or its inputs hold
_CONTAINERS = frozenset({"list", "dict", "tuple", "pid", "args"})  # never met twice: a walk would go through them again
_SCALARS = frozenset({"NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT"})
_GLOBALS = {
    "torch._utils _rebuild_tensor_v2": "rebuild",
    "torch._utils _rebuild_tensor_v3": "rebuild",  # dtypes with no legacy storage class (float8, uint16)
    "collections OrderedDict": "hooks-class",  # a tensor's backward hooks, always empty
    "torch.storage UntypedStorage": "storage-class",
    **{f"torch {name}": "storage-class" for name in torch.storage._dtype_to_storage_type_map().values()},
    **{"torch " + str(dtype).removeprefix("torch."): "dtype" for dtype in vars(torch).values() if isinstance(dtype, torch.dtype)},
}


@dataclass(frozen=True)
class _Value:
    kind: str
    depth: int = 0  # containers nested in it, itself included
    length: int = 0


def _check_pickle(data: bytes) -> None:
    """Follows the pickle's stack by kind of value, never building one: refused are any opcode, global or
    call ``save`` does not write, a storage class outside a persistent id, a container fetched from the memo
    (``save`` writes each of its containers once, ``map_tensors`` having rebuilt them all), and nesting
    deeper than ``MAX_DEPTH``."""
    scan = _Scan()
    for name, arg in _opcodes(data):
        if name == "STOP":
            if len(scan.stack) != 1 or scan.marks or scan.stack[0].kind not in _PLAIN:
                raise ForeignFile("its pickle does not end in one plain value")
            return
        scan.step(name, arg)
    raise ForeignFile("its pickle has no end")


def _opcodes(data: bytes) -> Iterator[tuple[str, Any]]:
    try:
        for opcode, arg, _ in pickletools.genops(data):
            yield opcode.name, arg
    except ValueError as exc:  # truncated or malformed: the unpickler would fail on it too
        raise ForeignFile(f"its pickle does not parse: {exc}") from exc


class _Scan:
    def __init__(self) -> None:
        self.stack: list[_Value] = []
        self.marks: list[int] = []  # where on the stack each open MARK is
        self.memo: dict[int, _Value] = {}
        self.tensors = 0  # built or fetched again

    def step(self, name: str, arg: Any) -> None:
        if name in _SCALARS:
            self.stack.append(_Value("scalar"))
        elif name == "BINUNICODE":
            self.stack.append(_Value("str"))
        elif name == "MARK":
            self.marks.append(len(self.stack))
        elif name in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE"):
            self.stack.append(_Value(name.removeprefix("EMPTY_").lower(), depth=1))
        elif name == "GLOBAL":
            if arg not in _GLOBALS:
                raise ForeignFile(f"its pickle names {arg!r}")
            self.stack.append(_Value(_GLOBALS[arg]))
        elif name in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"):
            self.stack.append(_tuple(self.to_mark() if name == "TUPLE" else self.pop(int(name[-1]))))
        elif name in ("APPEND", "APPENDS", "SETITEM", "SETITEMS"):
            items = self.to_mark() if name.endswith("S") else self.pop(2 if name == "SETITEM" else 1)
            self.stack.append(_filled(self.pop(1)[0], "list" if name.startswith("APPEND") else "dict", items))
        elif name == "REDUCE":
            self.stack.append(self.counted(_called(*self.pop(2))))
        elif name == "BINPERSID":
            if self.pop(1)[0].kind != "pid":
                raise ForeignFile("its pickle loads a storage by something other than save's persistent id")
            self.stack.append(_Value("storage"))
        elif name in ("BINPUT", "LONG_BINPUT"):
            self.memo[arg] = self.pop(1)[0]
            self.stack.append(self.memo[arg])
        elif name in ("BINGET", "LONG_BINGET"):
            self.stack.append(self.counted(_fetched(self.memo, arg)))
        elif name != "PROTO":
            raise ForeignFile(f"its pickle has a {name} opcode")

    def counted(self, value: _Value) -> _Value:
        if value.kind == "tensor":
            self.tensors += 1
            if self.tensors > MAX_TENSORS:
                raise ForeignFile(f"its pickle holds more than {MAX_TENSORS} tensors")
        return value

    def pop(self, n: int) -> list[_Value]:
        """The top ``n`` values, none of them below the last mark."""
        at = len(self.stack) - n
        if at < (self.marks[-1] if self.marks else 0):
            raise ForeignFile("its pickle takes more values than it pushed")
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def to_mark(self) -> list[_Value]:
        if not self.marks:
            raise ForeignFile("its pickle takes values up to a mark it never set")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items


def _nested(kind: str, items: list[_Value], depth: int = 1, length: int = 0) -> _Value:
    if any(item.kind not in _PLAIN for item in items):
        raise ForeignFile(f"its pickle puts a {', '.join(sorted({i.kind for i in items} - _PLAIN))} in a {kind}")
    value = _Value(kind, max([depth, *(item.depth + 1 for item in items)]), length + len(items))
    if value.depth > MAX_DEPTH:
        raise ForeignFile(f"its pickle nests containers more than {MAX_DEPTH} deep")
    return value


def _tuple(items: list[_Value]) -> _Value:
    """A plain tuple, or one of the two tuples ``save`` builds around a tensor: its storage's persistent id
    ("storage", storage class, key, location, size), and its rebuild's arguments (storage, offset, size,
    stride, requires_grad, hooks, and the dtype and metadata where present)."""
    kinds = tuple(item.kind for item in items)
    if kinds == ("str", "storage-class", "str", "str", "scalar"):
        return _Value("pid")
    if 6 <= len(kinds) <= 8 and kinds[0] == "storage" and kinds[5] == "hooks":
        _nested("tensor's arguments", items[1:5] + items[6:])
        size, stride = items[2], items[3]
        if (size.kind, stride.kind) != ("tuple", "tuple") or size.length != stride.length or size.length > MAX_DIMS:
            raise ForeignFile(
                f"its pickle builds a tensor of {size.length} sizes and {stride.length} strides, at most {MAX_DIMS}"
            )
        return _Value("args")
    return _nested("tuple", items)


def _filled(container: _Value, kind: str, items: list[_Value]) -> _Value:
    if container.kind != kind or (kind == "dict" and len(items) % 2):
        raise ForeignFile(f"its pickle adds to a {container.kind} as to a {kind}")
    if kind == "dict" and any(key.kind not in ("str", "scalar") for key in items[::2]):
        raise ForeignFile("its pickle keys a dict by other than a string or a number")  # a key load never looks into
    return _nested(kind, items, container.depth, container.length)


def _called(function: _Value, args: _Value) -> _Value:
    """The only calls ``save`` writes: a tensor's rebuild, and its empty hooks."""
    if function.kind == "rebuild" and args.kind == "args":
        return _Value("tensor")
    if function.kind == "hooks-class" and args.kind == "tuple" and args.length == 0:
        return _Value("hooks")
    raise ForeignFile(f"its pickle calls a {function.kind} with a {args.kind}")


def _fetched(memo: dict[int, _Value], key: int) -> _Value:
    if key not in memo:
        raise ForeignFile("its pickle fetches what it never stored")
    if memo[key].kind in _CONTAINERS:
        raise ForeignFile(f"its pickle holds one {memo[key].kind} in two places")
    return memo[key]
