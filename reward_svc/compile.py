"""A fast, content-addressed drop-in for ``torch.utils.cpp_extension.load_inline``.

KernelBench CUDA candidates call ``load_inline`` at import time. Stock ``load_inline`` spends
almost all of its time parsing torch headers: the candidate's ``#include <torch/extension.h>``
pulls the whole C++ frontend (nn, optim, data, pybind) into a ``.cu`` that nvcc parses three
times over (cudafe++, cicc, then the host compiler), and its ninja build lives in a per-name
directory that is neither shared across processes nor keyed on content.

This module is imported inside the sandboxed child, before the candidate, and
:func:`install_fast_load_inline` swaps ``load_inline`` for one that

- keys every build on a hash of everything that changes the binary (sources, bindings, flags,
  torch / Python / compiler versions, target arch) and keeps it in ``cache_dir/<hash>/``; a hit
  imports the ``.so`` directly, with no ninja and no compiler;
- compiles a miss with the lightest header set that still compiles, falling back to the
  candidate's own headers when the light one fails (correctness first):

  ``lean``      the minimal tier with copies of its per-operator headers that leave out what
                each includes for the runtime around its operator (``OPERATOR_CONTEXT_HEADERS``:
                the global context, device guards, argument checks, tracing; half the
                preprocessed lines), found first on the include path; only for sources that name
                nothing those headers alone declare (``context_only_names``);
  ``minimal``   ``ATen/core/Tensor.h`` + ``ATen/Dispatch.h`` + the per-operator headers
                (``ATen/ops/<name>.h``) of the names the source uses + torch's own
                ``namespace torch`` aliases; no ``ATen/Functions.h``, no autograd, no frontend;
  ``light``     ``torch/types.h`` (what ``load_inline`` itself prepends to every ``.cu``) in
                place of ``torch/extension.h``; for the bindings unit plus torch's pybind
                helpers;
  ``original``  exactly what stock ``load_inline`` compiles.

  Each tier sees a subset of the declarations the next one sees, so a tier that compiles means
  what the original means; the one known difference (``torch::`` factories of
  ``variable_factories.h`` resolve to their ``at::`` twins, which differ only in
  ``requires_grad`` handling and, for ``tensor``/``from_blob``, in overloads) is screened out;
- compiles the bindings unit (``main.cpp``) and the CUDA unit (``cuda.cu``) in parallel, for the
  one target arch of the device (no PTX, no multi-arch), then links and imports; the bindings
  unit at the lean and minimal tiers starts from a GCC precompiled header of what every one
  starts with (``bindings_base``) where one was built for its flags, and only when nothing in the
  unit comes before its prelude; the CUDA unit's final host compile starts from a GCC precompiled
  header of the host code that cudafe++ writes for the prelude's base headers (``HostPrefix``,
  reward_svc/nvcc_phases.py) where its own begins with the same text. Both kinds of header are
  built for the flags candidates pass most by a GPU worker's trusted child and shared read-only
  (``$KZ_PRECOMPILED_HEADERS``, reward_svc/shared_builds.py); torch's own ``use_pch`` writes into
  site-packages, read-only in the sandbox;
- publishes atomically (build in a temporary directory, ``rename``), so concurrent processes
  building the same hash are safe: the first rename wins and the others use its result;
- with ``compile_only=True`` (no GPU here) compiles both units with ``-c`` only and returns a
  stand-in module whose functions raise ``RuntimeError('compiled only: no GPU here')``.

nvcc (13.0) has no precompiled headers for its front ends, and its phases for one ``.cu`` run
strictly in sequence (cicc needs the module id that cudafe++ writes last), so the header diet is
the lever for cudafe++ and cicc: what each
tier costs is measured by ``benchmarks/compile_strategies.py`` (``benchmarks/results/
compile_strategies_cpu.json``), cold and cached builds on a GPU host by ``benchmarks/reward_gpu.py``
(``benchmarks/results/reward_gpu_h200_*.json``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import types
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reward_svc.nvcc_phases import HostPrefix, build_host_prefix, compile_cu, toolchain_env

# Bump when the generated sources, flags or cache layout change: old cache entries then miss.
STRATEGY_VERSION = "2"
STDERR_TAIL_CHARS = 4000
COMPILE_ONLY_MESSAGE = "compiled only: no GPU here"
DEFAULT_COMPILE_ONLY_ARCH = "sm_90"

UMBRELLA_HEADERS = ("torch/extension.h", "torch/torch.h", "torch/all.h", "torch/types.h", "ATen/ATen.h")
_UMBRELLA_INCLUDE = re.compile(
    r'^[ \t]*#[ \t]*include[ \t]*[<"](' + "|".join(re.escape(h) for h in UMBRELLA_HEADERS) + r')[>"][^\n]*$',
    re.MULTILINE,
)
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_QUOTED = re.compile(
    "[\u2018'\"`]([^\u2018\u2019'\"`\n]{1,200})[\u2019'\"`]"
)  # a diagnostic's quoted names: gcc's ‘x’, nvcc's "x"
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
# Comments and string or character literals (raw ones too), in one left-to-right scan (a "//" in a string
# is no comment); numbers are matched to be kept, so that a digit separator (1'000) opens no literal.
_NOT_CODE = re.compile(
    r"//[^\n]*|/\*.*?\*/"
    r'|(?<!\w)(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(.*?\)\1"'
    r'|"(?:\\.|[^"\\\n])*"'
    r"|(?<![\w.])\.?\d(?:[eEpP][+-]|'?[\w.])*"
    r"|'(?:\\.|[^'\\\n])*'",
    re.DOTALL,
)
# Names that touch requires_grad (where torch:: and at:: factories differ), autograd or registration,
# and the factories whose torch:: and at:: overloads differ, called: a source using any of them skips
# the minimal tier (a variable or a parameter named ``tensor`` means nothing to torch; ``torch::tensor``
# named anywhere, in a macro or in parentheses, does).
_MINIMAL_SCREEN = frozenset({"requires_grad", "autograd", "TORCH_LIBRARY", "TORCH_LIBRARY_IMPL"})
_MINIMAL_SCREEN_CALLS = re.compile(r"\b(?:tensor|from_blob)\s*\(|\btorch\s*::\s*(?:tensor|from_blob)\b")
_OPS_HEADER_SUFFIXES = ("_ops", "_native", "_meta", "_dispatch")
# What every per-operator header includes for the runtime around its operator, not for its own
# declarations (those need only the operator's ``_ops.h``, ``TensorOptions`` and kin).
OPERATOR_CONTEXT_HEADERS = frozenset({"ATen/Context.h", "ATen/DeviceGuard.h", "ATen/TensorUtils.h", "ATen/TracerMode.h"})
LEAN_INCLUDE_DIR = "kz_lean"
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"][^\n]*\n?', re.MULTILINE)
_CUDA_LIBRARY_HEADERS = ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h", "cusolver_common.h")
_CUDA_LIBRARY_MENTION = re.compile(r"cublas|cusparse|cusolver", re.IGNORECASE)
BINDINGS_HEADERS = ("torch/csrc/utils/pybind.h", "torch/csrc/Exceptions.h")
MINIMAL_BASE_HEADERS = ("optional", "ATen/core/Tensor.h", "ATen/Dispatch.h")
_BINDINGS_BASE_GUARD = "KZ_BINDINGS_BASE_H"
BINDINGS_PRELUDE_INCLUDE = '#include "kz_bindings.h"'
# A directory of precompiled headers, built by a child that runs only our code and shared read-only
# (reward_svc/shared_builds.py): bindings bases, ``bindings-<pch_key>/kz_pch.h(.gch)``, and CUDA host
# prefixes, ``cuda-host-<host_prefix_key>/``; each build finds its own by its flags.
PRECOMPILED_HEADERS_ENV = "KZ_PRECOMPILED_HEADERS"
PCH_HEADER = "kz_pch.h"
CUDA_PRELUDE = "kz_cuda.h"
# What is built ahead: a CUDA source's bindings unit and CUDA unit with the flags candidates pass most (none,
# -O3); a unit with other flags compiles without one (GCC refuses a header precompiled with other options).
BINDINGS_PCH_VARIANTS: tuple[tuple[bool, tuple[str, ...]], ...] = ((True, ()), (True, ("-O3",)))
HOST_PREFIX_VARIANTS: tuple[tuple[str, ...], ...] = ((), ("-O3",))

# Declarations that torch's headers need from the CUDA math libraries, for a compile-only
# machine whose toolkit lacks them. Calls into those libraries still fail (ToolchainUnavailable).
_CUDA_LIBRARY_STUBS = {
    "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t;\ntypedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;\n",
    "cublasLt.h": "#include <cublas_v2.h>\ntypedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusparse.h": "typedef struct cusparseContext* cusparseHandle_t;\n"
    "typedef enum { CUSPARSE_STATUS_SUCCESS = 0 } cusparseStatus_t;\n"
    "const char* cusparseGetErrorString(cusparseStatus_t status);\n",
    "cusolver_common.h": "typedef enum { CUSOLVER_STATUS_SUCCESS = 0, CUSOLVER_STATUS_INVALID_VALUE = 3 } cusolverStatus_t;\n",
    "cusolverDn.h": "#include <cusolver_common.h>\ntypedef struct cusolverDnContext* cusolverDnHandle_t;\n",
}


@dataclass
class CompileEntry:
    """One ``load_inline`` call, as the verdict reports it."""

    name: str
    content_hash: str
    cache_hit: bool
    seconds: float
    strategy: str
    ok: bool
    stderr_tail: str = ""


@dataclass
class CompileLog:
    """What happened to every ``load_inline`` call in this process, in call order."""

    entries: list[CompileEntry] = field(default_factory=list)

    def to_json(self) -> list[dict[str, Any]]:
        """Plain dicts, for the verdict's JSON."""
        return [asdict(e) for e in self.entries]


