"""Mining API co-occurrence from real PyTorch code, and keeping it in the database.

The corpus is only parsed (``ast``), never imported or run. For each class with a ``forward``
the miner collects the set of canonical APIs (see ``proposer_svc.stats``) its forward uses:

- Calls through any import alias: ``import torch.nn.functional as F``, ``from torch import nn``,
  ``from torch.nn import functional``, ``nn.functional.relu``, relative imports inside a known
  package (``from .linear import Linear`` in ``torch.nn.modules``). Names are checked against the
  installed torch and normalised (``torch.nn.modules.conv.Conv2d`` -> ``torch.nn.Conv2d``,
  ``torch.functional.einsum`` -> ``torch.einsum``); private, non-callable and non-op names
  (``torch.jit``, ``torch.Tensor``, ``nn.Parameter``, containers) are not APIs.
- Layers: ``self.conv = nn.Conv2d(...)`` (or ``self.act = F.gelu``) in any method makes
  ``self.conv(x)`` count as ``torch.nn.Conv2d``. A container (``nn.Sequential``, ``ModuleList``,
  ``ModuleDict``) stands for the layers built inside it, counted wherever forward refers to it.
- Helper methods that forward calls as ``self.helper(...)`` are part of the forward body.
- Tensor methods: ``x.softmax(...)`` counts as ``Tensor.softmax`` when ``softmax`` is a public
  ``torch.Tensor`` method, and either the receiver is known to be a tensor or the name is no
  method of Python's own str/list/dict/tuple/set/int/float (``.split`` on a string is not torch).
- Operators: ``@`` is always ``torch.matmul``; ``+ - * /`` (and their ``+=`` forms) count as
  ``torch.add/sub/mul/div`` only when an operand is known to be a tensor (a forward argument not
  annotated as a Python scalar, a name assigned from a tensor expression, a parameter or buffer,
  an API result), so shape arithmetic such as ``seq_len + 1`` is not counted.

A forward body that uses no API at all (abstract or pure bookkeeping) is not a module here.
"""

from __future__ import annotations

import ast
import inspect
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from itertools import combinations
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from sqlalchemy import delete, select

from proposer_svc.stats import ApiStats
from services.db.models import ApiCorpus, ApiPair, ApiUsage
from services.db.session import session_scope

DEFAULT_CORPUS = "default"
CONTAINERS = {"torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"}
NOT_APIS = {"torch.nn.Module", "torch.nn.ParameterList", "torch.nn.ParameterDict"}
TORCH_SUBMODULES = ("torch.nn.functional.", "torch.linalg.", "torch.fft.", "torch.special.")
BINOPS = {ast.Add: "torch.add", ast.Sub: "torch.sub", ast.Mult: "torch.mul", ast.Div: "torch.div"}
SCALAR_ANNOTATIONS = {"int", "float", "bool", "str"}
# Tensor methods whose result is no tensor: arithmetic on it is shape bookkeeping.
NON_TENSOR_RESULTS = {
    "size",
    "dim",
    "numel",
    "item",
    "tolist",
    "stride",
    "element_size",
    "data_ptr",
    "is_contiguous",
    "is_floating_point",
    "get_device",
    "nelement",
    "ndimension",
}
TENSOR_ATTRIBUTES = {"T", "mT", "H", "mH", "real", "imag", "data", "grad"}
BUILTIN_METHODS = frozenset(n for t in (str, list, dict, tuple, set, int, float) for n in dir(t))


@dataclass(frozen=True)
class CorpusSource:
    """A directory of Python files; ``package`` resolves relative imports (``torch.nn.modules``)."""

    directory: Path
    pattern: str = "*.py"
    package: str | None = None

    def files(self) -> list[Path]:
        return sorted(self.directory.glob(self.pattern))


@dataclass
class MiningResult:
    stats: ApiStats
    files: int = 0
    skipped: list[str] = field(default_factory=list)  # "path: why" for files that would not parse


def default_corpus() -> list[CorpusSource]:
    """The installed ``transformers`` modeling files and ``torch.nn``'s own modules."""
    import torch
    import transformers

    return [
        CorpusSource(Path(transformers.__file__).parent / "models", "*/modeling_*.py"),
        CorpusSource(Path(torch.__file__).parent / "nn" / "modules", "*.py", package="torch.nn.modules"),
    ]


def directory_corpus(directories: Iterable[Path]) -> list[CorpusSource]:
    """Every ``.py`` file under each directory (recursively)."""
    return [CorpusSource(Path(d), "**/*.py") for d in directories]


def mine(sources: Iterable[CorpusSource], show_progress: bool = False) -> MiningResult:
    """Usage and pair counts over every ``forward`` body in the sources' files."""
    files = [(path, source.package) for source in sources for path in source.files()]
    usage: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    result = MiningResult(ApiStats(), files=len(files))
    modules = 0
    progress = Progress(
        TextColumn("mining"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[modules]} modules"),
        disable=not show_progress,
    )
    with progress:
        bar = progress.add_task("mine", total=len(files), modules=0)
        for path, package in files:
            try:
                api_sets = list(forward_api_sets(ast.parse(path.read_bytes(), filename=str(path)), package))
            except (SyntaxError, ValueError, OSError, RecursionError, MemoryError, RuntimeError) as exc:
                result.skipped.append(f"{path}: {type(exc).__name__}: {exc}")
                progress.advance(bar)
                continue
            for apis in api_sets:
                modules += 1
                usage.update(apis)
                pairs.update(combinations(sorted(apis), 2))
            progress.update(bar, advance=1, modules=modules)
    result.stats = ApiStats(modules=modules, usage=dict(usage), pairs=dict(pairs))
    return result


