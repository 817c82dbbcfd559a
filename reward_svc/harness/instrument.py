"""Dynamic evidence collected in the candidate's process.

- ``LaunchCounter`` sees every Triton launch and every call into a ``load_inline`` extension.
  In *knockout* mode it poisons whatever each launch wrote: if the model's output is still right
  with the custom kernels' results destroyed, those kernels did not compute it (a decoy).
- ``OpRecorder`` lists the aten operators the forward ran, and the work they did by family, to
  compare with the reference's.
- ``IntegritySnapshot`` remembers the functions the harness relies on (timers, sync, torch
  entry points, the harness's own code and hooks) and reports any that were replaced.

All of it lives in the candidate's interpreter: it holds because the capability policy
(``reward_svc/policy/``) keeps the candidate's Python from reaching these objects, and the
judge re-derives from output files what it can (docs/ARCHITECTURE.md, "Trust boundary").
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from services.children import tensors
from services.children.ops import OpRecorder


class LaunchCounter:
    def __init__(self) -> None:
        self.launches: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.knockout = False
        self.poisoned = 0
        self.copies = 0  # writes the knockout left alone: copies of a launch's inputs
        # The reference has an op that acts as a copy on the knockout's values (a clamp whose bounds do
        # not bind there): an honest kernel of it looks like a copy, so copies are poisoned like the rest.
        self.copies_are_work = False
        self.recorder: OpRecorder | None = None  # while set, launches join its path
        self.forged: list[str] = []  # launches refused for an argument posing as a tensor
        self.refused_sources: list[str] = []  # load_inline calls reward_svc/policy/native.py refused

    @property
    def total(self) -> int:
        return sum(self.launches.values())

    def around(self, label: str, call: Callable[[], Any], args: Any, kwargs: Any) -> Any:
        """Count one launch; in knockout mode, poison every tensor it wrote and returned (but copies of
        its inputs: a copy computes nothing). Inside it, the recorder leaves out tensor plumbing (the
        Triton interpreter copies each argument with aten ops) and counts compute ops: a launch hook,
        a ``load_inline`` function's ATen calls are the forward's own work."""
        self.launches[label] += 1
        recorder = self.recorder
        if recorder is not None:
            inner = call

            def call() -> Any:
                recorder.launch_depth += 1
                try:
                    result = inner()
                finally:
                    recorder.launch_depth -= 1
                recorder.launched(label, launch_tensors(args, kwargs), result)
                return result

        if recorder is not None:
            recorder.path.append(f"launch:{label}")
            if recorder.provenance_key is not None:
                return self._follow_writes(recorder, label, call, launch_tensors(args, kwargs))
        if not self.knockout:
            return self._call(label, call)
        return self._knock_out(
            label, call, launch_tensors(args, kwargs), recorder.harness_work if recorder is not None else contextlib.nullcontext
        )

    def _knock_out(
        self,
        label: str,
        call: Callable[[], Any],
        inputs: list[torch.Tensor],
        harness_work: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> Any:
        """The launch, then poison on what it wrote. A tensor it left bit for bit as it was was
        either only read or written with the values it held already (an output buffer kept across
        calls, after the refresh trial computed the same answer): poisoned and launched onto once
        more, the ones it writes are outputs too, and the others get their values back."""
        with harness_work():
            inputs = [tensors.memory_of(t) for t in inputs]  # an expanded argument takes the knockout's writes as its memory
            before = [t.clone() for t in inputs]
        result = self._call(label, call)
        with harness_work():
            _synchronize()
            changed = [t for t, old in zip(inputs, before) if not tensors.same_bits(t, old)]
            written = [t for t in changed if self.copies_are_work or not tensors.is_copy_of(t, before)]
            self.copies += len(changed) - len(written)
            kept = [(t, old) for t, old in zip(inputs, before) if tensors.same_bits(t, old)]
            if kept:
                # the second launch writes into a copy's destination again, from its now poisoned source: the copies
                # the knockout leaves alone get back what the first launch left in them (the rest is poisoned anyway)
                first = [(t, t.clone()) for t in changed if not any(t is w for w in written)]
                # integers and flags the launch computed get their own answer back, to be poisoned below: moved
                # from the second launch's answer (on poisoned inputs) an index can land on the right one again
                first += [(t, t.clone()) for t in written if not (t.is_floating_point() or t.is_complex())]
                with harness_writes():
                    for t, _ in kept:
                        tensors.poison_(t)
                poisoned = [t.clone() for t, _ in kept]
                call()
                _synchronize()
                with harness_writes():
                    for t, after in first:
                        t.copy_(after)
                    for (t, old), poison in zip(kept, poisoned):
                        if tensors.same_bits(t, poison):
                            t.copy_(old)  # only read: as it was
                        else:
                            written.append(t)
            returned = tensors.tensors_in(result)
            computed = [t for t in returned if self.copies_are_work or not tensors.is_copy_of(t, before)]
            self.copies += len(returned) - len(computed)
            with harness_writes():
                for t in written + computed:
                    tensors.poison_(t)
                    self.poisoned += 1
        return result

    def _follow_writes(self, recorder: OpRecorder, label: str, call: Callable[[], Any], inputs: list[torch.Tensor]) -> Any:
        """A launch under provenance tracking: the tensors it changed, and those it returned, hold
        what a custom kernel computed."""
        key = recorder.provenance_key
        assert key is not None, "a launch is followed only under provenance tracking"
        with recorder.harness_work():
            before = [tensors.fingerprint(t, key) for t in inputs]
        result = self._call(label, call)
        with recorder.harness_work():
            _synchronize()
            for t, old in zip(inputs, before):
                if tensors.fingerprint(t, key) != old:
                    recorder.mark_written(t)
            for t in tensors.tensors_in(result):
                recorder.mark_written(t)
        return result

    def _call(self, label: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except BaseException:
            self.failures[label] += 1
            raise

    def install_triton(self) -> None:
        """Wrap the launch entry point of compiled and interpreted Triton kernels."""
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            return
        classes: list[Any] = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            cls.run = self._counted_run(cls.run)

    def _counted_run(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``JITFunction.run`` counted (the original in a closure, not a parameter a caller could pass)."""

        def run(fn_self: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("warmup"):
                return original(fn_self, *args, **kwargs)
            label = f"triton:{getattr(getattr(fn_self, 'fn', None), '__name__', 'kernel')}"
            forged = forged_pointers(args, kwargs)
            if forged:
                self.forged.append(f"{label}: {forged}")
                raise TypeError(f"{label} launched with {forged}: a Triton launch takes tensors")
            return self.around(label, lambda: original(fn_self, *args, **kwargs), args, kwargs)

        return run

    def wrap_extension(self, module: types.ModuleType, name: str) -> types.ModuleType:
        """A stand-in for a load_inline module whose every function call is counted."""
        counted = types.ModuleType(getattr(module, "__name__", name))
        for attr in dir(module):
            value = getattr(module, attr)
            if callable(value) and not attr.startswith("__") and not isinstance(value, type):
                value = self._counted(f"cuda:{name}.{attr}", value)
            setattr(counted, attr, value)
        return counted

    def _counted(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.around(label, lambda: fn(*args, **kwargs), args, kwargs)

        return call


def launch_tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors a launch can read or write: its tensor arguments, and the tensors Triton's
    wrappers carry (``TensorDescriptor``, ``triton.reinterpret``: a ``base`` attribute), each view
    once. A tensor passed twice (a parameter as two arguments, a buffer standing in for an unused
    one) is one tensor: the knockout restores what a launch only read, and a second copy of it
    would have read as written and stayed poisoned for every later call."""
    found = tensors.tensors_in((args, kwargs))
    for value in [*(args if isinstance(args, (list, tuple)) else ()), *(kwargs or {}).values()]:
        base = getattr(value, "base", None) if not isinstance(value, torch.Tensor) else None
        if isinstance(base, torch.Tensor):
            found.append(base)
    unique: dict[tuple[Any, ...], torch.Tensor] = {}
    for t in found:
        view = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) if t.layout == torch.strided else (id(t),)
        unique.setdefault(view, t)
    return list(unique.values())


def forged_pointers(args: Any, kwargs: Any) -> str | None:
    """An argument that offers ``data_ptr()`` (Triton reads any such object as a pointer) but is
    neither a tensor nor one of Triton's own wrappers around a tensor: a pointer to anywhere."""
    for value in [*(args if isinstance(args, (list, tuple)) else ()), *(kwargs or {}).values()]:
        if isinstance(value, torch.Tensor) or not hasattr(type(value), "data_ptr"):
            continue
        base = getattr(value, "base", None)
        if not (type(value).__module__.startswith("triton.") and isinstance(base, torch.Tensor)):
            return f"a {type(value).__name__} posing as a tensor"
    return None


def harness_writes() -> torch.inference_mode:
    """Where the knockout writes into the candidate's tensors: inference mode, where an inference tensor
    (made under the candidate's own ``torch.inference_mode``) takes an in-place write as a plain one does.
    Outside it the write raises, and the knockout read the harness's error as the forward hiding."""
    return torch.inference_mode()


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _watched_functions() -> dict[str, Any]:
    import builtins

    import torch.utils.cpp_extension as cpp_extension

    watched = {
        "time.perf_counter": time.perf_counter,
        "time.perf_counter_ns": time.perf_counter_ns,
        "time.time": time.time,
        "time.monotonic": time.monotonic,
        "threading.Thread.start": threading.Thread.start,
        "torch.allclose": torch.allclose,
        "torch.equal": torch.equal,
        "torch.isclose": torch.isclose,
        "torch.save": torch.save,
        "torch.load": torch.load,
        "torch.random.manual_seed": torch.random.manual_seed,  # the harness seeds with it (children/models.py)
        "torch.Tensor.clone": torch.Tensor.clone,
        "torch.Tensor.to": torch.Tensor.to,
        "torch.Tensor.copy_": torch.Tensor.copy_,
        "torch.Tensor.__eq__": torch.Tensor.__eq__,
        "torch.nn.Module.__call__": torch.nn.Module.__call__,
        "torch.utils._python_dispatch.TorchDispatchMode.__enter__": TorchDispatchMode.__enter__,
        "builtins.open": builtins.open,
        "builtins.print": builtins.print,
        "builtins.isinstance": builtins.isinstance,
        "builtins.len": builtins.len,
        "builtins.sum": builtins.sum,
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize,
        "torch.cuda.current_stream": torch.cuda.current_stream,
        "torch.utils.cpp_extension.load_inline": cpp_extension.load_inline,
        "json.dumps": json.dumps,
        "json.loads": json.loads,
        "json.JSONEncoder.encode": json.JSONEncoder.encode,
        "os.replace": os.replace,
        "os.write": os.write,
        "os._exit": os._exit,
    }
    try:
        from triton.runtime.jit import JITFunction

        watched["triton.JITFunction.run"] = JITFunction.run
        from triton.runtime.interpreter import InterpretedFunction

        watched["triton.InterpretedFunction.run"] = InterpretedFunction.run
    except ImportError:
        pass
    watched.update(_harness_code())
    return watched


HARNESS_PACKAGES = ("reward_svc.", "services.")  # the harness, and the child kit it runs on (services.children)


def _harness_code() -> dict[str, Any]:
    """The harness's own modules, their functions and classes, and those classes' methods: what the
    candidate's process runs to collect and report the evidence."""
    found: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(HARNESS_PACKAGES) or not isinstance(module, types.ModuleType):
            continue
        found[f"sys.modules[{name}]"] = module
        for attr, value in list(vars(module).items()):
            if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == name:
                found[f"{name}.{attr}"] = value
                if isinstance(value, types.FunctionType):
                    found[f"{name}.{attr}.__code__"] = value.__code__
                else:
                    for method, function in list(vars(value).items()):
                        if isinstance(function, types.FunctionType):
                            found[f"{name}.{attr}.{method}"] = function
                            found[f"{name}.{attr}.{method}.__code__"] = function.__code__
    return found


class IntegritySnapshot:
    """Identity of every function the harness trusts (its own code, the hooks it installed, the torch
    and timer functions it calls), taken once the hooks are in and before the candidate is imported."""

    def __init__(self) -> None:
        self.expected = _watched_functions()
        self.flags = precision_flags()

    def replaced(self) -> list[str]:
        now = _watched_functions()
        return [name for name, fn in self.expected.items() if now.get(name) is not fn]

    def precision_changes(self) -> list[str]:
        now = precision_flags()
        return [f"{k}: {self.flags[k]} -> {now[k]}" for k in self.flags if now[k] != self.flags[k]]


# Events no kernel's Python raises once its module is imported: reaching frames or the heap, other
# processes, the network, foreign libraries, or files outside the child's own directories. Each one
# refused is written to the audit log at once (the worker reads it: collected outside the objects the
# candidate's code can reach), and raised where it happened.
AUDIT_REFUSED_PREFIXES = ("socket.", "winreg.", "msvcrt.")
AUDIT_REFUSED = frozenset(
    {
        "sys.settrace",
        "sys.setprofile",
        "sys._current_frames",
        "sys._current_exceptions",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "os.system",
        "os.exec",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "pty.spawn",
        "sys.addaudithook",
        "cpython.PyInterpreterState_Clear",
        "os.chmod",
        "os.chown",
    }
)
FILE_EVENTS = frozenset(
    {
        "open",
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.symlink",
        "os.link",
        "os.truncate",
        "shutil.rmtree",
        "shutil.move",
        "shutil.copyfile",
        "os.utime",
    }
)
TWO_PATH_EVENTS = frozenset({"os.rename", "os.link", "shutil.move", "shutil.copyfile"})
# Programs a kernel's build runs (nvcc's phases, the host compiler and linker, Triton's bundled ptxas and
# its launcher stubs' compiler, ldconfig for libcuda), by name or name prefix (``ptxas-blackwell``, ``gcc-12``).
TOOLCHAIN = frozenset(
    {
        "nvcc",
        "gcc",
        "g++",
        "cc",
        "c++",
        "ld",
        "ld.gold",
        "ld.bfd",
        "ninja",
        "cudafe++",
        "cicc",
        "fatbinary",
        "nvlink",
        "nvdisasm",
        "cuobjdump",
        "ldconfig",
        "ldconfig.real",
        "which",
        "uname",
        "as",
        "ar",
        "clang",
        "clang++",
    }
)
TOOLCHAIN_PREFIXES = ("ptxas", "gcc-", "g++-", "clang-", "x86_64-linux-gnu-")


SHELLS = frozenset({"bash", "sh", "dash"})
BUILD_CODE = ("reward_svc/nvcc_phases.py", "reward_svc/compile.py")  # run nvcc's plan through a shell


def _spawned_by_the_build() -> bool:
    """Whether a process is being started by the harness's own compile path (nvcc's phases run as
    shell steps there), not by anything else in the child."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(40):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(BUILD_CODE):
            return True
        frame = frame.f_back
    return False


def install_audit_hook(log_path: str, writable: list[str], exchange: socket.socket | None = None) -> Callable[[], None]:
    """An audit hook (it cannot be removed) that refuses ``AUDIT_REFUSED`` events, processes other than
    the toolchain's, and writes (or removals) outside ``writable``; returns the switch that arms it,
    pulled once the harness is set up, just before the candidate is imported. Messages on ``exchange``
    (the harness's device exchange socket) pass: what arrives there is held to the outputs' fingerprints,
    as a file written under an output's name is."""
    import os

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    roots = tuple(os.path.realpath(p) + os.sep for p in (*writable, "/dev", "/proc/self"))  # /dev/null for a subprocess's output
    log_real = os.path.realpath(log_path)
    armed = [False]

    def refuse(event: str, detail: str) -> None:
        os.write(fd, f"{event}: {detail}"[:500].replace("\n", " ").encode(errors="replace") + b"\n")
        raise PermissionError(f"kz-audit: {event} is not a kernel's to do")

    def writes(event: str, args: tuple[Any, ...]) -> bool:
        if event != "open":
            return True
        mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
        return bool((isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & 0o3))

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if not armed[0] or (event == "socket.sendmsg" and exchange is not None and args and args[0] is exchange):
            return
        if event in AUDIT_REFUSED or event.startswith(AUDIT_REFUSED_PREFIXES):
            refuse(event, repr(args)[:200])
        elif event in ("subprocess.Popen", "os.posix_spawn"):
            executable = os.path.basename(os.fsdecode(args[0] if args[0] else (args[1] or [""])[0]))
            allowed = (
                executable in TOOLCHAIN
                or executable.startswith(TOOLCHAIN_PREFIXES)
                or (executable in SHELLS and _spawned_by_the_build())
            )
            if not allowed:
                refuse(event, executable)
        elif event in FILE_EVENTS and args and writes(event, args):
            # a rename, link or move writes where it goes as well as where it comes from (a symlink: where it is made)
            for target in args[1:2] if event == "os.symlink" else args[:2] if event in TWO_PATH_EVENTS else args[:1]:
                if not isinstance(target, (str, bytes, os.PathLike)):
                    continue
                path = os.path.realpath(os.fsdecode(target))
                if path == log_real or not (path + os.sep).startswith(roots):
                    refuse(event, path)

    sys.addaudithook(hook)

    def arm() -> None:
        armed[0] = True

    return arm


def precision_flags() -> dict[str, Any]:
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "default_dtype": str(torch.get_default_dtype()),
    }