class CompileError(RuntimeError):
    """The candidate's sources do not compile; the message carries the compiler's trimmed stderr."""

    def __init__(self, name: str, stderr_tail: str) -> None:
        super().__init__(f"load_inline({name!r}) failed to compile:\n{stderr_tail}")
        self.name = name
        self.stderr_tail = stderr_tail


class ToolchainUnavailable(RuntimeError):
    """This machine cannot check the source (a CUDA library header is missing): not the candidate's fault."""


@dataclass(frozen=True)
class InlineRequest:
    """The arguments of one ``load_inline`` call that change the binary, normalised."""

    name: str
    cpp_sources: tuple[str, ...]
    cuda_sources: tuple[str, ...]
    functions: tuple[tuple[str, str], ...] | None
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    extra_include_paths: tuple[str, ...] = ()
    with_cuda: bool = False
    is_python_module: bool = True
    with_pytorch_error_handling: bool = True
    no_implicit_headers: bool = False


@dataclass(frozen=True)
class Plan:
    """How to build: header tier per unit (tried in order), and whether units compile in parallel."""

    cpp_tiers: tuple[str, ...]
    cuda_tiers: tuple[str, ...]
    parallel: bool = True


@dataclass(frozen=True)
class Toolchain:
    """Facts about this machine that change the compiled artefact (all part of the cache key)."""

    torch_version: str
    python_version: str
    cxx: str
    cxx_version: str
    nvcc: str | None
    nvcc_version: str
    cuda_home: str | None
    cxx_std: str
    arch_flags: tuple[str, ...]
    torch_include: str
    python_include: str
    extra_defines: tuple[str, ...]
    stub_include: str | None

    @property
    def same_text_dirs(self) -> tuple[str, ...]:
        """Directories whose headers are the same text wherever they are (a compile-only machine's stubs, in each
        process's own cache): named alike when flags are compared or keyed."""
        return (self.stub_include,) if self.stub_include else ()


# ----------------------------------------------------------------------------- public entry


def install_fast_load_inline(
    cache_dir: Path, *, compile_only: bool = False, arch: str | None = None, layers: Sequence[Path] = ()
) -> CompileLog:
    """Replace ``torch.utils.cpp_extension.load_inline`` in this process; return the log it fills.

    Must run before the candidate imports ``load_inline`` by name. ``arch`` (e.g. ``"sm_90"``)
    overrides the target; by default it is the current device's, or sm_90 when compile-only.
    ``layers`` are read-only caches looked up before ``cache_dir``, where a miss builds.
    Calling it again replaces the previous installation (and returns a fresh log).
    """
    import torch.utils.cpp_extension as cpp_extension

    original = getattr(cpp_extension.load_inline, "_kz_original", cpp_extension.load_inline)
    builder = Builder(Path(cache_dir), compile_only=compile_only, arch=arch, layers=layers)

    @functools.wraps(original)
    def load_inline(
        name: str,
        cpp_sources: str | Sequence[str],
        cuda_sources: str | Sequence[str] | None = None,
        sycl_sources: str | Sequence[str] | None = None,
        functions: str | Sequence[str] | dict[str, str] | None = None,
        extra_cflags: Sequence[str] | None = None,
        extra_cuda_cflags: Sequence[str] | None = None,
        extra_sycl_cflags: Sequence[str] | None = None,
        extra_ldflags: Sequence[str] | None = None,
        extra_include_paths: Sequence[str] | None = None,
        build_directory: str | None = None,
        verbose: bool = False,
        with_cuda: bool | None = None,
        with_sycl: bool | None = None,
        is_python_module: bool = True,
        with_pytorch_error_handling: bool = True,
        keep_intermediates: bool = True,
        use_pch: bool = False,
        no_implicit_headers: bool = False,
        **newer: Any,
    ) -> Any:
        if sycl_sources or with_sycl or newer:
            # SYCL, or an argument from a torch newer than this drop-in knows: torch's own build.
            call = {k: v for k, v in locals().items() if k != "newer"}
            return original(**_original_kwargs(original, call), **newer)
        request = make_request(
            name,
            cpp_sources,
            cuda_sources,
            functions,
            extra_cflags,
            extra_cuda_cflags,
            extra_ldflags,
            extra_include_paths,
            with_cuda,
            is_python_module,
            with_pytorch_error_handling,
            no_implicit_headers,
        )
        return builder.load(request)

    load_inline._kz_original = original  # type: ignore[attr-defined]  # the one attribute our wrapper adds to torch's function
    cpp_extension.load_inline = load_inline
    return builder.log


