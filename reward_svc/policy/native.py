"""What a candidate's ``load_inline`` C++/CUDA may contain, checked in the harness before it compiles.

Native code runs with the whole process's power: it could rewrite the harness's evidence in
memory, write the result file, or call back into Python. The Python policy cannot read it, so
this check does, on the sources exactly as the compiler gets them (built at run time, so they are
checked here rather than in the static policy), and on the flags:

- ``#include`` only of the headers a kernel is written against (torch, ATen, c10, CUDA, CUTLASS,
  CUB, the C++ standard library's computing headers), no token pasting (``fo##pen``), no
  ``#pragma`` but ``unroll``/``once``, no ``#line``;
- no identifier that reaches the operating system, the dynamic loader, the Python interpreter or
  the dispatcher (``fopen``, ``system``, ``dlsym``, ``Py*``, ``py::module_``, ``TORCH_LIBRARY``,
  ``c10::Dispatcher``, ...);
- ``asm`` only inside ``__device__``/``__global__`` functions (PTX for the GPU, which cannot make a
  system call); none in host code or at file scope (an ``asm`` label renames a declaration);
- compiler and linker flags from an allow-list (``-Wl,``, ``-wrapper``, ``-fplugin`` and kin run or
  load other programs).

The sources are read as the compiler's first phases read them (line ends, lines joined by a
backslash, comments as one space, literals with their prefixes and raw strings, numbers with their
digit separators, digraphs): a reading that differs from the compiler's hides code from the check
(``test_reward_policy.py``'s ``LEXER_NATIVE``: each of those passed once).

It is a token check, not a proof: it raises the cost of native tampering, while the decisive
evidence (the outputs, their fingerprints, the knockout's share) is re-derived by the judge
outside the child. docs/ARCHITECTURE.md, "Trust boundary", says what it cannot see.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

ALLOWED_INCLUDE = re.compile(
    r"(torch/(extension|types|all|python|library)\.h|torch/csrc/api/include/.*|ATen/.*|c10/.*|cuda(_runtime|_runtime_api|_fp16|_bf16|_fp8"
    r"|_fp4|_pipeline|_awbarrier_primitives|_pipeline_primitives)?\.h|cuda/.*|cub/.*|cute/.*|cutlass/.*|thrust/.*|mma\.h"
    r"|cooperative_groups(\.h|/.*)|crt/.*|vector_types\.h|math_constants\.h|device_launch_parameters\.h|curand(_kernel)?\.h"
    r"|sm_\d+_intrinsics\.h|c?math(\.h)?|cstdint|stdint\.h|cstddef|stddef\.h|climits|limits\.h|cfloat|float\.h|limits|vector|array"
    r"|algorithm|numeric|utility|tuple|type_traits|initializer_list|optional|functional|memory|cassert|assert\.h|cstring|string"
    r"|sstream|iostream|stdexcept|bit|complex|random|chrono|map|unordered_map|set|unordered_set|iterator|cstdlib|c?stdio(\.h)?"
    r"|cublas_v2\.h|cublasLt\.h)"
)
# Names with no other meaning in a kernel: refused wherever they appear.
DENIED_IDENTIFIERS = frozenset(
    {
        "fopen",
        "fopen64",
        "freopen",
        "fdopen",
        "open64",
        "openat",
        "creat",
        "unlinkat",
        "ftruncate",
        "symlink",
        "pwrite",
        "pread",
        "popen",
        "execv",
        "execve",
        "execvp",
        "execvpe",
        "execl",
        "execlp",
        "execle",
        "vfork",
        "posix_spawn",
        "posix_spawnp",
        "dlopen",
        "dlsym",
        "dlmopen",
        "dladdr",
        "dlvsym",
        "mmap",
        "mmap64",
        "munmap",
        "mprotect",
        "ptrace",
        "syscall",
        "sigaction",
        "getenv",
        "setenv",
        "putenv",
        "unsetenv",
        "sendto",
        "recvfrom",
        "ofstream",
        "ifstream",
        "fstream",
        "filebuf",
        "FILE",
        "filesystem",
        "pthread_create",
        "jthread",
        "atexit",
        "at_quick_exit",
        "_exit",
        "_Exit",
        "quick_exit",
        "setjmp",
        "longjmp",
        "pybind11",
        "TORCH_LIBRARY",
        "TORCH_LIBRARY_IMPL",
        "TORCH_LIBRARY_FRAGMENT",
        "TORCH_LIBRARY_INIT",
        "Dispatcher",
        "globalContext",
        "setCurrentCUDAStream",
        "cudaSetDevice",
        "cudaDeviceReset",
        "cudaIpcOpenMemHandle",
        "cudaHostRegister",
        "cudaMallocManaged",
        "cuLaunchKernel",
        "cuModuleLoad",
        "cuModuleLoadData",
        "cudaLaunchHostFunc",
        "cudaStreamAddCallback",
        "__attribute__",
        "__attribute",  # GCC takes the short spelling too
        "_Pragma",  # a #pragma the directive check never sees
        "__pragma",
        "weakref",  # [[gnu::weakref("system")]]: a declaration renamed onto a denied one
        "secure_getenv",
        "renameat",
        "renameat2",
        "clearenv",
        "mkostemp",
        "mkostemps",
        "DynamicLibrary",  # at::DynamicLibrary: dlopen and dlsym by another name
        "set_env",  # c10::utils::set_env
        "environ",
        "__environ",
        "sbrk",
        "dup2",
        "ioctl",
        "process_vm_writev",
        "process_vm_readv",
        "getauxval",
        "__libc_start_main",
        "freopen64",
        "import",
        "Library",
        "DispatchKey",
        "creat64",
        "openat64",
        "dprintf",
        "vdprintf",
        "tmpfile",
        "tmpfile64",
        "mkstemp",
        "mkstemps",
        "mkdtemp",
        "tmpnam",
        "tempnam",
        "popen2",
        "execveat",
        "fexecve",
        "system_category",
        "namespace_alias",
        "RegisterOperators",
        "OperatorHandle",
        "pickle_save",
        "pickle_load",
        "jit",
        "PyObject",
        "reinterpret_borrow",
        "reinterpret_steal",
    }
)
# Members of torch's C++ API that do I/O, called on a namespace (torch::save, torch::from_file).
NAMESPACE_DENIED = frozenset({"save", "load", "from_file", "pickle_save", "pickle_load"})
# Names of system calls: refused everywhere but as a member (``pipe.producer_acquire()``, ``.read(``);
# those in NAME_LIKE are common variable names too, refused as a call or a function value only.
CALL_DENIED = frozenset(
    {
        "open",
        "remove",
        "rename",
        "unlink",
        "mkdir",
        "rmdir",
        "chmod",
        "chown",
        "truncate",
        "link",
        "write",
        "read",
        "system",
        "fork",
        "clone",
        "kill",
        "raise",
        "signal",
        "socket",
        "connect",
        "bind",
        "listen",
        "accept",
        "send",
        "recv",
        "thread",
        "async",
        "exit",
        "abort",
        "dup",
        "pipe",
        "brk",
        "close",
        "fwrite",
        "fread",
        "fprintf",
        "fputs",
        "puts",
        "getchar",
    }
)
NAME_LIKE = frozenset({"thread", "pipe", "read", "write", "async", "close", "link", "signal"})
# pybind11's `py::` namespace is needed only to name arguments in a PYBIND11_MODULE of the source's own.
ALLOWED_PY_MEMBERS = frozenset({"arg", "return_value_policy", "call_guard", "gil_scoped_release", "kw_only", "pos_only"})
DENIED_PREFIXES = ("Py", "_Py")  # the CPython API: a way back into the harness's interpreter
# GCC's builtins that are calls into libc by another name, and its attributes that rename a declaration.
DENIED_BUILTINS = ("__builtin_exec", "__builtin_fork", "__builtin_vfork", "__builtin__exit", "__builtin__Exit")
RENAMING_ATTRIBUTES = frozenset({"alias", "ifunc", "symver", "weakref"})
ALLOWED_MACROS_WITH_PREFIX = frozenset({"PYBIND11_MODULE"})
ALLOWED_PRAGMA = re.compile(r"#\s*pragma\s+(unroll\b.*|once|nv_diag_suppress.*|nv_diagnostic.*)$")
ALLOWED_FLAG = re.compile(
    r"(-O[0-3s]?|-std=[\w+]+|-[DU]\w+(=[\w.+-]*)?|--?use_fast_math|-ffast-math|-arch=\w+|--gpu-architecture=\w+"
    r"|-gencode[= ]?[\w=,]+"
    r"|-lineinfo|--expt-relaxed-constexpr|--expt-extended-lambda|-Xptxas=?[-\w=,.]+|--ptxas-options=[-\w=,.]+|-maxrregcount=?\d+"
    r"|-w|-W(?!l,)[\w=-]+|-fPIC|-funroll-loops|-march=[\w-]+|-mtune=[\w-]+|-fopenmp|-l(cuda|cudart|cublas|cublasLt)|--extended-lambda"
    r"|-DNDEBUG|-g|-G|--restrict|-Xcompiler=-O[0-3]|-Xcompiler=-fPIC)"
)
_TOKEN = re.compile(r'[A-Za-z_]\w*|::|##|->|""|[#{};(.&=,)}\[\]]')
_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
_RAW_STRING = re.compile(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(')
_PP_NUMBER = re.compile(r"\.?\d(?:[eEpP][+-]|'[A-Za-z0-9_]|[A-Za-z0-9_.])*")


def check_native_sources(*args: Any, **kwargs: Any) -> str | None:
    """Why ``load_inline(name, *args, **kwargs)``'s sources or flags are refused, or None. ``args`` are
    load_inline's arguments after the name (``cpp_sources``, ``cuda_sources``, ...)."""
    cpp = kwargs.get("cpp_sources", args[0] if args else "")
    cuda = kwargs.get("cuda_sources", args[1] if len(args) > 1 else None)
    for flags_name in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags"):
        for flag in _as_list(kwargs.get(flags_name)):
            if not str(flag).strip():  # KernelBench's own examples pass extra_cflags=[""]: no flag at all
                continue
            if not ALLOWED_FLAG.fullmatch(str(flag).strip()):
                return f"pass the flag {str(flag)[:80]!r} in {flags_name}, which may run or load other programs"
            defined = re.fullmatch(r"-D(\w+)=(.*)", str(flag).strip())
            if defined and check_source(f"#define {defined.group(1)} {defined.group(2)}", device_code=False):
                return f"pass the flag {str(flag)[:80]!r} in {flags_name}, a macro naming what the sources may not"
    if kwargs.get("extra_include_paths"):
        return "add include paths: a kernel includes only torch's and CUDA's headers"
    if kwargs.get("build_directory"):
        return "choose the build directory: the harness builds where it can check the artefacts"
    for label, sources, device_code in (("cpp_sources", cpp, False), ("cuda_sources", cuda, True)):
        for source in _as_list(sources):
            problem = check_source(str(source), device_code=device_code)
            if problem:
                return f"in {label}: {problem}"
    return None


