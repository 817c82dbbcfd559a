"""The capability policy: an allow-list of what a candidate's Python may name, checked on its syntax tree.

The harness that collects a candidate's dynamic evidence (launch counts, compute ops, outputs,
timing) runs in the candidate's own interpreter, so the evidence holds only while the candidate
cannot reach the harness's objects. A deny-list cannot hold Python: every object leads to others.
This policy is an allow-list instead, and what it allows is closed under the ways Python reaches
objects:

- **Names**: a name is bound by the source itself, imported, or one of ``ALLOWED_BUILTINS``.
  Reflective builtins (``getattr``, ``vars``, ``type``, ``eval``, ...) are refused under every
  spelling, since ``g = getattr`` needs the name ``getattr``; ``getattr(obj, "const")`` is read
  as ``obj.const``, ``getattr``/``setattr`` with a computed name only on ``self``.
- **Modules** are reached only through import statements and dotted chains from them, which the
  checker resolves against the real modules (in the trusted process that checks): every module
  on a chain must be in ``ALLOWED_MODULES`` (some with an attribute allow-list), every object
  reached must be defined by an allowed package (a stdlib importer that a library keeps as an
  attribute is refused) and not in ``DENIED_OBJECTS`` (file I/O, switches of the harness's own
  conditions, compilers that write the kernel for the candidate). A module is never a value
  (``T = torch``, ``self.m = torch.nn``), so every module attribute the source reaches is on a
  chain the checker saw.
- **Attributes** of everything else are public (no leading underscore but ``__init__``,
  ``__name__`` and the source's own ``self._x``) and not in ``VALUE_ATTRIBUTES_DENIED`` (frames,
  code, tensor-to-host bridges where compute escapes the op recorder: ``.numpy()``, ``.tolist()``,
  ``.apply_()``, storages). Keyword arguments are public too (a wrapper's private parameter is
  part of its inside). Attribute names hidden in strings (``str.format`` fields, string
  annotations, ``match`` keyword patterns) are checked the same way.
- **Stores**: attributes are assigned only on a method's first parameter (``self.w = ...``,
  ``ctx.scale = ...``), never on modules, classes or anything imported; the two cuDNN switches
  and precision flags kept at full precision are the exceptions.
- **Definitions**: no dunder methods but a few that the harness never calls into
  (``__torch_function__`` would run candidate code inside the harness's own calls on its
  output), no metaclasses, no ``torch.Tensor`` subclasses, no method named ``data_ptr`` (a
  forged pointer for a Triton launch).

What it cannot see: native code. ``load_inline`` C++/CUDA and Triton's pointer arithmetic run
with the process's full power; the harness checks those sources separately (``policy.native``)
and the judge re-derives what it can from output files (see docs/ARCHITECTURE.md, "Trust
boundary"). A violation is a ``rejected`` verdict naming the rule and the line.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
import re
import string
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a type only: the policy runs in children too, which need not import pydantic
    from services.schemas.reward import Guard

# Modules a source may import and walk. A module with an entry in MODULE_ATTRIBUTES allows only those attributes.
ALLOWED_MODULES = frozenset(
    {
        "torch",
        "torch.nn",
        "torch.nn.functional",
        "torch.nn.init",
        "torch.nn.parameter",
        "torch.cuda",
        "torch.backends",
        "torch.backends.cuda",
        "torch.backends.cudnn",
        "torch.utils",
        "torch.utils.cpp_extension",
        "torch.library",
        "torch.linalg",
        "torch.fft",
        "torch.special",
        "torch.autograd",
        "torch.version",
        "torch.types",
        "triton",
        "triton.language",
        "triton.language.math",
        "triton.language.extra",
        "triton.language.extra.cuda",
        "triton.language.extra.libdevice",
        "triton.language.extra.cuda.libdevice",
        "triton.runtime",
        "triton.tools",
        "triton.tools.tensor_descriptor",
        "math",
        "functools",
        "itertools",
        "operator",
        "typing",
        "dataclasses",
        "collections",
        "collections.abc",
        "enum",
        "abc",
        "warnings",
        "__future__",
        "einops",
        "os",
    }
)
MODULE_ATTRIBUTES = {
    "os": frozenset({"getenv", "cpu_count"}),  # reads only: the environment steers Triton and nvcc
    "warnings": frozenset({"warn", "simplefilter", "filterwarnings", "catch_warnings"}),  # formatwarning reads any file's lines
    "torch.utils": frozenset({"cpp_extension"}),
    # torch.library's documented ways to register a Triton kernel or a new op, which override nothing
    "torch.library": frozenset({"triton_op", "wrap_triton", "custom_op", "register_fake"}),
    "torch.utils.cpp_extension": frozenset({"load_inline", "CUDA_HOME", "include_paths"}),
    "triton.runtime": frozenset({"driver", "Config", "autotune", "heuristics", "jit", "reinterpret", "OutOfResources"}),
    "triton.language.extra": frozenset({"cuda", "libdevice"}),
}
# Packages whose functions, classes and instances a chain may reach: one defined elsewhere (a
# stdlib importer a library keeps as an attribute) is refused even on an allowed module.
ALLOWED_PACKAGES = frozenset(
    {
        "torch",
        "triton",
        "math",
        "functools",
        "itertools",
        "operator",
        "typing",
        "dataclasses",
        "collections",
        "enum",
        "abc",
        "warnings",
        "einops",
        "builtins",
        "os",
        "_operator",
        "_functools",
        "_collections",
        "_collections_abc",
        "_warnings",
        "numbers",
        "__future__",
    }
)
# Objects no source may name, by what they do: files, the harness's own conditions (the replays run
# with deterministic algorithms: a forward that reads the switch could tell them apart), raw CUDA and
# host memory, compilers or dynamic attribute access that do the candidate's work or walk for it.
DENIED_OBJECTS: dict[Guard, tuple[str, ...]] = {
    "forbidden_call": (
        "torch.load",
        "torch.save",
        "torch.from_file",
        "torch.from_numpy",
        "torch.frombuffer",
        "torch.from_dlpack",
        "torch.utils.cpp_extension.load",
        "torch.compile",
        "torch.cuda.cudart",
        "torch.cuda.caching_allocator_alloc",
        "torch.get_device_module",
        "torch.asarray",  # asarray shares the memory of a Python buffer: compute out of sight
        "torch.import_ir_module",
        "torch.parse_ir",
        "torch.parse_schema",
        "torch.merge_type_from_type_comment",
        "torch.cuda.caching_allocator_delete",
        "torch.cuda.jiterator",
        # a pluggable allocator loads a shared library by path; storages share the memory of a Python buffer;
        # triton.compile builds kernels whose launches bypass JITFunction.run (uncounted, never poisoned)
        "torch.cuda.CUDAPluggableAllocator",
        "torch.cuda.memory.CUDAPluggableAllocator",
        "torch.cuda.change_current_allocator",
        "torch.cuda.memory.change_current_allocator",
        "torch.UntypedStorage",
        "torch.TypedStorage",
        "torch.storage",
        "triton.compile",
        "torch.autograd.handle_torch_function",
        # sparse tensors: their kernels sum duplicates and densify out of the op accounting's sight
        "torch.sparse_coo_tensor",
        "torch.sparse_csr_tensor",
        "torch.sparse_csc_tensor",
        "torch.sparse_bsr_tensor",
        "torch.sparse_bsc_tensor",
        "torch.sparse_compressed_tensor",
        "torch.sparse",
        # FBGEMM's GEMMs run inside one composite op that calls the library directly: no aten op the
        # recorder sees does the work (torch.fbgemm_linear_fp16_weight_fp32_activation is a whole matmul)
        "torch.fbgemm_linear_fp16_weight",
        "torch.fbgemm_linear_fp16_weight_fp32_activation",
        "torch.fbgemm_linear_int8_weight",
        "torch.fbgemm_linear_int8_weight_fp32_activation",
        "torch.fbgemm_linear_quantize_weight",
        "torch.fbgemm_pack_gemm_matrix_fp16",
        "torch.fbgemm_pack_quantized_matrix",
        # attribute access by a string (getattr by another name), and the evaluators of string
        # annotations with the types that carry unchecked strings into them
        "operator.attrgetter",
        "operator.methodcaller",
        "functools.update_wrapper",
        "functools.wraps",
        "functools.singledispatch",
        "functools.singledispatchmethod",
        "typing.get_type_hints",
        "typing.ForwardRef",
        "typing.NamedTuple",
        "typing.TypedDict",
        "dataclasses.make_dataclass",
    ),
    "harness_tampering": (
        "torch.use_deterministic_algorithms",
        "torch.are_deterministic_algorithms_enabled",
        "torch.is_deterministic_algorithms_warn_only_enabled",
        "torch.set_deterministic_debug_mode",
        "torch.get_deterministic_debug_mode",
        "torch.set_default_tensor_type",
        "torch.set_default_device",
        "torch.cuda.set_stream",
        "torch.cuda.set_device",
    ),
    "precision_downgrade": (
        "torch.set_default_dtype",
        "torch.set_flush_denormal",
        "torch.autocast",
        "torch.set_autocast_enabled",
        "torch.set_autocast_gpu_dtype",
        "torch.set_autocast_dtype",
        "torch.set_autocast_cpu_dtype",
        "torch.set_autocast_cpu_enabled",
        "torch.set_autocast_cache_enabled",
        "torch.cuda.amp",
    ),
}
ALLOWED_BUILTINS = frozenset(
    {
        "abs",
        "all",
        "any",
        "ascii",
        "bin",
        "bool",
        "bytes",
        "callable",
        "chr",
        "classmethod",
        "complex",
        "dict",
        "divmod",
        "enumerate",
        "filter",
        "float",
        "format",
        "frozenset",
        "hasattr",
        "hash",
        "hex",
        "id",
        "int",
        "isinstance",
        "issubclass",
        "iter",
        "len",
        "list",
        "map",
        "max",
        "min",
        "next",
        "object",
        "oct",
        "ord",
        "pow",
        "print",
        "property",
        "range",
        "repr",
        "reversed",
        "round",
        "set",
        "slice",
        "sorted",
        "staticmethod",
        "str",
        "sum",
        "super",
        "tuple",
        "zip",
        "True",
        "False",
        "None",
        "NotImplemented",
        "Ellipsis",
        "__name__",
        "getattr",
        "setattr",  # only as calls, read like the attribute access they spell (``_check_dynamic_attribute``)
    }
) | frozenset(name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException))
# Builtins that are not on the list must not be bound by the source either: a parameter named eval would
# make the builtin's name look like the source's own everywhere (names are not told apart by scope).
UNBINDABLE = frozenset(name for name in dir(builtins) if not name.startswith("_")) - ALLOWED_BUILTINS - {"exit", "quit"}
ALLOWED_DUNDER_ATTRIBUTES = frozenset({"__init__", "__name__"})  # super().__init__(), Model.__init__(self), fn.__name__
ALLOWED_DUNDER_DEFINITIONS = frozenset(
    {
        "__init__",
        "__repr__",
        "__str__",
        "__len__",
        "__iter__",
        "__next__",
        "__getitem__",
        "__contains__",
        "__call__",
        "__enter__",
        "__exit__",
        "__post_init__",
    }
)
VALUE_ATTRIBUTES_DENIED = frozenset(
    {
        # frames, code and their kin: public names that lead from a generator or traceback to the harness's locals
        "f_back",
        "f_builtins",
        "f_code",
        "f_globals",
        "f_locals",
        "f_trace",
        "gi_frame",
        "gi_code",
        "gi_yieldfrom",
        "cr_frame",
        "cr_code",
        "cr_await",
        "ag_frame",
        "ag_code",
        "ag_await",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
        "co_names",
        "cell_contents",
        "mro",
        # importers kept on objects (a module spec's loader, torch.ops), functions that hand back a module
        # (torch.get_device_module, a Triton driver's device interface), the process-wide Triton driver's
        # switch, and launch hooks (they would run inside a counted launch)
        "import_module",
        "load_library",
        "load_module",
        "exec_module",
        "find_spec",
        "find_module",
        "loader",
        "get_device_module",
        "get_device_interface",
        "set_active",
        "reset_active",
        "add_pre_run_hook",
        "pre_run_hooks",
        # a Triton kernel's globals, its binder and loader, and nn.Module.compile (torch.compile by another name)
        "get_capture_scope",
        "create_binder",
        "preload",
        "compile",
        # a custom op's kernel for one device (it would run only where the recorder does not: the timed calls),
        # its own dispatch rule (it would see the harness's recorder)
        "register_kernel",
        "register_torch_dispatch",
        # a tensor in oneDNN's layout: its ops (mkldnn_linear, its pools) are not PyTorch's dense ones
        "to_mkldnn",
        # a tensor made sparse (see the sparse constructors)
        "to_sparse",
        "to_sparse_coo",
        "to_sparse_csr",
        "to_sparse_csc",
        "to_sparse_bsr",
        "to_sparse_bsc",
        "sparse_mask",
        # modules that objects keep as attributes: reached as a value's attribute they would pass every module rule
        "sys",
        "os",
        "builtins",
        "importlib",
        "traceback",
        "inspect",
        "types",
        "ctypes",
        "subprocess",
        "gc",
        "threading",
        "linecache",
        "pickle",
        "marshal",
        "socket",
        "shutil",
        "tempfile",
        "pathlib",
        "weakref",
        "atexit",
        "signal",
        "platform",
        "torch",
        "triton",
        "json",
        "functools",
        "operator",
        "collections",
        # tensor data leaving for the host, where compute is invisible to the op recorder, or for files and shared memory
        "numpy",
        "tolist",
        "apply_",
        "map_",
        "map2_",
        "storage",
        "untyped_storage",
        "share_memory_",
        "share_memory",
        "tofile",
        "fromfile",
        "from_file",
        "dump",
        "dumps",
    }
)
FORMATTERS = ("format", "format_map")  # str methods that read attributes named in a string
SETTABLE_TORCH_FLAGS = frozenset({"torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic"})
PRECISION_SETTERS = frozenset(
    {
        "set_float32_matmul_precision",
        "allow_tf32",
        "allow_fp16_reduced_precision_reduction",
        "allow_bf16_reduced_precision_reduction",
    }
)
SAFE_PRECISION = {"set_float32_matmul_precision": "highest"}  # the settings that raise precision, or keep it
RESERVED_OP_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_c10d_functional"})
TORCH_LIBRARY_REGISTRARS = frozenset({"torch.library.triton_op", "torch.library.custom_op", "torch.library.register_fake"})


@dataclass(frozen=True)
class PolicyViolation:
    guard: Guard
    line: int
    detail: str

    def describe(self) -> str:
        return f"{self.detail} (line {self.line})"


class _Unresolved:
    """What a chain reaches where the checker could not follow it (a module not installed here: the
    candidate cannot import it either)."""


UNRESOLVED = _Unresolved()


@functools.cache
def _denied_objects() -> dict[int, tuple[Guard, str, object]]:
    """id → (guard, dotted name, object) of every DENIED_OBJECTS entry this machine has (the object is
    kept, so its id stays its own)."""
    denied = {}
    for guard, names in DENIED_OBJECTS.items():
        for dotted in names:
            obj = _resolve_dotted(dotted)
            if obj is not UNRESOLVED:
                denied[id(obj)] = (guard, dotted, obj)
    return denied


def _resolve_dotted(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, UNRESOLVED)
            if obj is UNRESOLVED:
                return UNRESOLVED
        return obj
    return UNRESOLVED


def _import_allowed(name: str) -> Any:
    """The module, imported here (it is on the allow-list: importing it runs only library code)."""
    try:
        return importlib.import_module(name)
    except Exception:  # not installed here, or broken: the candidate's import fails the same way
        return UNRESOLVED


def _static_attribute(obj: Any, attr: str) -> Any:
    """``obj.attr`` where it is plain data (a class's function, a module's value), found without running
    a property or ``__getattr__`` in this trusted process; UNRESOLVED otherwise."""
    if obj is UNRESOLVED:
        return UNRESOLVED
    try:
        value = inspect.getattr_static(obj, attr)
    except AttributeError:
        return UNRESOLVED
    descriptors = (property, types.GetSetDescriptorType, types.MemberDescriptorType, staticmethod, classmethod)
    return UNRESOLVED if isinstance(value, descriptors) else value


def _is_submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _defining_package(obj: Any) -> str | None:
    """The top-level package that defines ``obj``: its own ``__module__`` for functions and classes,
    its type's for instances."""
    module = (
        getattr(obj, "__module__", None)
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial))
        else None
    )
    if not isinstance(module, str):
        module = getattr(type(obj), "__module__", None)
    return module.split(".")[0] if isinstance(module, str) else None


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.violations: list[PolicyViolation] = []
        self.aliases: dict[str, Any] = {}  # names import statements bound, to what they reached
        self.bound = _bound_names(tree)
        self.own_private = _own_private_attributes(tree, self.bound)
        self.instance_methods = _instance_methods(tree)  # class name -> its methods that take self
        self.op_namespaces = _registered_namespaces(tree)
        self._in_jit = 0
        self._owners: list[str | None] = []  # per enclosing function: its first parameter when it is a method
        self._in_class = 0

    def flag(self, guard: Guard, node: ast.AST, detail: str) -> None:
        self.violations.append(PolicyViolation(guard, getattr(node, "lineno", 0), detail))

    # --- imports ---------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self._check_import(alias.name, node):
                local = alias.asname or alias.name.split(".")[0]
                target = alias.name if alias.asname else alias.name.split(".")[0]
                self._bind_alias(local, _import_allowed(target), node)
                _import_allowed(alias.name)  # binds the submodule on its parent, as the import statement does

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.flag("forbidden_import", node, "relative import: a kernel is a single file")
            return
        if not self._check_import(module, node):
            return
        parent = _import_allowed(module)
        for alias in node.names:
            if alias.name == "*":
                self.flag("forbidden_import", node, f"from {module} import *: every name must be visible to the policy")
                continue
            obj = self._step(parent, module, alias.name, node)
            if obj is not None:
                self._bind_alias(alias.asname or alias.name, obj, node)

    def _bind_alias(self, local: str, obj: Any, node: ast.AST) -> None:
        """An imported name: never a refused builtin's, and one target wherever it is imported (names are
        not told apart by scope, so a second import as ``os`` of another module would change every ``os``)."""
        if local in UNBINDABLE or _is_dunder(local):
            self.flag("forbidden_call", node, f"imports something as '{local}', a builtin's name")
        elif local in self.aliases and self.aliases[local] is not obj:
            self.flag("harness_tampering", node, f"imports another object as '{local}': chains from it could not be followed")
        self.aliases[local] = obj

    def _check_import(self, name: str, node: ast.AST) -> bool:
        if name in ALLOWED_MODULES:
            return True
        self.flag("forbidden_import", node, f"imports '{name}', which a kernel does not need")
        return False

    # --- names and attribute chains ---------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if isinstance(node.ctx, ast.Load):
            if name in self.aliases:
                if isinstance(self.aliases[name], types.ModuleType):
                    self.flag(
                        "harness_tampering",
                        node,
                        f"uses the module '{name}' as a value: modules are reached through their attributes",
                    )
            elif _is_dunder(name) and name not in ALLOWED_BUILTINS:
                self.flag("harness_tampering", node, f"uses {name}")
            elif name in ("getattr", "setattr"):
                self.flag("forbidden_call", node, f"uses the builtin '{name}' as a value: only direct calls are read")
            elif name not in self.bound and name not in ALLOWED_BUILTINS:
                self.flag(
                    "forbidden_call",
                    node,
                    f"uses the builtin '{name}', which a kernel does not need"
                    if hasattr(builtins, name)
                    else f"uses '{name}', which the source never defines",
                )
        elif not self._rebinds_to_none(node):
            self._check_binding(name, node)

    def _check_binding(self, name: str, node: ast.AST) -> None:
        """Every way the source binds a name (assignment, parameter, def, class, except, match, with)."""
        if _is_dunder(name):
            self.flag("harness_tampering", node, f"binds {name}")
        elif name in self.aliases:
            self.flag("harness_tampering", node, f"binds the imported name '{name}' again: chains from it could not be followed")
        elif name in UNBINDABLE:
            self.flag(
                "forbidden_call", node, f"binds the name of the builtin '{name}': its uses would look like the source's own"
            )

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._check_binding(node.name, node)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._check_binding(node.name, node)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._check_binding(node.rest, node)
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._check_binding(node.name, node)
        self.generic_visit(node)

    def _rebinds_to_none(self, node: ast.Name) -> bool:
        return _tagged(node, "value_is_none")  # ``triton = None`` after a failed optional import

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Constant) and node.value.value is None:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    _tag(target, "value_is_none")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._chain(node, store=not isinstance(node.ctx, ast.Load))

    def _chain(self, node: ast.Attribute, *, store: bool = False, as_value: bool = True) -> Any:
        """Check the whole dotted chain ending at ``node`` once; return what it reaches where a module chain resolves."""
        attrs, base = _split_chain(node)
        if as_value and attrs[-1] in FORMATTERS:
            self.flag("forbidden_call", node, f".{attrs[-1]} taken as a value: its fields would read attributes unchecked")
        if (
            isinstance(base, ast.Name)
            and base.id in self.instance_methods
            and attrs[0] in self.instance_methods[base.id]
            and not _tagged(node, "init_on_self")
        ):
            self.flag(
                "harness_tampering",
                node,
                f"uses {base.id}.{attrs[0]} unbound: a method runs on its own object, never one handed in",
            )
        if isinstance(base, ast.Name) and base.id in self.aliases:
            if self._in_jit and _module_name(self.aliases[base.id], "").split(".")[0] == "torch":
                self.flag(
                    "pytorch_fallback",
                    node,
                    f"uses {'.'.join([base.id, *attrs])} inside a Triton kernel: PyTorch's work inside a launch is PyTorch's",
                )
            obj = self._walk(base.id, attrs, node)
            if store:
                self._check_module_store(base.id, attrs, node)
            elif as_value and isinstance(obj, types.ModuleType):
                self.flag(
                    "harness_tampering",
                    node,
                    f"uses the module '{'.'.join([base.id, *attrs])}' as a value: modules are reached through their attributes",
                )
            return obj
        self.visit(base)
        root = base.id if isinstance(base, ast.Name) else None
        for i, attr in enumerate(attrs):
            self._check_value_attribute(attr, node, on_self=root in ("self", "cls") and i == 0)
        if store:
            owner = self._owners[-1] if self._owners else None
            if not (len(attrs) == 1 and root is not None and root == owner):
                target = ".".join(([root] if root else []) + attrs)
                self.flag(
                    "harness_tampering",
                    node,
                    f"assigns to {target or attrs[-1]}: only a method's own object (self.name, ctx.name) is the kernel's to set",
                )
        return None

    def _walk(self, root: str, attrs: list[str], node: ast.AST) -> Any:
        obj, dotted = self.aliases[root], root
        for attr in attrs:
            if isinstance(obj, types.ModuleType):
                obj = self._step(obj, dotted, attr, node)
            else:  # past the modules (or where they could not be followed): the value rules
                if not self._check_value_attribute(attr, node, on_self=False):
                    return None
                owner, obj = obj, _static_attribute(obj, attr)
                if (
                    isinstance(owner, type)
                    and isinstance(obj, types.FunctionType)
                    and not (attr == "__init__" and _tagged(node, "init_on_self"))
                ):
                    self.flag(
                        "harness_tampering",
                        node,
                        f"uses {dotted}.{attr} unbound: a library class's method runs on its own object, never one handed in",
                    )
                    return None
                if obj is not UNRESOLVED and not self._check_object(obj, f"{dotted}.{attr}", node):
                    return None
            if obj is None:
                return None
            dotted += "." + attr
        return obj

    def _step(self, module: Any, dotted: str, attr: str, node: ast.AST) -> Any:
        """``module.attr`` under the module rules: None (flagged) when refused."""
        if module is UNRESOLVED:
            return UNRESOLVED
        name = getattr(module, "__name__", dotted)
        if name == "torch.ops":
            return self._torch_ops(attr, node)
        if attr.startswith("_"):
            self.flag("harness_tampering", node, f"uses {dotted}.{attr}: private parts of a library are its harness's too")
            return None
        allowed = MODULE_ATTRIBUTES.get(name)
        if allowed is not None and attr not in allowed:
            guard: Guard = "harness_tampering" if name == "torch.library" else "forbidden_call"
            self.flag(guard, node, f"uses {dotted}.{attr}: of {name} a kernel may use only {', '.join(sorted(allowed))}")
            return None
        try:
            value = getattr(module, attr, UNRESOLVED)
        except Exception:  # a lazy attribute that fails here fails in the candidate too
            value = UNRESOLVED
        if value is UNRESOLVED and f"{name}.{attr}" in ALLOWED_MODULES:
            value = _import_allowed(f"{name}.{attr}")
        if value is UNRESOLVED:
            if _is_submodule(f"{name}.{attr}"):  # not imported here yet, but there in a child that imported it
                self.flag(
                    "forbidden_import", node, f"reaches the module '{name}.{attr}' as {dotted}.{attr}, past the import allow-list"
                )
                return None
            return UNRESOLVED  # no such name: the candidate fails where it uses it; the value rules go on from here
        if allowed is not None and not isinstance(value, types.ModuleType):
            return value  # named on the module's own allow-list
        if isinstance(value, types.ModuleType) and not value.__name__.startswith(name + "."):
            self.flag(
                "forbidden_import",
                node,
                f"reaches the module '{value.__name__}' as the attribute {dotted}.{attr}, past the import allow-list",
            )
            return None
        return value if self._check_object(value, f"{dotted}.{attr}", node) else None

    def _check_object(self, value: Any, dotted: str, node: ast.AST) -> bool:
        if isinstance(value, types.ModuleType):
            if value.__name__ not in ALLOWED_MODULES and value.__name__ != "torch.ops":
                self.flag(
                    "forbidden_import", node, f"reaches the module '{value.__name__}' as {dotted}, past the import allow-list"
                )
                return False
            return True
        denied = _denied_objects().get(id(value))
        if denied is not None:
            self.flag(denied[0], node, f"uses {dotted} ({denied[1]}), which a kernel may not use")
            return False
        if type(value).__name__ == "pybind11_type":
            self.flag(
                "harness_tampering",
                node,
                f"uses {dotted}: a class of torch's JIT, dispatcher or serializer, which a kernel does not need",
            )
            return False
        package = _defining_package(value)
        if package is not None and package not in ALLOWED_PACKAGES:
            self.flag("forbidden_import", node, f"reaches {dotted}, which comes from '{package}', past the import allow-list")
            return False
        return True

    def _torch_ops(self, namespace: str, node: ast.AST) -> Any:
        """``torch.ops.<namespace>.<op>``: operators, never the importers torch.ops also carries."""
        if namespace not in self.op_namespaces:
            self.flag(
                "forbidden_import",
                node,
                f"uses torch.ops.{namespace}: torch.ops is for the operators the source "
                "registers itself (PyTorch's own are called by name, where the judge counts them)",
            )
            return None
        return UNRESOLVED  # an op namespace (the candidate's own ones exist only once it runs): value rules from here

    def _check_value_attribute(self, attr: str, node: ast.AST, *, on_self: bool) -> bool:
        if attr.startswith("_") and attr not in ALLOWED_DUNDER_ATTRIBUTES and not (on_self and attr in self.own_private):
            self.flag("harness_tampering", node, f"accesses .{attr}: private attributes belong to their objects' code")
        elif attr in VALUE_ATTRIBUTES_DENIED:
            self.flag("forbidden_call", node, f"uses .{attr}: {_denied_attribute_reason(attr)}")
        else:
            return True
        return False

    def _check_module_store(self, root: str, attrs: list[str], node: ast.Attribute) -> None:
        dotted = ".".join([_module_name(self.aliases[root], root), *attrs])
        if dotted in SETTABLE_TORCH_FLAGS:
            return
        if attrs[-1] in PRECISION_SETTERS:
            if not _tagged(node, "store_false"):
                self.flag(
                    "precision_downgrade", node, f"sets {'.'.join([root, *attrs])}, lowering the precision of the computation"
                )
            return
        self.flag("harness_tampering", node, f"assigns to {'.'.join([root, *attrs])}: modules are not the kernel's to patch")

    # --- statements that bind, store or define ----------------------------------------------------

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):
            _, base = _split_chain(node.value) if isinstance(node.value, ast.Attribute) else ([], node.value)
            if isinstance(base, ast.Name) and base.id in self.aliases:
                self.flag("harness_tampering", node, "assigns into an item of a module's attribute: not the kernel's to patch")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if not _is_dunder(node.name):
            self._check_binding(node.name, node)
        if _is_dunder(node.name) and node.name not in ALLOWED_DUNDER_DEFINITIONS:
            self.flag("harness_tampering", node, f"defines {node.name}: the harness would run it inside its own calls")
        if node.name == "data_ptr":
            self.flag("harness_tampering", node, "defines data_ptr: a launch takes real tensors, not forged pointers")
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        if node.returns is not None:
            self._annotation(node.returns)
        args = node.args.posonlyargs + node.args.args
        regular = not any(_decorator_name(d) in ("staticmethod", "classmethod") for d in node.decorator_list)
        self._owners.append(args[0].arg if self._in_class and args and regular else None)
        jit = any(self._is_triton_jit(d) for d in node.decorator_list)
        outer, self._in_class = self._in_class, 0
        self._in_jit += jit
        for statement in node.body:
            self.visit(statement)
        self._in_jit -= jit
        self._in_class = outer
        self._owners.pop()

    def _is_triton_jit(self, decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        attrs, base = _split_chain(target) if isinstance(target, ast.Attribute) else ([], target)
        if not isinstance(base, ast.Name) or base.id not in self.aliases:
            return False
        obj = self.aliases[base.id]
        for attr in attrs:
            obj = getattr(obj, attr, None) if isinstance(obj, types.ModuleType) else _static_attribute(obj, attr)
        return _qualified(obj) in ("triton.runtime.jit.jit", "triton.runtime.interpreter.jit")

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._owners.append(None)
        self.generic_visit(node)
        self._owners.pop()

    def visit_arg(self, node: ast.arg) -> None:
        self._check_binding(node.arg, node)
        if node.annotation is not None:
            self._annotation(node.annotation)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def _annotation(self, node: ast.expr) -> None:
        """An annotation is code, and so is every string inside it: ``typing.get_type_hints`` and kin
        evaluate a string annotation, and torch.library's schema inference (``custom_op``,
        ``triton_op``) evaluates the strings nested in one (``list["..."]``) as well."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                parsed = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                self.flag("forbidden_call", node, "a string annotation that is not an expression")
                return
            ast.copy_location(parsed, node)
            for child in ast.walk(parsed):
                ast.copy_location(child, node)
            self._annotation(parsed)
            return
        self.visit(node)
        for child in ast.walk(node):
            if child is not node and isinstance(child, ast.Constant) and isinstance(child.value, str):
                self._annotation(child)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._check_binding(node.name, node)
        for keyword in node.keywords:
            self.flag("harness_tampering", node, f"class {node.name} passes {keyword.arg or '**'} to its metaclass")
        for decorator in node.decorator_list:
            self.visit(decorator)
        for base in node.bases:
            reached = self._chain(base, as_value=False) if isinstance(base, ast.Attribute) else None
            if isinstance(base, ast.Name):
                self.visit(base)
                reached = self.aliases.get(base.id)
            if isinstance(reached, type) and issubclass(reached, _tensor_type()):
                self.flag(
                    "harness_tampering",
                    node,
                    f"class {node.name} subclasses a tensor: the harness would run its "
                    "overrides inside its own calls on the output",
                )
        self._in_class += 1
        for statement in node.body:
            self.visit(statement)
        self._in_class -= 1

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "__init__"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and self._owners
            and node.args[0].id == self._owners[-1]
        ):
            _tag(func, "init_on_self")  # Base.__init__(self, ...)
        for keyword in node.keywords:
            if keyword.arg is not None and keyword.arg.startswith("_"):
                self.flag(
                    "harness_tampering",
                    node,
                    f"passes the private keyword {keyword.arg}: a wrapper's private parameters are the wrapper's",
                )
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr") and func.id not in self.bound:
            self._check_dynamic_attribute(func.id, node)
            return
        if isinstance(func, ast.Attribute) and func.attr in FORMATTERS:
            self._check_format(func, node)
        reached = None
        if isinstance(func, ast.Attribute):
            reached = self._chain(func, as_value=False)
        elif isinstance(func, ast.Name):
            self.visit(func)
            reached = self.aliases.get(func.id)
        else:
            self.visit(func)
        dotted = _dotted(func)
        last = dotted.split(".")[-1] if dotted else None
        safe = SAFE_PRECISION.get(last or "")
        if last in PRECISION_SETTERS and not (safe and node.args and _constant(node.args[0]) == safe):
            self.flag("precision_downgrade", node, f"calls {dotted}(), lowering the precision of the computation")
        if reached is not None and _qualified(reached) in TORCH_LIBRARY_REGISTRARS and node.args:
            self._check_op_name(node.args[0], node)
        is_hasattr = isinstance(func, ast.Name) and func.id == "hasattr" and func.id not in self.bound
        for i, arg in enumerate(node.args):
            self._operand(arg) if is_hasattr and i == 0 else self.visit(arg)
        for keyword in node.keywords:
            self.visit(keyword.value)

    def visit_Compare(self, node: ast.Compare) -> None:
        """``triton is not None`` after an optional import: a module may be compared."""
        for operand in [node.left, *node.comparators]:
            self._operand(operand)

    def _operand(self, node: ast.expr) -> None:
        """An expression where a module may stand (compared, or asked for an attribute by hasattr)."""
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return
        if isinstance(node, ast.Attribute):
            self._chain(node, as_value=False)
        else:
            self.visit(node)

    def _check_dynamic_attribute(self, builtin: str, node: ast.Call) -> None:
        """``getattr(x, "name"[, default])`` reaches what ``x.name`` does, so the same rules;
        ``getattr``/``setattr`` with a computed name only on ``self`` (``setattr(self, f"w{i}", ...)``
        builds a module); ``setattr`` only on ``self``."""
        if len(node.args) < 2 or node.keywords:
            self.flag("forbidden_call", node, f"{builtin}() needs an object and a name")
            return
        target, name = node.args[0], node.args[1]
        for arg in node.args[2:]:
            self.visit(arg)
        own = isinstance(target, ast.Name) and bool(self._owners) and target.id == self._owners[-1]
        constant_name = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
        constant = constant_name is not None
        if not constant and not (own and _public_prefix(name)):
            self.flag(
                "forbidden_call",
                node,
                f"{builtin}() with a computed attribute name: only on a method's own object, "
                "named by a constant public prefix (f'w{i}')",
            )
        if builtin == "setattr":
            if not own:
                self.flag(
                    "harness_tampering",
                    node,
                    "setattr() on another object than self: only a method's own object is the kernel's to set",
                )
            elif constant_name is not None:
                self._check_value_attribute(constant_name, node, on_self=True)
            self.visit(name)
            return
        if constant_name is None:
            self.visit(name)
            return
        attr = constant_name
        if attr in FORMATTERS:
            self.flag(
                "forbidden_call",
                node,
                f"{builtin}(..., {attr!r}) takes .{attr} as a value: its fields would read attributes unchecked",
            )
            return
        if isinstance(target, ast.Name) and target.id in self.aliases:
            self._walk(target.id, [attr], node)
            return
        if isinstance(target, ast.Attribute):
            attrs, base = _split_chain(target)
            if isinstance(base, ast.Name) and base.id in self.aliases:
                self._walk(base.id, [*attrs, attr], node)
                return
        self.visit(target)
        self._check_value_attribute(attr, node, on_self=own)

    def _check_format(self, func: ast.Attribute, node: ast.Call) -> None:
        """``"{0.__class__}".format(x)`` reads attributes by name: each field is checked like an attribute access."""
        if not (isinstance(func.value, ast.Constant) and isinstance(func.value.value, str)):
            self.flag("forbidden_call", node, f".{func.attr}() on a computed string: its fields would read attributes unchecked")
            return
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(func.value.value) if field]
        except ValueError:
            return  # .format raises the same at run time
        for field in fields:
            for attr in _format_attributes(field):
                self._check_value_attribute(attr, node, on_self=False)

    def _check_op_name(self, arg: ast.expr, node: ast.Call) -> None:
        name = _constant(arg)
        namespace = name.split("::")[0] if isinstance(name, str) and "::" in name else None
        if namespace is None or namespace in RESERVED_OP_NAMESPACES or namespace.startswith("_"):
            self.flag(
                "harness_tampering",
                node,
                'registers an operator outside a namespace of its own ("mylib::op"): aten and kin are the harness\'s',
            )

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:  # ``case C(attr=...)`` reads the attribute
            self._check_value_attribute(attr, node, on_self=False)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            if _is_dunder(name):
                self.flag("harness_tampering", node, f"declares {name} global")


def _denied_attribute_reason(attr: str) -> str:
    if attr in ("numpy", "tolist", "apply_", "map_", "map2_", "storage", "untyped_storage"):
        return "tensor data computed on the host is invisible to the judge; a kernel reads and writes tensors"
    if attr in ("tofile", "fromfile", "from_file", "dump", "dumps", "share_memory_", "share_memory", "ctypes"):
        return "a kernel reads and writes no files or raw memory"
    if attr.startswith(("to_sparse", "to_mkldnn")) or attr == "sparse_mask":
        return "a tensor in another layout runs ops whose work the judge does not count"
    return "it leads to frames, code or importers, which are the harness's"


@functools.cache
def _tensor_type() -> type:
    import torch

    return torch.Tensor


def _qualified(obj: Any) -> str | None:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__name__", None)
    if module and name:
        return f"{'torch.library' if module.startswith('torch._library') or module == 'torch.library' else module}.{name}"
    return None


def _module_name(obj: Any, fallback: str) -> str:
    return obj.__name__ if isinstance(obj, types.ModuleType) else fallback


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _format_attributes(field: str) -> Iterator[str]:
    """The attribute names of a format field (``0.a.b[1].c`` → a, b, c)."""
    rest = field.split("[")[0].split(".")[1:]
    yield from rest
    for part in field.split("]")[1:]:
        yield from [p for p in part.split(".")[1:] if p]


def _split_chain(node: ast.expr) -> tuple[list[str], ast.expr]:
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return list(reversed(attrs)), node


def _dotted(node: ast.AST) -> str | None:
    attrs, base = _split_chain(node) if isinstance(node, ast.Attribute) else ([], node)
    return ".".join([base.id, *attrs]) if isinstance(base, ast.Name) else None


def _constant(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _bound_names(tree: ast.Module) -> set[str]:
    """Every name the source binds anywhere (scopes are not told apart: a name the source defines is its own)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return bound


def _decorator_name(decorator: ast.expr) -> str | None:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else None


def _instance_methods(tree: ast.Module) -> dict[str, set[str]]:
    """Per class the source defines, the methods that take their object (neither static nor class methods)."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found.setdefault(node.name, set()).update(
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not any(_decorator_name(d) in ("staticmethod", "classmethod") for d in item.decorator_list)
            )
    return found


def _registered_namespaces(tree: ast.Module) -> set[str]:
    """The operator namespaces the source registers ("ns::op" strings)."""
    return {
        node.value.split("::")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[A-Za-z]\w*::\w+", node.value)
    }


def _public_prefix(name: ast.expr) -> bool:
    """A computed attribute name that starts with a constant letter (f"w{i}"): never a private or dunder one."""
    while isinstance(name, ast.BinOp) and isinstance(name.op, ast.Add):
        name = name.left
    first = name.values[0] if isinstance(name, ast.JoinedStr) and name.values else name
    prefix = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
    # never one that could spell .format (its fields read attributes unchecked)
    return bool(prefix) and prefix[0].isalpha() and not any(word.startswith(prefix) for word in FORMATTERS)


def _own_private_attributes(tree: ast.Module, bound: set[str]) -> set[str]:
    """Single-underscore names the source itself gives its objects: ``self._x = ...``, ``def _helper``."""
    stored = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load)}
    return {name for name in bound | stored if name.startswith("_") and not _is_dunder(name)}


def _tag(node: ast.AST, tag: str) -> None:
    """Mark a node of the syntax tree for a later check (the tree is the checker's own parse)."""
    setattr(node, f"kz_{tag}", True)


def _tagged(node: ast.AST, tag: str) -> bool:
    return bool(getattr(node, f"kz_{tag}", False))


def _mark_false_stores(tree: ast.Module) -> None:
    """``allow_tf32 = False`` and kin keep full precision: such stores are allowed."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _constant(node.value) is False:
            for target in node.targets:
                _tag(target, "store_false")


def check_source(source: str) -> list[PolicyViolation]:
    """All violations of the capability policy in a candidate's source (empty: allowed)."""
    return check_tree(ast.parse(source))


def check_tree(tree: ast.Module) -> list[PolicyViolation]:
    """``check_source`` for a source the caller has parsed already."""
    _mark_false_stores(tree)
    checker = _Checker(tree)
    checker.visit(tree)
    return sorted(checker.violations, key=lambda v: v.line)