def _original_kwargs(original: Callable[..., Any], call: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments that the installed torch's ``load_inline`` accepts (its signature varies by version)."""
    accepted = inspect.signature(original).parameters
    return {k: v for k, v in call.items() if k in accepted}


def make_request(
    name: str,
    cpp_sources: str | Sequence[str],
    cuda_sources: str | Sequence[str] | None = None,
    functions: str | Sequence[str] | dict[str, str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    with_cuda: bool | None = None,
    is_python_module: bool = True,
    with_pytorch_error_handling: bool = True,
    no_implicit_headers: bool = False,
) -> InlineRequest:
    """Normalise ``load_inline`` arguments the way torch does (str -> list, list of names -> dict).

    Empty flags are dropped (KernelBench passes ``extra_cflags=[""]``): they change nothing, so
    they must not change the cache key either.
    """
    cuda = _as_tuple(cuda_sources)
    return InlineRequest(
        name=name,
        cpp_sources=_as_tuple(cpp_sources),
        cuda_sources=cuda,
        functions=_normalise_functions(functions),
        extra_cflags=_flags(extra_cflags),
        extra_cuda_cflags=_flags(extra_cuda_cflags),
        extra_ldflags=_flags(extra_ldflags),
        extra_include_paths=tuple(os.path.abspath(p) for p in _flags(extra_include_paths)),
        with_cuda=bool(cuda) if with_cuda is None else bool(with_cuda),
        is_python_module=is_python_module,
        with_pytorch_error_handling=with_pytorch_error_handling,
        no_implicit_headers=no_implicit_headers,
    )


def _as_tuple(sources: str | Sequence[str] | None) -> tuple[str, ...]:
    if sources is None:
        return ()
    return (sources,) if isinstance(sources, str) else tuple(sources)


def _flags(flags: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(f.strip() for f in (flags or ()) if f.strip())


def _normalise_functions(functions: str | Sequence[str] | dict[str, str] | None) -> tuple[tuple[str, str], ...] | None:
    if functions is None:
        return None
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, dict):
        return tuple((k, v) for k, v in functions.items())
    if isinstance(functions, (list, tuple)):
        return tuple((f, f) for f in functions)
    raise ValueError(f"Expected 'functions' to be a list or dict, but was {type(functions)}")


# ----------------------------------------------------------------------------- the builder


class Builder:
    """Builds (or finds) one ``load_inline`` request; owns the cache directory and the log."""

    def __init__(
        self, cache_dir: Path, *, compile_only: bool = False, arch: str | None = None, layers: Sequence[Path] = ()
    ) -> None:
        self.cache_dir = cache_dir
        self.layers = tuple(layers)  # read-only caches looked up first (a source's published build)
        self.compile_only = compile_only
        self.arch = arch
        self.log = CompileLog()

    @functools.cached_property
    def toolchain(self) -> Toolchain:
        # Lazy: probing compilers and the device costs ~0.1 s, paid at the first load_inline only.
        return detect_toolchain(self.cache_dir, compile_only=self.compile_only, arch=self.arch)

    def content_hash(self, request: InlineRequest) -> str:
        """The cache key: everything that changes the artefact, and nothing else."""
        payload = {
            "strategy": STRATEGY_VERSION,
            "compile_only": self.compile_only,
            "request": asdict(request),
            "toolchain": portable(self.toolchain),
        }
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:32]

    def load(self, request: InlineRequest, plan: Plan | None = None) -> Any:
        """Return the built module (or stand-in), building it on a miss; log one entry either way."""
        start = time.perf_counter()
        key = self.content_hash(request)
        entry_dir = next((d / key for d in self.layers if _read_meta(d / key) is not None), self.cache_dir / key)
        meta = _read_meta(entry_dir)
        cache_hit = meta is not None
        if meta is None:
            try:
                meta = self._build_and_publish(request, key, plan or choose_plan(request, self.toolchain))
            except ToolchainUnavailable as unavailable:
                seconds = round(time.perf_counter() - start, 4)
                self.log.entries.append(
                    CompileEntry(request.name, key, False, seconds, "toolchain unavailable", False, _tail(str(unavailable)))
                )
                raise
        entry = CompileEntry(
            name=request.name,
            content_hash=key,
            cache_hit=cache_hit,
            seconds=0.0,
            strategy=meta["strategy"],
            ok=meta["ok"],
            stderr_tail=meta["stderr_tail"],
        )
        self.log.entries.append(entry)
        try:
            if not meta["ok"]:
                raise CompileError(request.name, meta["stderr_tail"])
            return self._materialise(request, entry_dir)
        finally:
            entry.seconds = round(time.perf_counter() - start, 4)

    def _materialise(self, request: InlineRequest, entry_dir: Path) -> Any:
        if self.compile_only:
            return CompiledOnlyModule(request.name, [f for f, _ in request.functions or ()])
        library = entry_dir / f"{request.name}.so"
        if not request.is_python_module:
            import torch

            torch.ops.load_library(str(library))
            return str(library)
        return import_extension(request.name, library)

    def _build_and_publish(self, request: InlineRequest, key: str, plan: Plan) -> dict[str, Any]:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        work = self.cache_dir / f".build-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        work.mkdir()
        try:
            meta = build(request, self.toolchain, plan, work, compile_only=self.compile_only)
            (work / "meta.json").write_text(json.dumps(meta))
            return _publish(work, self.cache_dir / key, meta)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _publish(work: Path, target: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Rename the finished build into place; if another process won the race, use its result."""
    try:
        os.rename(work, target)
        return meta
    except OSError:
        winner = _read_meta(target)
        if winner is None:
            raise
        return winner


def _read_meta(entry_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((entry_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def import_extension(name: str, library: Path) -> types.ModuleType:
    """Import a built extension by path, as torch does, without touching ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CompiledOnlyModule(types.ModuleType):
    """Stand-in for an extension that was compiled but cannot be loaded here (no GPU)."""

    def __init__(self, name: str, functions: Sequence[str]) -> None:
        super().__init__(name)
        for function in functions:
            setattr(self, function, _compiled_only_function(function))

    def __getattr__(self, attr: str) -> Callable[..., Any]:
        # Bindings the candidate declared itself (its own PYBIND11_MODULE) are unknown here.
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _compiled_only_function(attr)


def _compiled_only_function(name: str) -> Callable[..., Any]:
    def not_here(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(COMPILE_ONLY_MESSAGE)

    not_here.__name__ = name
    return not_here


# ----------------------------------------------------------------------------- toolchain


STUBS = "<stubs>"


def portable(toolchain: Toolchain) -> dict[str, Any]:
    """The toolchain as a cache key: a compile-only machine's stub headers are the same text in every
    process's own cache (versioned by their directory's name), so where they are does not count."""
    return {**asdict(toolchain), "stub_include": STUBS if toolchain.stub_include else None}


def detect_toolchain(cache_dir: Path, *, compile_only: bool, arch: str | None) -> Toolchain:
    """Probe torch, Python, the host compiler and nvcc once per process."""
    import torch
    import torch.utils.cpp_extension as cpp_extension

    cxx = _cxx_compiler(cpp_extension)
    cuda_home = _cuda_home(cpp_extension)
    nvcc = _nvcc(cuda_home)
    torch_include = os.path.join(os.path.dirname(torch.__file__), "include")
    stub_include = None
    if compile_only and cuda_home and not _has_cuda_library_headers(cuda_home):
        stub_include = str(_write_cuda_library_stubs(cache_dir))
    return Toolchain(
        torch_version=torch.__version__,
        python_version=sys.version.split()[0],
        cxx=cxx,
        cxx_version=_version_line((cxx, "--version"), first=True),
        nvcc=nvcc,
        nvcc_version=_version_line((nvcc, "--version"), first=False) if nvcc else "",
        cuda_home=cuda_home,
        cxx_std=_torch_cxx_std(cpp_extension),
        arch_flags=_arch_flags(arch, compile_only),
        torch_include=torch_include,
        python_include=sysconfig.get_path("include", scheme="posix_prefix"),
        extra_defines=_missing_header_defines(torch_include),
        stub_include=stub_include,
    )


def _cxx_compiler(cpp_extension: types.ModuleType) -> str:
    get = getattr(cpp_extension, "get_cxx_compiler", None)
    return get() if get else os.environ.get("CXX", "c++")


def _cuda_home(cpp_extension: types.ModuleType) -> str | None:
    """torch's CUDA_HOME when it has one (CUDA wheels); else the usual places (CPU wheel + nvcc)."""
    candidates = [
        getattr(cpp_extension, "CUDA_HOME", None),
        os.environ.get("CUDA_HOME"),
        os.environ.get("CUDA_PATH"),
        "/usr/local/cuda",
    ]
    for home in candidates:
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return home
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None


def _nvcc(cuda_home: str | None) -> str | None:
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        return os.path.join(cuda_home, "bin", "nvcc")
    return shutil.which("nvcc")


@functools.cache
def _version_line(cmd: tuple[str, ...], *, first: bool) -> str:
    """gcc names itself on its first line, nvcc its build on its last."""
    try:
        lines = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return ""
    return (lines[0] if first else lines[-1]) if lines else ""


def _torch_cxx_std(cpp_extension: types.ModuleType) -> str:
    """The -std= the installed torch uses for extensions, read from its build code (it moved from c++17 to c++20)."""
    try:
        source = inspect.getsource(cpp_extension._write_ninja_file_to_build_library)
    except (AttributeError, OSError, TypeError):
        return "c++17"
    found = re.findall(r"-std=(c\+\+\d+)", source)
    return found[0] if found else "c++17"


def _arch_flags(arch: str | None, compile_only: bool) -> tuple[str, ...]:
    """One real target, no PTX: the kernel only ever runs on this device (sm_90 when there is none)."""
    if arch is None and not compile_only:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            arch = f"sm_{major}{minor}"
    arch = arch or DEFAULT_COMPILE_ONLY_ARCH
    number = arch.removeprefix("sm_")
    return (f"-gencode=arch=compute_{number},code=sm_{number}",)


def _missing_header_defines(torch_include: str) -> tuple[str, ...]:
    # The CPU wheel ships c10/cuda headers but not their CMake-generated config header.
    generated = os.path.join(torch_include, "c10", "cuda", "impl", "cuda_cmake_macros.h")
    return () if os.path.exists(generated) else ("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",)


def _has_cuda_library_headers(cuda_home: str) -> bool:
    include_dirs = [os.path.join(cuda_home, "include"), os.path.join(cuda_home, "targets", "x86_64-linux", "include")]
    return all(any(os.path.exists(os.path.join(d, h)) for d in include_dirs) for h in _CUDA_LIBRARY_HEADERS)


def _write_cuda_library_stubs(cache_dir: Path) -> Path:
    stub_dir = cache_dir / f"_cuda_library_stubs_v{STRATEGY_VERSION}"
    stub_dir.mkdir(parents=True, exist_ok=True)
    for header, body in _CUDA_LIBRARY_STUBS.items():
        path = stub_dir / header
        if not path.exists():
            tmp = stub_dir / f".{header}.{uuid.uuid4().hex[:8]}"
            tmp.write_text(f"#pragma once\n// compile-only stub: this toolkit lacks {header}\n{body}")
            os.replace(tmp, path)
    return stub_dir


# ----------------------------------------------------------------------------- sources


def choose_plan(request: InlineRequest, toolchain: Toolchain) -> Plan:
    """Lightest tier first, then the candidate's own headers; parallel when there are two units."""
    if not minimal_tier_allowed(request, toolchain):
        tiers: tuple[str, ...] = ("light", "original")
    elif lean_tier_allowed(request, toolchain):
        tiers = ("lean", "minimal", "original")
    else:
        tiers = ("minimal", "original")
    return Plan(cpp_tiers=tiers, cuda_tiers=tiers, parallel=bool(request.cuda_sources))


def minimal_tier_allowed(request: InlineRequest, toolchain: Toolchain) -> bool:
    """The minimal tier needs torch's alias block and must not meet names it would resolve differently."""
    code = _code_only("\n".join(request.cpp_sources + request.cuda_sources))
    screened = set(_IDENTIFIER.findall(code)) & _MINIMAL_SCREEN or _MINIMAL_SCREEN_CALLS.search(code)
    return torch_namespace_block(toolchain.torch_include) is not None and not screened


def lean_tier_allowed(request: InlineRequest, toolchain: Toolchain) -> bool:
    """The lean tier has something to leave out (operator headers), and no name that only their context declares."""
    names = _identifiers("\n".join(request.cpp_sources + request.cuda_sources))
    context = _context_names(request, toolchain)
    return bool(names & aten_ops(toolchain.torch_include)) and context is not None and not names & context


def _context_names(request: InlineRequest, toolchain: Toolchain) -> frozenset[str] | None:
    """``context_only_names`` for the source's operators; None where a header cannot be read (no lean tier then)."""
    try:
        includes = operator_includes(toolchain.torch_include, source_ops(request, toolchain))
        return context_only_names(toolchain.torch_include, includes)
    except (OSError, UnicodeDecodeError, RecursionError):
        return None


def operator_includes(torch_include: str, ops: Iterable[str]) -> frozenset[str]:
    """What the operators' headers include besides their own declarations (``ATen/ops/<name>_ops.h``): one
    list for every operator, torch generates their headers from one template."""
    return frozenset(
        h for op in ops for h in _INCLUDE.findall(operator_header(torch_include, op).read_text()) if not h.startswith("ATen/ops/")
    )


def warm_header_screen() -> None:
    """Work out the lean tier's screen before a job (a quarter of a second on the first compile otherwise):
    any operator's header will do, torch generates them all from one template."""
    import torch

    torch_include = os.path.join(os.path.dirname(torch.__file__), "include")
    ops = aten_ops(torch_include)
    if ops and torch_namespace_block(torch_include) is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError, RecursionError):  # then each build works it out, or goes without
            context_only_names(torch_include, operator_includes(torch_include, [min(ops)]))


def cpp_unit(request: InlineRequest, tier: str) -> str:
    """``main.cpp`` as stock load_inline writes it, with the umbrella headers swapped for ``tier``."""
    parts = [] if request.no_implicit_headers else ["#include <torch/extension.h>"]
    parts += list(request.cpp_sources)
    if request.functions is not None:
        parts.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fname, doc in request.functions:
            target = f"torch::wrap_pybind_function({fname})" if request.with_pytorch_error_handling else fname
            parts.append(f'm.def("{fname}", {target}, "{doc}");')
        parts.append("}")
    return _swap_umbrellas("\n".join(parts), tier, BINDINGS_PRELUDE_INCLUDE)


def cuda_unit(request: InlineRequest, tier: str) -> str:
    """``cuda.cu`` as stock load_inline writes it, with the umbrella headers swapped for ``tier``."""
    parts = [] if request.no_implicit_headers else ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    parts += list(request.cuda_sources)
    return _swap_umbrellas("\n".join(parts), tier, '#include "kz_cuda.h"')


def _swap_umbrellas(text: str, tier: str, replacement: str) -> str:
    """Replace each umbrella include line in place (line numbers in diagnostics stay the same)."""
    if tier == "original":
        return text
    seen = False

    def swap(match: re.Match[str]) -> str:
        nonlocal seen
        first, seen = not seen, True
        return replacement if first else f"// {match.group(0).strip()} (kz: folded into the first include)"

    return _UMBRELLA_INCLUDE.sub(swap, text)


def prelude(request: InlineRequest, toolchain: Toolchain, tier: str, *, bindings: bool) -> str:
    """The header that stands in for the umbrella includes at ``tier``."""
    lines = ["#pragma once"]
    if tier == "lean":  # what sets it apart from the minimal tier is on the include path
        lines.append(f"// kz: ATen/ops/<name>.h from {LEAN_INCLUDE_DIR}/, without {', '.join(sorted(OPERATOR_CONTEXT_HEADERS))}")
    operators = [f"#include <ATen/ops/{op}.h>" for op in sorted(source_ops(request, toolchain))]
    if tier == "light":
        lines += ["#include <torch/types.h>", *(f"#include <{h}>" for h in BINDINGS_HEADERS if bindings)]
    elif bindings:  # what a precompiled header may hold (it then skips here), then the source's operators
        lines += [bindings_base(toolchain), *operators]
    else:
        lines += [
            *(f"#include <{h}>" for h in MINIMAL_BASE_HEADERS),
            *operators,
            torch_namespace_block(toolchain.torch_include) or "",
        ]
    return "\n".join(lines) + "\n"


def bindings_base(toolchain: Toolchain) -> str:
    """What a bindings unit starts with at the lean and minimal tiers, under its own guard: the text of the
    precompiled header, if there is one (``prebuilt_pch``), and of the unit's prelude either way."""
    includes = [f"#include <{h}>" for h in MINIMAL_BASE_HEADERS + BINDINGS_HEADERS]
    namespace = torch_namespace_block(toolchain.torch_include) or ""
    return "\n".join([f"#ifndef {_BINDINGS_BASE_GUARD}", f"#define {_BINDINGS_BASE_GUARD}", *includes, namespace, "#endif"])


def _identifiers(source: str) -> set[str]:
    """The names the code uses: not the words of its comments or its messages ("must be a CUDA tensor")."""
    return set(_IDENTIFIER.findall(_code_only(source)))


def _code_only(source: str) -> str:
    return _NOT_CODE.sub(_blank, source)


def _blank(match: re.Match[str]) -> str:
    text = match.group(0)
    if text.startswith(("//", "/*")):
        return " "
    return text if text[0].isdigit() or text[0] == "." else '""'  # a number stays; a literal is emptied


def source_ops(request: InlineRequest, toolchain: Toolchain) -> set[str]:
    """The operators whose per-operator headers the (lean and) minimal tiers include: those the source names."""
    return _identifiers("\n".join(request.cpp_sources + request.cuda_sources)) & aten_ops(toolchain.torch_include)


def operator_header(torch_include: str, op: str) -> Path:
    return Path(torch_include, "ATen", "ops", f"{op}.h")


def lean_operator_header(torch_include: str, op: str) -> str:
    """torch's ``ATen/ops/<op>.h`` without the includes of ``OPERATOR_CONTEXT_HEADERS``."""
    text = operator_header(torch_include, op).read_text()
    return _INCLUDE.sub(lambda m: "" if m.group(1) in OPERATOR_CONTEXT_HEADERS else m.group(0), text)


def write_lean_headers(request: InlineRequest, toolchain: Toolchain, unit_dir: Path) -> Path:
    """The lean copies of the source's operator headers, under a directory searched before torch's."""
    ops_dir = unit_dir / LEAN_INCLUDE_DIR / "ATen" / "ops"
    ops_dir.mkdir(parents=True, exist_ok=True)
    for op in source_ops(request, toolchain):
        (ops_dir / f"{op}.h").write_text(lean_operator_header(toolchain.torch_include, op))
    return unit_dir / LEAN_INCLUDE_DIR


@functools.lru_cache(maxsize=16)
def context_only_names(torch_include: str, includes: frozenset[str]) -> frozenset[str]:
    """Names declared at namespace scope (functions, types, aliases, macros) in torch headers that the
    minimal tier's prelude reaches only through ``OPERATOR_CONTEXT_HEADERS`` (among the operators' ``includes``): a
    source naming one might compile at the minimal tier and not at the lean one. Every include is
    followed, whatever its ``#if``; a name the regular expressions miss costs a failed lean attempt
    before the minimal tier, never a build."""
    kept = _header_closure(torch_include, (includes - OPERATOR_CONTEXT_HEADERS) | set(MINIMAL_BASE_HEADERS))
    dropped = _header_closure(torch_include, OPERATOR_CONTEXT_HEADERS) - kept
    return frozenset(name for path in dropped for name in _namespace_scope_names(path.read_text()))


def _header_closure(torch_include: str, roots: Iterable[str]) -> set[Path]:
    """The torch headers ``roots`` include, directly or not (system headers are not followed)."""
    search = (Path(torch_include), Path(torch_include, "torch", "csrc", "api", "include"))
    seen: set[Path] = set()
    pending = list(roots)
    while pending:
        found = next((d / pending[-1] for d in search if (d / pending[-1]).is_file()), None)
        pending.pop()
        if found is not None and found not in seen:
            seen.add(found)
            pending += _INCLUDE.findall(found.read_text())
    return seen


_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.MULTILINE)
_MACRO_NAME = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.MULTILINE)
_OPENS_NAMESPACE = re.compile(r'(?:\bnamespace(?:\s+[\w:]+)?|\bextern\s+"C(?:\+\+)?")\s*$')
_DECLARED_NAME = re.compile(
    r"\b(?:class|struct|enum|union)(?:[ \t]+class)?(?:[ \t]+[A-Z0-9_]+)*[ \t]+(\w+)[ \t]*(?:final[ \t]*)?[:{]"  # a type
    r"|\busing\s+(\w+)\s*="  # an alias
    r"|(?:[\w>&*][ \t\n]+|[&*])(\w+)\s*\("  # a function after its type (one defined out of its class follows ::)
)
_KEYWORDS = frozenset(
    "alignas alignof auto bool char char8_t char16_t char32_t class const consteval constexpr constinit const_cast decltype "
    "delete double dynamic_cast else enum explicit extern false float for friend if inline int long mutable namespace new "
    "noexcept nullptr operator private protected public register reinterpret_cast return short signed sizeof static "
    "static_assert static_cast struct switch template this throw true typedef typeid typename union unsigned using virtual "
    "void volatile wchar_t while".split()
)


