"""The validation check a proposed module passes before it enters the task pool.

Structure is checked here, on the AST only: the module is untrusted and is never imported in a
service process. Everything else runs in a sandboxed child (``proposer_svc.validation_child``,
started through the reward service's child pool): it loads, runs, gives finite output that is not
near-constant, is deterministic, depends on the input seed, on every input and on the parameters,
and its runtime lies within bounds. Duplicates are found by two hashes: the normalised source
(docstrings, comments, annotations and formatting gone, identifiers renamed canonically) and the
graph the child recorded (the aten ops with their shapes and dtypes).
"""

from __future__ import annotations

import ast
import builtins
import copy
import hashlib
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from reward_svc import check_tree
from services.config import Settings, get_settings

CHILD_ENTRY = "proposer_svc.validation_child"
RULES = (
    "structure",
    "load_error",
    "runtime_error",
    "timeout",
    "output_type",
    "nan_inf",
    "near_constant",
    "nondeterministic",
    "seed_invariant",
    "input_unused",
    "parameters_unused",
    "too_fast",
    "too_slow",
    "duplicate",
)


@dataclass(frozen=True)
class ValidationOptions:
    device: Literal["auto", "cpu", "cuda"] = "auto"
    timeout_s: float | None = None  # None: KZ_PROPOSER_VALIDATION_TIMEOUT_S
    min_ms: float | None = None  # None: the setting for the device; 0: no bound
    max_ms: float | None = None
    near_constant_rtol: float = 1e-5  # (max - min) / max|x| below this: near-constant
    change_rtol: float = 1e-6  # an output "changes" when it moves by more than this share of its magnitude
    nondeterminism_rtol: float = 1e-3  # two runs on the same inputs may differ by this much (GPU atomics)
    timed_runs: int = 3  # CPU: median of at least this many forward passes after the warm-up pass
    gpu_timing_budget_s: float = 2.0
    # Fixed seeds, so one module always yields the same graph hash (dedup) and the same verdict.
    input_seeds: tuple[int, int] = (0, 1)
    weight_seeds: tuple[int, int] = (0, 1)


class ValidationResult(BaseModel):
    valid: bool
    reason: str = Field(description="In words, for humans.")
    rule: str | None = Field(default=None, description="Machine name of the rule that rejected the module.")
    source_hash: str | None = None
    graph_hash: str | None = None
    device: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


# --- structure and the normalised source -------------------------------------------------------

_FIXED_NAMES = {"Model", "forward", "get_inputs", "get_init_inputs", "__init__", "self", "super"}