def check_source(source: str, *, device_code: bool) -> str | None:
    # Translation phases 1 and 2 as GCC runs them: \r\n and a lone \r end a line; a backslash, blanks and a
    # line end join two lines (``#\\<newline>include``, ``/\\<newline>/``), except inside a raw string.
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    raw = _RAW_STRING.search(text)
    if raw and _SPLICE.search(text, raw.start()):
        return "joins lines (a backslash at a line's end) after a raw string begins: inside one the compiler does not"
    text = _SPLICE.sub("", text)
    code = _strip(text, strings=False)
    for line in code.split("\n"):
        stripped = line.strip()
        if not stripped.startswith("#"):
            continue
        directive = re.match(r"#\s*(\w+)", stripped)
        name = directive.group(1) if directive else ""
        if name == "include":
            header = re.match(r"#\s*include\s*[<\"]([^>\"]+)[>\"]", stripped)
            if header is None or not ALLOWED_INCLUDE.fullmatch(header.group(1).strip()) or ".." in header.group(1).split("/"):
                return f"includes {stripped[:80]!r}: only torch, ATen, c10, CUDA and computing headers of the C++ library"
        elif name == "pragma" and not ALLOWED_PRAGMA.match(stripped):
            return f"uses {stripped[:60]!r}"
        elif name in ("line", "embed", "include_next", "import") or name.isdigit():  # "# 1 file" is #line
            return f"uses #{name}"
    stripped_source = _strip(text, strings=True)
    for line in stripped_source.split("\n"):  # a macro can spell a call its uses never show: every name in one counts
        if re.match(r"\s*#\s*define\b", line):
            named = set(_TOKEN.findall(line)) & (DENIED_IDENTIFIERS | CALL_DENIED)
            if named:
                return f"defines a macro naming {', '.join(sorted(named))}, which reaches the operating system"
    tokens = _TOKEN.findall(stripped_source)
    opens_torch = bool(re.search(r"\busing\s+namespace\s+(?:::\s*)?(?:torch|at)\s*;", stripped_source))
    macros = set(re.findall(r"^\s*#\s*define\s+(\w+)", stripped_source, re.MULTILINE))
    for i, token in enumerate(tokens):
        before, after = (tokens[i - 1] if i else ""), (tokens[i + 1] if i + 1 < len(tokens) else "")
        if token == "##":
            return "pastes tokens (##): every identifier must be visible to the check"
        if token in DENIED_IDENTIFIERS:
            return f"uses {token}, which reaches the operating system, the interpreter or the dispatcher"
        if (
            token in CALL_DENIED
            and before not in (".", "->")
            and (
                token not in NAME_LIKE
                or after == "("
                or before in ("::", "&", "{")
                or (before in ("(", ",", "=") and after in (",", ")", ";", "}"))
            )
        ):
            return f"uses {token}, which reaches the operating system"
        if token == "namespace" and before == "using" and after in ("py", "pybind11"):
            return f"uses namespace {after}: of pybind11 a kernel needs only py::arg"
        if token == "extern" and after == '""' and not {"__global__", "__device__"} & set(tokens[i + 2 : i + 6]):
            return 'declares an extern "C" function that is no kernel: declarations of C functions reach the system'
        if token == "namespace" and i + 2 < len(tokens) and tokens[i + 2] == "=":
            return "aliases a namespace: every name must be visible to the check"
        if token in NAMESPACE_DENIED and (before == "::" or after == "(" and before not in (".", "->") and opens_torch):
            return f"uses {token} of torch's namespace, which reads or writes files"
        if token in RENAMING_ATTRIBUTES and before == "::" and i > 1 and tokens[i - 2] in ("gnu", "__gnu__"):
            return f"uses the attribute {token}, which renames a declaration onto another (a denied one)"
        if token.startswith(DENIED_BUILTINS):
            return f"uses {token}, which calls the C library's process functions"
        if token == "attr" and before == "." and after == "(":
            return "uses .attr(): a kernel reaches no Python object's attributes"
        if token.startswith(DENIED_PREFIXES) and token not in ALLOWED_MACROS_WITH_PREFIX:
            return f"uses {token}: the Python C API leads back into the harness's interpreter"
        if token == "py" and after == "::" and i + 2 < len(tokens) and tokens[i + 2] not in ALLOWED_PY_MEMBERS:
            return f"uses py::{tokens[i + 2]}: of pybind11 a kernel needs only py::arg"
        if token in ("asm", "__asm__", "__asm") and not (device_code and _inside_device_function(tokens, i, macros)):
            return "uses inline assembly outside a __device__ or __global__ function (one not __host__ too)"
    return None