def _namespace_scope_names(text: str) -> set[str]:
    """What a header declares outside any class or function body, by regular expression (enough for a screen)."""
    text = _code_only(text)
    names = set(_MACRO_NAME.findall(text))
    text = _DIRECTIVE.sub(" ", text)
    scope: list[str] = []  # the text at namespace scope, each piece with the brace that ends it
    opens_namespace: list[bool] = []  # per brace open now
    start = 0
    for brace in re.finditer(r"[{}]", text):
        at_namespace_scope = all(opens_namespace)
        if brace.group() == "{":
            opens_namespace.append(bool(_OPENS_NAMESPACE.search(text[max(0, brace.start() - 200) : brace.start()])))
        elif opens_namespace:
            opens_namespace.pop()
        if at_namespace_scope or all(opens_namespace):
            scope.append(text[start : brace.end()] if at_namespace_scope else "")
            start = brace.end()
    scope.append(text[start:])
    for match in _DECLARED_NAME.finditer("\n".join(scope)):
        names.add(next(group for group in match.groups() if group))
    return names - _KEYWORDS


@functools.lru_cache(maxsize=4)
def aten_ops(torch_include: str) -> frozenset[str]:
    """Operator names with a per-operator header (``ATen/ops/<name>.h``)."""
    ops_dir = os.path.join(torch_include, "ATen", "ops")
    names = (f[:-2] for f in os.listdir(ops_dir) if f.endswith(".h")) if os.path.isdir(ops_dir) else ()
    return frozenset(n for n in names if not n.endswith(_OPS_HEADER_SUFFIXES))


