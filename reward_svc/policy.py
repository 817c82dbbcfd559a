"""The capability policy: what a kernel's Python may touch, checked on its syntax tree.

Correctness, decoys and fallbacks are judged on dynamic evidence (see harness/ and verify.py).
This policy closes the other door: code that reaches *around* the harness (patching timers or
torch, walking frames or the heap, threads and processes, file and network I/O, dynamic code)
has no business in a kernel, and would let a candidate tamper with the measurements that run in
its own process. A violation is a ``rejected`` verdict naming the rule.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

ALLOWED_MODULES = frozenset({
    "torch", "triton", "numpy", "math", "functools", "itertools", "operator", "typing",
    "dataclasses", "collections", "enum", "abc", "warnings", "os", "__future__", "einops",
})
FORBIDDEN_CALLS = frozenset({
    "eval", "exec", "compile", "__import__", "globals", "locals", "vars", "breakpoint", "open",
    "input", "memoryview", "delattr",
})
# Attributes that lead from an object to frames, code, globals or the class hierarchy.
FORBIDDEN_ATTRIBUTES = frozenset({
    "__globals__", "__code__", "__closure__", "__builtins__", "__subclasses__", "__bases__", "__mro__",
    "__dict__", "__getattribute__", "__setattr__", "__loader__", "__spec__", "f_back", "f_globals",
    "f_locals", "f_code", "gi_frame", "cr_frame", "tb_frame", "_getframe", "settrace", "setprofile",
    "__reduce__", "__reduce_ex__",
})  # not "modules": sys.modules is out of reach with sys itself (MODULE_ATTRIBUTES), and nn.Module.modules() is a kernel's
# Parts of torch that reach into the dispatcher, the C core or other processes (torch.library
# re-implements aten operators for the whole process, the harness's own included).
FORBIDDEN_TORCH_PARTS = ("torch._C", "torch.multiprocessing", "torch.utils._python_dispatch", "torch.overrides",
                         "torch.distributed", "torch._dynamo", "torch.library")
# torch.library's documented ways to register a Triton kernel or a new op, which override nothing.
TORCH_LIBRARY_ALLOWED = frozenset({"torch.library.triton_op", "torch.library.wrap_triton", "torch.library.custom_op"})
SAFE_PRECISION = {"set_float32_matmul_precision": "highest"}  # the settings that raise precision, or keep it
# Modules the allowed ones carry as attributes (``torch.sys``, ``np.os``): reached that way, they
# bypass the import allow-list.
MODULE_ATTRIBUTES = frozenset({
    "sys", "os", "builtins", "importlib", "subprocess", "ctypes", "gc", "inspect", "threading", "_thread",
    "multiprocessing", "pickle", "shutil", "socket", "pathlib", "tempfile", "atexit", "marshal", "weakref", "io",
})
# Methods that write or map files, on whatever object (``x.numpy().tofile(path)``).
FILE_IO_METHODS = frozenset({"tofile", "fromfile", "dump", "from_file", "memmap", "_share_filename_cpu_",
                             "_new_shared_filename_cpu", "_share_fd_cpu_", "_new_shared_fd_cpu"})
SETTABLE_TORCH_FLAGS = frozenset({"torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic"})
OS_ALLOWED = frozenset({"environ", "path", "getenv", "cpu_count"})
FILE_IO_FUNCTIONS = frozenset({"save", "load", "tofile", "fromfile", "savetxt", "loadtxt", "savez", "memmap", "from_file"})
PRECISION_SETTERS = frozenset({"set_float32_matmul_precision", "allow_tf32", "allow_fp16_reduced_precision_reduction",
                               "allow_bf16_reduced_precision_reduction", "set_default_dtype"})


@dataclass(frozen=True)
class PolicyViolation:
    guard: str
    line: int
    detail: str

    def describe(self) -> str:
        return f"{self.detail} (line {self.line})"


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.violations: list[PolicyViolation] = []
        self.module_aliases: set[str] = set()  # every imported name
        self._safe_stores: set[int] = set()  # precision flags assigned False: full precision kept
        self.real_names: dict[str, str] = {}  # names ``import`` bound to a module, to its name: ``import torch as T``: T -> torch
        self.file_io_modules: set[str] = set()  # aliases of torch and numpy, which can save and load

    def _flag(self, guard: str, node: ast.AST, detail: str) -> None:
        self.violations.append(PolicyViolation(guard, getattr(node, "lineno", 0), detail))

    def _check_module(self, name: str, node: ast.AST) -> None:
        if name.split(".")[0] not in ALLOWED_MODULES:
            self._flag("forbidden_import", node, f"imports '{name}', which a kernel does not need")
        elif _is_forbidden_torch_part(name):
            self._flag("harness_tampering", node, f"imports '{name}', which reaches into torch's dispatcher or core")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(alias.name, node)
            local = (alias.asname or alias.name).split(".")[0]
            self.module_aliases.add(local)
            self.real_names[local] = alias.name if alias.asname else local
            if alias.name.split(".")[0] in ("torch", "numpy") and (alias.asname is None or "." not in alias.name):
                self.file_io_modules.add(local)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self._flag("forbidden_import", node, "relative import: a kernel is a single file")
        else:
            self._check_module(node.module or "", node)
            if (node.module or "") == "os":
                for alias in node.names:
                    if alias.name not in OS_ALLOWED:
                        self._flag("forbidden_call", node, f"imports os.{alias.name}")
        for alias in node.names:
            self.module_aliases.add(alias.asname or alias.name)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
            self._flag("forbidden_call", node, f"calls {func.id}()")
        if isinstance(func, ast.Name) and func.id in ("setattr", "getattr", "hasattr") and node.args:
            self._check_dynamic_attribute(func.id, node)
        name = _dotted(func)
        if name:
            parts = name.split(".")
            if parts[0] == "os" and len(parts) > 1 and parts[1] not in OS_ALLOWED:
                self._flag("forbidden_call", node, f"calls {name}()")
            if parts[0] in self.file_io_modules and parts[-1] in FILE_IO_FUNCTIONS:
                self._flag("forbidden_call", node, f"calls {name}(): a kernel reads and writes no files")
            safe = SAFE_PRECISION.get(parts[-1])
            if parts[-1] in PRECISION_SETTERS and not (safe and node.args and _constant(node.args[0]) == safe):
                self._flag("precision_downgrade", node, f"calls {name}(), lowering the precision of the computation")
        self.generic_visit(node)

    def _check_dynamic_attribute(self, builtin: str, node: ast.Call) -> None:
        """``getattr(x, "name")`` reaches what ``x.name`` does, so the same rules; ``hasattr`` only
        answers yes or no; ``setattr`` only on ``self`` (``setattr(self, f"w{i}", ...)`` builds a
        module), elsewhere the policy reads attribute stores as assignments."""
        target, name = node.args[0], node.args[1] if len(node.args) > 1 else None
        own = isinstance(target, ast.Name) and target.id == "self"
        on_module = isinstance(target, ast.Name) and target.id in self.module_aliases
        if builtin == "setattr" and not own:
            self._flag("harness_tampering", node, f"setattr() on {'module ' + repr(target.id) if on_module else 'another object than self'}: "
                       "the policy reads attribute stores only as assignments")
        elif builtin == "hasattr" or name is None:
            return
        elif not isinstance(name, ast.Constant):
            if not own:
                self._flag("forbidden_call", node, f"{builtin}() with a computed attribute name")
        elif on_module:
            self._check_module_attribute(f"{target.id}.{name.value}", node)
        else:
            self._check_attribute_name(str(name.value), node)

    def _check_attribute_name(self, attr: str, node: ast.AST, *, on_module: bool = False) -> bool:
        """The rules on an attribute's name, whatever it is read from; True if one fired."""
        if attr in FORBIDDEN_ATTRIBUTES:
            self._flag("harness_tampering", node, f"accesses .{attr}")
        elif on_module and attr in MODULE_ATTRIBUTES:
            self._flag("forbidden_import", node, f"reaches the module '{attr}' as an attribute, past the import allow-list")
        elif attr in FILE_IO_METHODS:
            self._flag("forbidden_call", node, f"uses .{attr}: a kernel reads and writes no files")
        else:
            return False
        return True

    def _check_module_attribute(self, dotted: str, node: ast.AST) -> None:
        """``M.a.b``, read from a module (or getattr on one): the name rules, and torch's off-limits parts."""
        parts = dotted.split(".")
        if self._check_attribute_name(parts[-1], node, on_module=True):
            return
        if parts[0] in self.file_io_modules and parts[-1] in FILE_IO_FUNCTIONS:
            self._flag("forbidden_call", node, f"reaches {dotted}: a kernel reads and writes no files")
        else:
            real = ".".join([self.real_names.get(parts[0], parts[0]), *parts[1:]])
            if _is_forbidden_torch_part(real) and real not in TORCH_LIBRARY_ALLOWED:
                self._flag("harness_tampering", node, f"uses {dotted}, which reaches into torch's dispatcher or core")

    def visit_Assign(self, node: ast.Assign) -> None:
        if _constant(node.value) is False:  # allow_tf32 = False and kin keep full precision
            self._safe_stores.update(id(t) for t in node.targets)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node)
        root = _root_name(node)
        if root in self.module_aliases and dotted and not isinstance(node.ctx, ast.Store):
            self._check_module_attribute(dotted, node)
            if dotted in TORCH_LIBRARY_ALLOWED:
                return  # its prefix, torch.library, is off limits as such
        else:
            self._check_attribute_name(node.attr, node)
        if isinstance(node.ctx, ast.Store) and dotted not in SETTABLE_TORCH_FLAGS:
            if node.attr in PRECISION_SETTERS and id(node) not in self._safe_stores:
                self._flag("precision_downgrade", node, f"sets {_dotted(node)}, lowering the precision of the computation")
            elif root in self.module_aliases and root != "os" and node.attr not in PRECISION_SETTERS:
                self._flag("harness_tampering", node, f"assigns to {_dotted(node) or node.attr}: modules are not the kernel's to patch")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            self._flag("harness_tampering", node, f"uses {node.id}")
        self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> None:
        """A module is only ever the base of an attribute, the object of getattr/hasattr, or
        compared (``triton is not None`` after an optional import): passed around as a value
        (``T = torch``, ``f(np)``, ``[triton]``) its attributes escape every rule above."""
        for field, value in ast.iter_fields(node):
            for index, child in enumerate(value if isinstance(value, list) else [value]):
                if (isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load) and child.id in self.real_names
                        and not (isinstance(node, ast.Attribute) and field == "value") and not isinstance(node, ast.Compare)
                        and not (_is_attribute_builtin(node) and field == "args" and index == 0)):
                    self._flag("harness_tampering", child, f"uses the module '{child.id}' as a value: modules are reached through their attributes")
        super().generic_visit(node)


def _is_attribute_builtin(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")


def _constant(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _is_forbidden_torch_part(name: str) -> bool:
    return any(name == part or name.startswith(part + ".") for part in FORBIDDEN_TORCH_PARTS)


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def check_source(source: str) -> list[PolicyViolation]:
    """All violations of the capability policy in a candidate's source (empty: allowed)."""
    return check_tree(ast.parse(source))


def check_tree(tree: ast.Module) -> list[PolicyViolation]:
    """``check_source`` for a source the caller has parsed already."""
    checker = _Checker()
    checker.visit(tree)
    return checker.violations