def check_structure(tree: ast.Module) -> str | None:
    """Why the module is not a KernelBench-format task, or None."""
    top = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    model = top.get("Model")
    if not isinstance(model, ast.ClassDef):
        return "the module defines no class Model"
    for name in ("get_inputs", "get_init_inputs"):
        if not isinstance(top.get(name), ast.FunctionDef):
            return f"the module defines no function {name}()"
    forward = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if forward is None:
        return "Model has no forward method"
    args = forward.args
    params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)][1:]  # [0] is self
    params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    used = {n.id for n in ast.walk(forward) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    unused = [p for p in params if p not in used]
    if unused:
        return f"forward never uses its argument{'s' if len(unused) > 1 else ''} {', '.join(unused)}"
    return None


class _Canonical(ast.NodeTransformer):
    """Renames what the module itself names, scope by scope, in order of first appearance: module
    names (constants, functions, import aliases) to g0, g1, ...; a function's arguments and locals
    to l<depth>_0, ...; attributes set on self to a0, ...; drops docstrings and annotations."""

    def __init__(self, module_names: set[str], attributes: set[str]) -> None:
        self.module_names, self.attributes = module_names, attributes
        self.globals: dict[str, str] = {}
        self.attrs: dict[str, str] = {}
        self.scopes: list[tuple[set[str], dict[str, str]]] = []  # (locals, their new names), innermost last

    def rename(self, name: str) -> str:
        for local, names in reversed(self.scopes):
            if name in local:
                return names.setdefault(name, f"l{len(self.scopes)}_{len(names)}")
        if name in self.module_names:
            return self.globals.setdefault(name, f"g{len(self.globals)}")
        return name

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.rename(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.annotation = None
        node.arg = self.rename(node.arg)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.attributes:
            node.attr = self.attrs.setdefault(node.attr, f"a{len(self.attrs)}")
        return node

    def _in_scope(self, node: ast.FunctionDef | ast.Lambda) -> ast.AST:
        args = node.args
        local = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a is not None}
        local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
        self.scopes.append((local - _FIXED_NAMES, {}))
        self.generic_visit(node)
        self.scopes.pop()
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self.rename(node.name)
        node.returns = None
        node.body = _without_docstring(node.body)
        return self._in_scope(node)

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return self._in_scope(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = self.rename(node.name)
        node.body = _without_docstring(node.body)
        self.generic_visit(node)
        return node

    def visit_alias(self, node: ast.alias) -> ast.AST:
        if node.asname:
            node.asname = self.rename(node.asname)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.Pass()
        return self.visit(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno))

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args = []  # super(Model, self) is super()
        return node


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[1:] or [ast.Pass()]
    return body


def normalise_source(tree: ast.Module) -> str:
    """The module's code without what does not change what it computes (comments, docstrings,
    annotations, formatting, the names it chose)."""
    module_names: set[str] = set()
    attributes: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            module_names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module_names |= {a.asname for a in node.names if a.asname}
        else:
            module_names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    attributes |= {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    module_names -= _FIXED_NAMES | set(dir(builtins))
    canonical = _Canonical(module_names, attributes).visit(copy.deepcopy(tree))  # the caller's tree stays as it was
    canonical.body = _without_docstring(canonical.body)
    return ast.unparse(ast.fix_missing_locations(canonical))


def finite(value: Any) -> Any:
    """JSON the database and HTTP accept: an infinite or NaN measurement (an integer output that
    changed completely) is recorded as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def source_hash(tree: ast.Module) -> str:
    return hashlib.sha256(normalise_source(tree).encode()).hexdigest()


def check_static(source: str) -> ValidationResult | str:
    """The verdict where the AST already decides it (syntax, structure), else the normalised source's hash."""
    try:
        tree = ast.parse(source)
        digest = source_hash(tree)
    except SyntaxError as exc:
        return ValidationResult(valid=False, rule="structure", reason=f"not valid Python: {exc.msg} (line {exc.lineno})")
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting deeper than the parser or our walk
        return ValidationResult(valid=False, rule="structure", reason=f"cannot be analysed: {type(exc).__name__}")
    problem = check_structure(tree)
    if problem:
        return ValidationResult(valid=False, rule="structure", reason=problem, source_hash=digest)
    # The checks run in the module's own process: the reward service's capability policy (no files,
    # processes, frames, heap walking or harness patching) keeps it from writing its own verdict.
    violations = check_tree(tree)
    if violations:
        return ValidationResult(valid=False, rule="policy", reason=violations[0].describe(), source_hash=digest)
    return digest


# --- the sandboxed checks ----------------------------------------------------------------------


class Validator:
    """Validates modules in sandboxed children; keeps children warm while a batch runs."""

    def __init__(
        self, options: ValidationOptions | None = None, settings: Settings | None = None, warm_children: int | None = None
    ) -> None:
        from services.children.device import resolve_device
        from services.children.layout import Layout
        from services.children.pool import ChildPool

        self.options = options or ValidationOptions()
        self.settings = settings or get_settings()
        self.device = resolve_device(self.options.device)
        timeout = self.options.timeout_s or self.settings.proposer_validation_timeout_s
        warm = self.settings.proposer_validation_warm_children if warm_children is None else warm_children
        # The reward service's device locks: validation runs never overlap a kernel being timed.
        self.layout = Layout(
            self.settings.data_dir / "proposer" / "validation", shared_locks=Layout(self.settings.data_dir / "reward").locks
        ).create()
        self.pool = ChildPool(self.settings, self.layout, self.device, timeout, warm, entry=CHILD_ENTRY)

    def __enter__(self) -> Validator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.pool.close()

    def _bound(self, given: float | None, kind: str) -> float | None:
        value = given if given is not None else getattr(self.settings, f"proposer_{kind}_ms_{self.device}")
        return value or None

    def spec(self) -> dict[str, Any]:
        o = self.options
        return {
            "min_ms": self._bound(o.min_ms, "min"),
            "max_ms": self._bound(o.max_ms, "max"),
            "near_constant_rtol": o.near_constant_rtol,
            "change_rtol": o.change_rtol,
            "nondeterminism_rtol": o.nondeterminism_rtol,
            "timed_runs": o.timed_runs,
            "gpu_timing_budget_s": o.gpu_timing_budget_s,
            "input_seeds": list(o.input_seeds),
            "weight_seeds": list(o.weight_seeds),
        }

    def dynamic(self, source: str, digest: str) -> ValidationResult:
        child = self.pool.take()
        try:
            path = child.workdir / "module.py"
            path.write_text(source)
            outcome, result = child.run({**self.spec(), "module_path": str(path)})
        finally:
            child.discard()
        common = {"source_hash": digest, "device": self.device}
        if result is None:
            stderr = outcome.stderr.decode(errors="replace").strip().splitlines()[-3:]
            details = {"stderr_tail": "\n".join(stderr)[-1500:], "isolation": outcome.isolation}
            if outcome.timed_out:
                return ValidationResult(
                    valid=False,
                    rule="timeout",
                    details=details,
                    **common,
                    reason=f"validation ran past the {self.pool.timeout_s:g} s limit and was killed",
                )
            return ValidationResult(
                valid=False,
                rule="runtime_error",
                details=details,
                **common,
                reason=f"the module's process ended without a result: {outcome.describe()}",
            )
        try:
            fields = {k: v for k, v in result.items() if k in ("valid", "reason", "rule", "graph_hash", "details")}
            verdict = ValidationResult(**fields, **common)
        except (TypeError, ValueError) as exc:
            return ValidationResult(
                valid=False,
                rule="runtime_error",
                **common,
                reason=f"the module's process returned a malformed result ({type(exc).__name__})",
            )
        if verdict.valid and not verdict.graph_hash:  # the checks always hash the graph they ran: a forged verdict
            return ValidationResult(
                valid=False,
                rule="runtime_error",
                **common,
                reason="the module's process returned a verdict the checks did not write",
            )
        verdict.details = finite(verdict.details)
        verdict.details["isolation"] = outcome.isolation
        return verdict

    def validate(self, source: str) -> ValidationResult:
        verdict = check_static(source)
        return verdict if isinstance(verdict, ValidationResult) else self.dynamic(source, verdict)

    def validate_many(
        self,
        sources: Sequence[str],
        known_hashes: Iterable[str] = (),
        parallel: int = 1,
        on_result: Callable[[int, ValidationResult], None] | None = None,
    ) -> list[ValidationResult]:
        """One verdict per source, in order. A module whose normalised source or graph equals a
        known hash or an earlier valid module of the batch is a duplicate; source duplicates are
        caught before any child runs."""
        known = set(known_hashes)
        first_source: dict[str, int] = {}
        results: list[ValidationResult | None] = [None] * len(sources)
        pending: list[tuple[int, str]] = []
        for i, source in enumerate(sources):
            verdict = check_static(source)
            if isinstance(verdict, str):
                if verdict in known:
                    verdict = _duplicate(verdict, "a known task has the same normalised source")
                elif verdict in first_source:
                    verdict = _duplicate(verdict, f"same normalised source as module #{first_source[verdict]} of this batch")
                else:
                    first_source[verdict] = i
                    pending.append((i, verdict))
                    continue
            results[i] = verdict
            if on_result:
                on_result(i, verdict)

        lock = threading.Lock()
        first_graph: dict[str, int] = {}
        done: dict[int, ValidationResult] = {}
        next_to_judge = iter([i for i, _ in pending])
        waiting = next(next_to_judge, None)

        def run_one(item: tuple[int, str]) -> None:
            nonlocal waiting
            i, digest = item
            verdict = self.dynamic(sources[i], digest)
            with lock:
                done[i] = verdict
                # Graph duplicates are judged in batch order, so "the first one wins" does not
                # depend on which child finished first.
                while waiting is not None and waiting in done:
                    j, v = waiting, done.pop(waiting)
                    graph = v.graph_hash
                    if v.valid and graph:
                        if graph in known:
                            v = _duplicate(v.source_hash, "a known task computes the same op graph", v)
                        elif graph in first_graph:
                            v = _duplicate(
                                v.source_hash,
                                f"computes the same op graph as module #{first_graph[graph]} of this batch",
                                v,
                            )
                        else:
                            first_graph[graph] = j
                    results[j] = v
                    if on_result:
                        on_result(j, v)
                    waiting = next(next_to_judge, None)

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as executor:
            list(executor.map(run_one, pending))
        return [r for r in results if r is not None]


def _duplicate(digest: str | None, why: str, ran: ValidationResult | None = None) -> ValidationResult:
    base: dict[str, Any] = ran.model_dump() if ran else {"source_hash": digest}
    return ValidationResult(**{**base, "valid": False, "rule": "duplicate", "reason": f"duplicate: {why}"})


def validate_module(source: str, options: ValidationOptions | None = None, settings: Settings | None = None) -> ValidationResult:
    with Validator(options, settings, warm_children=0) as validator:
        return validator.validate(source)


def validate_modules(
    sources: Sequence[str],
    options: ValidationOptions | None = None,
    known_hashes: Iterable[str] = (),
    settings: Settings | None = None,
    parallel: int = 1,
    on_result: Callable[[int, ValidationResult], None] | None = None,
) -> list[ValidationResult]:
    with Validator(options, settings) as validator:
        return validator.validate_many(sources, known_hashes, parallel, on_result)