@functools.lru_cache(maxsize=4)
def torch_namespace_block(torch_include: str) -> str | None:
    """torch/types.h's own ``namespace torch { using namespace at; kFloat32 ... }`` block, verbatim."""
    path = os.path.join(torch_include, "torch", "csrc", "api", "include", "torch", "types.h")
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    match = re.search(r"^namespace torch \{.*?^\} // namespace torch", text, re.DOTALL | re.MULTILINE)
    return re.sub(r"\n\s*\n", "\n", _COMMENT.sub("", match.group(0))) if match else None


# ----------------------------------------------------------------------------- compiling


def cpp_flags(request: InlineRequest, toolchain: Toolchain) -> list[str]:
    """The host compiler flags stock load_inline uses for ``main.cpp``."""
    return [*_common_flags(request, toolchain), "-fPIC", f"-std={toolchain.cxx_std}", *request.extra_cflags]


def cuda_flags(request: InlineRequest, toolchain: Toolchain) -> list[str]:
    """The nvcc flags stock load_inline uses for ``cuda.cu``, but for one target arch."""
    import torch.utils.cpp_extension as cpp_extension

    user_arch = any("arch" in f for f in request.extra_cuda_cflags)
    flags = [*_common_flags(request, toolchain), *cpp_extension.COMMON_NVCC_FLAGS]
    flags += [] if user_arch else list(toolchain.arch_flags)
    flags += ["--compiler-options", "-fPIC", *request.extra_cuda_cflags]
    if not any(f.startswith("-std=") for f in flags):
        flags.append(f"-std={toolchain.cxx_std}")
    cc = os.environ.get("CC")
    return ["-ccbin", cc, *flags] if cc else flags