def _inside_device_function(tokens: Sequence[str], at: int, macros: set[str]) -> bool:
    """Whether token ``at`` lies inside a brace whose declaration (the tokens since the previous
    ``;``, ``{`` or ``}``) says ``__device__`` or ``__global__``, and neither ``__host__`` nor a macro of
    the source's (which could say it): device code only, which cannot make a system call."""
    enclosing: list[bool] = []
    start = 0
    for i in range(at):
        if tokens[i] == "{":
            declaration = set(tokens[start:i])
            enclosing.append(bool(declaration & {"__device__", "__global__"}) and not declaration & ({"__host__"} | macros))
            start = i + 1
        elif tokens[i] == "}":
            if enclosing:
                enclosing.pop()
            start = i + 1
        elif tokens[i] == ";":
            start = i + 1
    return any(enclosing)


def _strip(source: str, *, strings: bool) -> str:
    """Comments removed, each as one space (so a comment that spans lines joins them, as for the
    compiler); with ``strings``, string and character literals (raw ones too) emptied as well: their
    text is not code. Either way a literal is read as one (a ``/*`` inside it opens no comment), a
    number as one (a digit separator, ``1'000``, opens no literal) and a digraph as what it spells
    (``%:`` is ``#``, ``<%`` is ``{``). ``source`` has had its lines joined (phases 1 and 2)."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        after_word = i > 0 and (source[i - 1].isalnum() or source[i - 1] in "_.")
        raw = None if after_word else _RAW_STRING.match(source, i)
        number = None if after_word else _PP_NUMBER.match(source, i)
        digraph = _digraph(source, i)
        if source.startswith("//", i):
            j = source.find("\n", i)
            i = n if j < 0 else j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            out.append(" ")
            i = n if j < 0 else j + 2
        elif raw:
            end = source.find(f'){raw.group(1)}"', raw.end())
            j = n if end < 0 else end + len(raw.group(1)) + 2
            out.append('""' if strings else source[i:j])
            i = j
        elif number:
            out.append(number.group(0))
            i = number.end()
        elif c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            out.append(c + c if strings else source[i : j + 1])
            i = j + 1
        elif digraph:
            out.append(_DIGRAPHS[digraph])
            i += len(digraph)
        else:
            out.append(c)
            i += 1
    return "".join(out)


_DIGRAPHS = {"%:%:": "##", "%:": "#", "<%": "{", "%>": "}", "<:": "[", ":>": "]"}


def _digraph(source: str, at: int) -> str | None:
    for digraph in _DIGRAPHS:
        if source.startswith(digraph, at):
            # <:: is < and :: unless a : or > follows (std::vector<::T>), as C++11 says
            if digraph == "<:" and source.startswith("<::", at) and source[at + 3 : at + 4] not in (":", ">"):
                return None
            return digraph
    return None


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]