def forward_api_sets(tree: ast.Module, package: str | None = None) -> Iterator[set[str]]:
    """The API set of each class's ``forward`` in a parsed file (empty sets left out)."""
    aliases = import_aliases(tree, package)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if "forward" in methods:
                apis = _ForwardScan(aliases, methods).scan()
                if apis:
                    yield apis


def import_aliases(tree: ast.Module, package: str | None) -> dict[str, str]:
    """Local name -> dotted path for every import in the file (function-level ones too)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:  # `import torch.nn` binds `torch`
                    root = alias.name.split(".")[0]
                    aliases[root] = root
        elif isinstance(node, ast.ImportFrom):
            module = _absolute_module(node, package)
            if module is None:
                continue
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
    return aliases


def _absolute_module(node: ast.ImportFrom, package: str | None) -> str | None:
    if not node.level:
        return node.module
    if package is None:
        return None
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else [])) or None


@cache
def canonical_api(dotted: str) -> str | None:
    """The canonical API name of a dotted path into torch, or None when it is not an op."""
    import torch  # here, not at the top: the Proposer's API reads mined statistics without loading torch

    parts = dotted.split(".")
    if parts[0] != "torch" or any(p.startswith("_") for p in parts):
        return None
    obj: object = torch
    for part in parts[1:]:
        found = getattr(obj, part, None)
        if found is None:
            return None
        obj = found
    if isinstance(obj, type):
        if not issubclass(obj, torch.nn.Module) or getattr(torch.nn, obj.__name__, None) is not obj:
            return None
        name = f"torch.nn.{getattr(obj, '__name__', '')}"
        return None if name in NOT_APIS else name
    if not callable(obj) or inspect.ismodule(obj):
        return None
    leaf = parts[-1]
    if dotted.startswith(TORCH_SUBMODULES):
        return dotted
    if getattr(torch, leaf, None) is obj:
        return f"torch.{leaf}"
    return None


@cache
def is_tensor_method(name: str) -> bool:
    import torch

    return not name.startswith("_") and callable(getattr(torch.Tensor, name, None))


class _ForwardScan:
    """The APIs of one class's forward (plus the helpers it calls on ``self``)."""

    def __init__(self, aliases: dict[str, str], methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> None:
        self.aliases = aliases
        self.methods = methods
        self.layers: dict[str, set[str]] = {}  # self attribute -> APIs it stands for
        self.containers: set[str] = set()
        self.tensor_attrs: set[str] = set()
        self.apis: set[str] = set()
        for method in methods.values():
            self._collect_attributes(method)

    def scan(self) -> set[str]:
        seen: set[str] = set()
        todo = ["forward"]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            method = self.methods[name]
            tensors = self._tensor_names(method)
            for node in ast.walk(method):
                if isinstance(node, ast.Call):
                    helper = self._self_attr(node.func)
                    if helper in self.methods:
                        todo.append(helper)
                self._visit(node, tensors)
        return self.apis

    def _collect_attributes(self, method: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for node in ast.walk(method):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    attr = self._self_attr(target)
                    if attr is not None:
                        self._classify_attribute(attr, node.value)
            elif isinstance(node, ast.Call) and self._self_attr(node.func) == "register_buffer" and node.args:
                if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    self.tensor_attrs.add(node.args[0].value)

    def _classify_attribute(self, attr: str, value: ast.expr) -> None:
        target = value.func if isinstance(value, ast.Call) else value
        api = self._api_of(target)
        if api is None:
            dotted = self._dotted(target)
            if dotted and dotted.split(".")[-1] in ("Parameter", "Buffer"):
                self.tensor_attrs.add(attr)
            return
        if api in CONTAINERS:
            inner = {
                a
                for n in ast.walk(value)
                if isinstance(n, ast.Call) and n is not value
                for a in [self._api_of(n.func)]
                if a and a.startswith("torch.nn.") and a[9:10].isupper()
            }
            self.layers.setdefault(attr, set()).update(inner - CONTAINERS)
            self.containers.add(attr)
        elif api.startswith("torch.nn.") and api[9:10].isupper() or not isinstance(value, ast.Call):
            self.layers.setdefault(attr, set()).add(api)  # a layer, or a function stored for later calls
        else:
            self.tensor_attrs.add(attr)  # e.g. self.pe = torch.zeros(...)

    def _visit(self, node: ast.AST, tensors: set[str]) -> None:
        if isinstance(node, ast.Call):
            attr = self._self_attr(node.func)
            if attr in self.layers and attr not in self.containers:
                self.apis |= self.layers[attr]
            elif (api := self._api_of(node.func)) is not None:
                self.apis.add(api)
            elif isinstance(node.func, ast.Attribute) and attr is None and self._is_tensor_call(node.func, tensors):
                self.apis.add(f"Tensor.{node.func.attr}")
        elif isinstance(node, ast.Attribute) and (attr := self._self_attr(node)) in self.containers:
            self.apis |= self.layers[attr]
        elif isinstance(node, (ast.BinOp, ast.AugAssign)):
            left, right = (node.left, node.right) if isinstance(node, ast.BinOp) else (node.target, node.value)
            if isinstance(node.op, ast.MatMult):
                self.apis.add("torch.matmul")
            elif type(node.op) in BINOPS and (self._is_tensor(left, tensors) or self._is_tensor(right, tensors)):
                self.apis.add(BINOPS[type(node.op)])

    def _is_tensor_call(self, func: ast.Attribute, tensors: set[str]) -> bool:
        if not is_tensor_method(func.attr) or self._dotted(func.value) is not None:
            return False  # `torch.foo` / `F.foo` that is no API is not a tensor method either
        return func.attr not in BUILTIN_METHODS or self._is_tensor(func.value, tensors)

    def _tensor_names(self, method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
        """Names that hold tensors: unannotated-or-tensor arguments and what tensor expressions assign."""
        args = method.args
        tensors = {
            a.arg
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
            if a.arg != "self" and not _scalar_annotation(a.annotation)
        }
        assignments = [
            n for n in ast.walk(method) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None
        ]
        changed = True
        while changed:  # a fixpoint: assignments may appear in any order in the walk
            changed = False
            for node in assignments:
                if node.value is None or not self._is_tensor(node.value, tensors):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name) and name.id not in tensors:
                            tensors.add(name.id)
                            changed = True
        return tensors

    def _is_tensor(self, node: ast.expr, tensors: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in tensors
        if isinstance(node, ast.Attribute):
            if (attr := self._self_attr(node)) is not None:
                return attr in self.tensor_attrs
            return node.attr in TENSOR_ATTRIBUTES and self._is_tensor(node.value, tensors)
        if isinstance(node, ast.Call):
            attr = self._self_attr(node.func)
            if attr in self.layers or self._api_of(node.func) is not None:
                return True
            func = node.func
            return (
                isinstance(func, ast.Attribute)
                and attr is None
                and func.attr not in NON_TENSOR_RESULTS
                and is_tensor_method(func.attr)
                and self._is_tensor(func.value, tensors)
            )
        if isinstance(node, ast.Subscript):
            return self._is_tensor(node.value, tensors)
        if isinstance(node, ast.BinOp):
            return self._is_tensor(node.left, tensors) or self._is_tensor(node.right, tensors)
        if isinstance(node, ast.UnaryOp):
            return self._is_tensor(node.operand, tensors)
        if isinstance(node, (ast.Tuple, ast.List)):
            return any(self._is_tensor(e, tensors) for e in node.elts)
        return False

    def _api_of(self, node: ast.expr) -> str | None:
        dotted = self._dotted(node)
        return canonical_api(dotted) if dotted else None

    def _dotted(self, node: ast.expr) -> str | None:
        """``F.relu`` -> ``torch.nn.functional.relu`` through the import aliases; None otherwise."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    @staticmethod
    def _self_attr(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr
        return None


def _scalar_annotation(annotation: ast.expr | None) -> bool:
    """``int``, ``bool``, ``Optional[int]``, ``int | None``: not a tensor."""
    if annotation is None:
        return False
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)} - {"Optional", "None", "Union"}
    return bool(names) and names <= SCALAR_ANNOTATIONS


def save_stats(name: str, result: MiningResult, sources: Iterable[CorpusSource]) -> None:
    """Store a corpus's statistics, replacing what was mined under that name before."""
    with session_scope() as session:
        session.execute(delete(ApiPair).where(ApiPair.corpus == name))
        session.execute(delete(ApiUsage).where(ApiUsage.corpus == name))
        session.execute(delete(ApiCorpus).where(ApiCorpus.name == name))
        session.flush()
        session.add(
            ApiCorpus(
                name=name,
                sources=[f"{s.directory}/{s.pattern}" for s in sources],
                files=result.files,
                modules=result.stats.modules,
            )
        )
        session.flush()
        session.add_all(ApiUsage(corpus=name, api=api, count=count) for api, count in result.stats.usage.items())
        session.add_all(ApiPair(corpus=name, api_a=a, api_b=b, count=count) for (a, b), count in result.stats.pairs.items())


def load_stats(name: str = DEFAULT_CORPUS) -> ApiStats | None:
    """A corpus's statistics as mined, or None if nothing was mined under that name."""
    with session_scope() as session:
        corpus = session.get(ApiCorpus, name)
        if corpus is None:
            return None
        usage = {u.api: u.count for u in session.scalars(select(ApiUsage).where(ApiUsage.corpus == name))}
        pairs = {(p.api_a, p.api_b): p.count for p in session.scalars(select(ApiPair).where(ApiPair.corpus == name))}
        return ApiStats(modules=corpus.modules, usage=usage, pairs=pairs)