def _common_flags(request: InlineRequest, toolchain: Toolchain) -> list[str]:
    import torch.utils.cpp_extension as cpp_extension

    system = [toolchain.torch_include, os.path.join(toolchain.torch_include, "torch", "csrc", "api", "include")]
    if request.with_cuda and toolchain.cuda_home:
        system.append(os.path.join(toolchain.cuda_home, "include"))
    system.append(toolchain.python_include)
    if toolchain.stub_include:
        system.append(toolchain.stub_include)
    abi: list[str] = getattr(cpp_extension, "_get_pybind11_abi_build_flags", lambda: [])()
    flags = [f"-DTORCH_EXTENSION_NAME={request.name}", "-DTORCH_API_INCLUDE_EXTENSION_H", *abi, *toolchain.extra_defines]
    flags += [f"-I{p}" for p in request.extra_include_paths]
    for path in system:
        flags += ["-isystem", path]
    return flags


def ld_flags(request: InlineRequest, toolchain: Toolchain) -> list[str]:
    """The link flags stock load_inline uses (torch libraries, cudart)."""
    import torch.utils.cpp_extension as cpp_extension

    libs = ["-shared", *request.extra_ldflags, f"-L{cpp_extension.TORCH_LIB_PATH}", "-lc10"]
    libs += ["-lc10_cuda"] if request.with_cuda else []
    libs += ["-ltorch_cpu"] + (["-ltorch_cuda"] if request.with_cuda else []) + ["-ltorch", "-ltorch_python"]
    if request.with_cuda and toolchain.cuda_home:
        lib_dir = "lib64" if os.path.exists(os.path.join(toolchain.cuda_home, "lib64")) else "lib"
        libs += [f"-L{os.path.join(toolchain.cuda_home, lib_dir)}", "-lcudart"]
    return libs


def build(request: InlineRequest, toolchain: Toolchain, plan: Plan, work: Path, *, compile_only: bool) -> dict[str, Any]:
    """Compile both units (in parallel when the plan says so), link unless compile-only; return meta.

    The strategy string records every attempt with its seconds, e.g.
    ``cpp:minimal(6.9s) cu:minimal(9.1s)>original(70.2s) parallel link(0.4s)``.
    """
    if request.cuda_sources and not toolchain.nvcc:
        raise ToolchainUnavailable(f"{request.name}: nvcc not found, cannot compile cuda_sources here")
    ladders = {"cpp": (plan.cpp_tiers, False)}
    if request.cuda_sources:
        ladders["cu"] = (plan.cuda_tiers, True)
    with ThreadPoolExecutor(max_workers=len(ladders) if plan.parallel else 1) as pool:
        futures = {
            u: pool.submit(compile_ladder, request, toolchain, tiers, work, cuda=cuda) for u, (tiers, cuda) in ladders.items()
        }
        results = {u: f.result() for u, f in futures.items()}
    strategy = " ".join(f"{u}:{'>'.join(a.describe() for a in r)}" for u, r in results.items())
    strategy += " parallel" if plan.parallel and len(results) > 1 else ""
    failed = [r[-1] for r in results.values() if not r[-1].ok]
    if failed:
        stderr = _tail("\n".join(a.stderr for a in failed))
        if toolchain.stub_include and _CUDA_LIBRARY_MENTION.search(stderr):
            raise ToolchainUnavailable(f"{request.name}: this machine lacks CUDA library headers the source needs:\n{stderr}")
        return {"ok": False, "strategy": strategy, "stderr_tail": stderr}
    stderr = _tail("\n".join(r[-1].stderr for r in results.values()))
    if not compile_only:
        started = time.perf_counter()
        objects = [str(work / f"{u}.o") for u in results]
        link = _run([toolchain.cxx, *objects, *ld_flags(request, toolchain), "-o", str(work / f"{request.name}.so")], work)
        strategy += f" link({time.perf_counter() - started:.1f}s)"
        if link.returncode != 0:
            return {"ok": False, "strategy": strategy, "stderr_tail": _tail(link.stderr)}
        for obj in objects:
            os.unlink(obj)  # the .so is the artefact; the cache keeps the sources for debugging
    return {"ok": True, "strategy": strategy, "stderr_tail": stderr}


@dataclass
class Attempt:
    """One compile of one unit at one tier."""

    tier: str
    ok: bool
    seconds: float
    stderr: str
    pch: bool = False  # it started from a precompiled header (the bindings base, or the CUDA host prefix)

    def describe(self) -> str:
        return f"{self.tier}{'+pch' if self.pch else ''}({self.seconds:.1f}s{'' if self.ok else ' failed'})"


def compile_ladder(
    request: InlineRequest, toolchain: Toolchain, tiers: Sequence[str], work: Path, *, cuda: bool
) -> list[Attempt]:
    """Try each tier in turn; stop at the first that compiles, or when a tier would compile the same text again."""
    attempts: list[Attempt] = []
    compiled: set[str] = set()
    for tier in tiers:
        failed_lean = attempts[-1] if attempts and attempts[-1].tier == "lean" else None
        if tier == "minimal" and failed_lean is not None and not _lacks_context(failed_lean, request, toolchain):
            continue  # it failed on what the minimal tier does not add: a broken source compiles twice, not thrice
        text, header = unit_source(request, toolchain, tier, cuda=cuda)
        if text + (header or "") in compiled:
            break
        compiled.add(text + (header or ""))
        attempts.append(compile_unit(request, toolchain, tier, work, cuda=cuda))
        if attempts[-1].ok:
            break
    return attempts


def _lacks_context(failed: Attempt, request: InlineRequest, toolchain: Toolchain) -> bool:
    """Whether a failed lean attempt's diagnostics quote a name that only the operators' context declares."""
    quoted = {name for text in _QUOTED.findall(failed.stderr) for name in _IDENTIFIER.findall(text)}
    context = _context_names(request, toolchain)
    return context is None or bool(quoted & context)


def unit_source(request: InlineRequest, toolchain: Toolchain, tier: str, *, cuda: bool) -> tuple[str, str | None]:
    """The unit's text at ``tier`` and the prelude header it includes (None when nothing was swapped)."""
    make = cuda_unit if cuda else cpp_unit
    text = make(request, tier)
    swapped = text != make(request, "original")
    return text, prelude(request, toolchain, tier, bindings=not cuda) if swapped else None


def compile_unit(request: InlineRequest, toolchain: Toolchain, tier: str, work: Path, *, cuda: bool) -> Attempt:
    """Compile ``main.cpp`` (host compiler) or ``cuda.cu`` (nvcc) at ``tier`` to ``work/{cpp,cu}.o``."""
    unit = "cu" if cuda else "cpp"
    unit_dir = work / f"{unit}-{tier}"
    cmd, source = write_unit(request, toolchain, tier, unit_dir, cuda=cuda)
    started = time.perf_counter()
    if cuda:
        compiled = compile_cu(cmd, source, work / f"{unit}.o", unit_dir, prebuilt_host_prefixes(), toolchain.same_text_dirs)
        result, pch_used = _checked(compiled.result, cmd), compiled.prefixed
    else:
        pch = (
            prebuilt_pch(request, toolchain) if tier in ("lean", "minimal") and _opens_with_prelude(source.read_text()) else None
        )
        if pch is not None:  # GCC reads kz_pch.h.gch beside it, or the text if the flags void it (and says why)
            cmd += ["-include", str(pch), "-Winvalid-pch"]
        result = _run([*cmd, "-c", str(source), "-o", str(work / f"{unit}.o")], unit_dir)
        pch_used = pch is not None and f"{PCH_HEADER}.gch: not used" not in (result.stderr or result.stdout)
    stderr = result.stderr or result.stdout
    return Attempt(tier, result.returncode == 0, round(time.perf_counter() - started, 3), stderr, pch_used)


def write_unit(request: InlineRequest, toolchain: Toolchain, tier: str, unit_dir: Path, *, cuda: bool) -> tuple[list[str], Path]:
    """Write the unit at ``tier`` into ``unit_dir`` (its source, its prelude and, at ``lean``, its operators'
    headers); return the command that compiles it, less ``-c``, the source and the output, and the source."""
    text, header = unit_source(request, toolchain, tier, cuda=cuda)
    unit_dir.mkdir(exist_ok=True)
    source = unit_dir / ("cuda.cu" if cuda else "main.cpp")
    source.write_text(text)
    if header is not None:
        (unit_dir / (CUDA_PRELUDE if cuda else "kz_bindings.h")).write_text(header)
    cmd = [str(toolchain.nvcc), *cuda_flags(request, toolchain)] if cuda else [toolchain.cxx, *cpp_flags(request, toolchain)]
    if tier == "lean":  # -I: searched before torch's -isystem directories
        cmd.insert(1, f"-I{write_lean_headers(request, toolchain, unit_dir)}")
    return cmd, source


def _opens_with_prelude(text: str) -> bool:
    """Whether the unit's prelude comes before anything else in it: a header included ahead of the unit
    (``-include``) must not move past a line of the source (a ``#define`` meant for torch's headers)."""
    return _COMMENT.sub(" ", text).lstrip().startswith(BINDINGS_PRELUDE_INCLUDE)


def pch_flags(request: InlineRequest, toolchain: Toolchain) -> list[str]:
    """``main.cpp``'s flags less its extension's name: one precompiled header serves every name (GCC takes a
    macro the header never saw, not one it saw defined otherwise)."""
    return [f for f in cpp_flags(request, toolchain) if not f.startswith("-DTORCH_EXTENSION_NAME=")]


def pch_key(request: InlineRequest, toolchain: Toolchain) -> str:
    """Which precompiled bindings base a unit can use: the toolchain (torch's version: GCC checks flags and
    macros, not whether the headers behind a .gch changed), the flags and the header's text."""
    return _header_key(pch_flags(request, toolchain), bindings_base(toolchain), toolchain)


def host_prefix_key(request: InlineRequest, toolchain: Toolchain) -> str:
    """The directory of the CUDA host prefix built for a probe with this unit's nvcc flags (a unit takes whichever
    was built for its final host compile's flags, ``compile_cu``, and compares the text, ``HostPrefix.start``)."""
    flags = [f for f in cuda_flags(request, toolchain) if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return _header_key(flags, "\n".join(MINIMAL_BASE_HEADERS), toolchain)


def _header_key(flags: Sequence[str], text: str, toolchain: Toolchain) -> str:
    """A compile-only machine's stub headers live in each process's own cache (``portable``); no precompiled
    header reads them."""
    for directory in toolchain.same_text_dirs:
        flags = [f.replace(directory, STUBS) for f in flags]
    blob = json.dumps([STRATEGY_VERSION, portable(toolchain), flags, text], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def prebuilt_pch(request: InlineRequest, toolchain: Toolchain) -> Path | None:
    """The precompiled bindings base for this unit's flags under ``$KZ_PRECOMPILED_HEADERS``, if one was built."""
    root = os.environ.get(PRECOMPILED_HEADERS_ENV)
    header = Path(root) / f"bindings-{pch_key(request, toolchain)}" / PCH_HEADER if root else None
    return header if header is not None and header.with_name(f"{PCH_HEADER}.gch").is_file() else None


def prebuilt_host_prefixes() -> list[HostPrefix]:
    """The precompiled CUDA host prefixes under ``$KZ_PRECOMPILED_HEADERS`` (one per set of host flags built)."""
    root = os.environ.get(PRECOMPILED_HEADERS_ENV)
    found = []
    for directory in sorted(Path(root).glob("cuda-host-*")) if root else []:
        try:
            found.append(HostPrefix.find(directory))
        except (OSError, ValueError):  # removed while read (another torch's: an upgrade), or not ours
            continue
    return [prefix for prefix in found if prefix is not None]


def build_precompiled_headers(
    root: Path,
    *,
    compile_only: bool,
    bindings: Sequence[tuple[bool, tuple[str, ...]]] = BINDINGS_PCH_VARIANTS,
    cuda_hosts: Sequence[tuple[str, ...]] = HOST_PREFIX_VARIANTS,
) -> list[Path]:
    """Precompile the bindings base for each (``with_cuda``, host flags) variant into ``root/bindings-<pch_key>/``
    and, where nvcc is, the CUDA host prefix for each set of nvcc flags into ``root/cuda-host-<host_prefix_key>/``,
    one after another (beside the first jobs); the directories built (a variant that fails to build is left out:
    its units compile without)."""
    toolchain = detect_toolchain(root, compile_only=compile_only, arch=None)

    def build_bindings(variant: tuple[bool, tuple[str, ...]]) -> Path | None:
        request = make_request("kz_pch", "", with_cuda=variant[0], extra_cflags=list(variant[1]))
        target = root / f"bindings-{pch_key(request, toolchain)}"
        target.mkdir(parents=True, exist_ok=True)
        (target / PCH_HEADER).write_text(bindings_base(toolchain) + "\n")
        header = [toolchain.cxx, *pch_flags(request, toolchain), "-x", "c++-header", str(target / PCH_HEADER)]
        if _run([*header, "-o", str(target / f"{PCH_HEADER}.gch")], target).returncode == 0:
            return target
        shutil.rmtree(target, ignore_errors=True)
        return None

    def build_cuda_host(flags: tuple[str, ...]) -> Path | None:
        # a probe with the prelude's base headers and no operator: what every CUDA unit's host code begins with
        request = make_request("kz_probe", "", "#include <torch/extension.h>\n", extra_cuda_cflags=list(flags))
        target = root / f"cuda-host-{host_prefix_key(request, toolchain)}"
        try:
            with tempfile.TemporaryDirectory(dir=root) as probe:
                cmd, source = write_unit(request, toolchain, "lean", Path(probe), cuda=True)
                if build_host_prefix(cmd, source, target, CUDA_PRELUDE, toolchain.same_text_dirs) is not None:
                    return target
        except (OSError, ValueError, subprocess.SubprocessError):  # the other headers are built all the same
            pass
        shutil.rmtree(target, ignore_errors=True)
        return None

    root.mkdir(parents=True, exist_ok=True)
    built = [build_bindings(variant) for variant in bindings]
    built += [build_cuda_host(flags) for flags in cuda_hosts] if toolchain.nvcc else []
    return [target for target in built if target is not None]


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _checked(subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=toolchain_env()), cmd)


def _checked(result: subprocess.CompletedProcess[str], cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """A compiler killed by a signal (OOM, a kill) says nothing about the source, so that raises."""
    if result.returncode < 0:
        raise RuntimeError(f"{os.path.basename(cmd[0])} was killed by signal {-result.returncode}")
    return result


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= STDERR_TAIL_CHARS else "..." + text[-STDERR_TAIL_CHARS:]
