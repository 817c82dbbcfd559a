"""How the Proposer's validation check judges real and composed modules.

  --problems DIR [DIR...]   validate every KernelBench-format file of the directories: counts per
                            rule and every failure with its reason
  --composer N              compose N modules with the programmatic composer from sampled API sets:
                            share valid, reasons for the rest, APIs and API pairs covered, proposals
                            per minute (composition plus validation)

Results go to benchmarks/results/proposer_<what>_<device>.json (with date and machine), written
again after every verdict so a long run that is stopped keeps what it measured.

KernelBench problems are sized for a GPU: on a CPU, set --max-ms generously (or 0 for no bound),
a long --timeout and a --memory-gib that leaves room for --parallel children on this machine;
--shrink CAP caps the files' module-level size constants, to check the rules on every problem's
computation at a size a CPU runs (the report says so).
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime
import itertools
import json
import operator
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proposer_svc.validate import ValidationOptions, ValidationResult, Validator  # noqa: E402
from services.config import get_settings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# Failures that say more about this machine than about the module.
RESOURCE_MARKS = ("out of memory", "time limit", "ran past", "too_slow")


def machine() -> dict[str, Any]:
    import torch

    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_avg_at_start": os.getloadavg(),
    }


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )


def resource_limited(result: ValidationResult) -> bool:
    return result.rule in ("timeout", "too_slow") or any(m in result.reason for m in RESOURCE_MARKS)


def summarise(results: list[ValidationResult]) -> dict[str, Any]:
    by_rule = collections.Counter(r.rule or "valid" for r in results)
    return {
        "total": len(results),
        "valid": by_rule.pop("valid", 0),
        "by_rule": dict(by_rule.most_common()),
        "resource_limited": sum(1 for r in results if not r.valid and resource_limited(r)),
    }


def failure_entry(name: str, result: ValidationResult) -> dict[str, Any]:
    keep = ("input_shapes", "output_shapes", "runtime_ms", "parameters", "seed_change", "parameter_change")
    return {
        "name": name,
        "rule": result.rule,
        "reason": result.reason,
        "resource_limited": resource_limited(result),
        **{k: result.details[k] for k in keep if k in result.details},
    }


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")


_OPS = {
    ast.Mult: operator.mul,
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def _int_value(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _int_value(node.left), _int_value(node.right)
        return None if left is None or right is None else _OPS[type(node.op)](left, right)
    return None


def shrink_source(source: str, cap: int, batch_cap: int) -> str:
    """The problem with its module-level size constants (ints, and tuples of ints) capped: ``batch*``
    names at ``batch_cap``, the rest at ``cap``; smaller values (kernel sizes, strides, reduction
    dims) are left alone. The computation keeps its structure at a size a CPU runs in seconds; sizes
    that were equal stay equal when both exceeded the caps (a batch that broadcasts against a
    feature dim), so the default batch cap is the cap."""
    tree = ast.parse(source)
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets)):
            continue
        limit = batch_cap if any("batch" in t.id.lower() for t in node.targets if isinstance(t, ast.Name)) else cap
        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        ints = [_int_value(v) for v in values]
        if any(i is None for i in ints):
            continue
        shrunk = [ast.Constant(min(i, limit)) for i in ints if i is not None]
        node.value = ast.Tuple(shrunk, ast.Load()) if isinstance(node.value, ast.Tuple) else shrunk[0]
    return ast.unparse(ast.fix_missing_locations(tree))


def run_problems(args: argparse.Namespace, options: ValidationOptions, validator: Validator) -> dict[str, Any]:
    files = [(d, f) for d in args.problems for f in sorted(Path(d).glob("*.py"), key=_problem_order)]
    report: dict[str, Any] = {
        "what": "KernelBench-format directories",
        "machine": machine(),
        "device": validator.device,
        "options": asdict(options),
        "memory_limit_bytes": validator.settings.sandbox_memory_bytes,
        "parallel": args.parallel,
        "directories": {},
        "failures": [],
        "shrunk": {"cap": args.shrink, "batch_cap": args.shrink_batch or args.shrink} if args.shrink else None,
    }
    suffix = "_shrunk" if args.shrink else ""
    out = args.out or RESULTS / f"proposer_validation_kernelbench_{validator.device}{suffix}.json"
    sources = [f.read_text() for _, f in files]
    if args.shrink:
        sources = [shrink_source(s, args.shrink, args.shrink_batch or args.shrink) for s in sources]
    results: dict[int, ValidationResult] = {}
    started = time.monotonic()
    with progress() as bar:
        task = bar.add_task("validating", total=len(files), last="")

        def on_result(i: int, result: ValidationResult) -> None:
            results[i] = result
            bar.update(task, advance=1, last=f"{files[i][1].name[:40]}: {result.rule or 'valid'}")
            report["wall_s"] = time.monotonic() - started
            _fill_problem_report(report, files, results)
            write(out, report)

        # Each file on its own: KernelBench problems are distinct tasks, and source-identical
        # problems across levels would otherwise be reported as duplicates of each other.
        if args.dedupe:
            validator.validate_many(sources, parallel=args.parallel, on_result=on_result)
        else:
            _validate_each(validator, sources, args.parallel, on_result)
    report["wall_s"] = time.monotonic() - started
    _fill_problem_report(report, files, results)
    write(out, report)
    return report


def _validate_each(validator: Validator, sources: list[str], parallel: int, on_result: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> None:
        on_result(i, validator.validate(sources[i]))

    with ThreadPoolExecutor(max_workers=parallel) as executor:
        list(executor.map(one, range(len(sources))))


def _problem_order(path: Path) -> tuple[int, str]:
    head = path.name.split("_", 1)[0]
    return (int(head) if head.isdigit() else 10**9, path.name)


def _fill_problem_report(report: dict[str, Any], files: list[tuple[str, Path]], results: dict[int, ValidationResult]) -> None:
    for directory in dict.fromkeys(d for d, _ in files):
        mine = [results[i] for i, (d, _) in enumerate(files) if d == directory and i in results]
        report["directories"][directory] = summarise(mine)
    report["overall"] = summarise(list(results.values()))
    report["failures"] = [
        failure_entry(f"{Path(d).name}/{f.name}", results[i])
        for i, (d, f) in enumerate(files)
        if i in results and not results[i].valid
    ]


def run_composer(args: argparse.Namespace, options: ValidationOptions, validator: Validator) -> dict[str, Any]:
    import random

    from proposer_svc.catalog import CATALOG
    from proposer_svc.compose.base import ProposalHints
    from proposer_svc.compose.programmatic import ProgrammaticComposer
    from proposer_svc.mining import default_corpus, mine
    from proposer_svc.sampling import sample_api_set
    from services.outcomes import Declined

    settings = validator.settings
    out = args.out or RESULTS / f"proposer_validation_composer_{validator.device}.json"
    report: dict[str, Any] = {
        "what": f"{args.composer} modules from the programmatic composer",
        "machine": machine(),
        "device": validator.device,
        "options": asdict(options),
        "parallel": args.parallel,
        "api_set_size": settings.proposer_api_set_size,
        "temperature": settings.proposer_sample_temperature,
    }
    t0 = time.monotonic()
    stats = mine(default_corpus()).stats  # the default corpus, in memory: the benchmark touches no database
    report["mining_s"] = time.monotonic() - t0
    report["catalog_apis"] = len(CATALOG)
    composer = ProgrammaticComposer()
    declined: collections.Counter[str] = collections.Counter()
    results: list[tuple[Any, ValidationResult]] = []
    started = time.monotonic()
    compose_s = 0.0
    seed = args.seed
    with progress() as bar:
        task = bar.add_task("compose+validate", total=args.composer, last="")
        while len(results) < args.composer:
            batch = []
            while len(batch) < min(args.batch, args.composer - len(results)):
                t0 = time.monotonic()
                rng = random.Random(seed)
                api_set = sample_api_set(
                    stats, CATALOG, settings.proposer_api_set_size, rng, temperature=settings.proposer_sample_temperature
                )
                try:
                    batch.append(composer.compose(api_set, ProposalHints(seed=seed)))
                except Declined as exc:
                    declined[str(exc)[:100]] += 1
                compose_s += time.monotonic() - t0
                seed += 1
            known = {r.graph_hash for _, r in results if r.valid and r.graph_hash} | {
                r.source_hash for _, r in results if r.valid
            }

            def on_result(i: int, result: ValidationResult, batch: list[Any] = batch) -> None:
                bar.update(task, advance=1, last=f"{'+'.join(batch[i].api_set)[:50]}: {result.rule or 'valid'}")

            verdicts = validator.validate_many(
                [m.source for m in batch], known_hashes=known, parallel=args.parallel, on_result=on_result
            )
            results.extend(zip(batch, verdicts))
            report.update(_composer_summary(results, declined, time.monotonic() - started, compose_s))
            write(out, report)
    return report


def _composer_summary(
    results: list[tuple[Any, ValidationResult]], declined: collections.Counter[str], wall_s: float, compose_s: float
) -> dict[str, Any]:
    valid = [m for m, r in results if r.valid]
    apis = {a for m in valid for a in m.api_set}
    pairs = {p for m in valid for p in itertools.combinations(sorted(set(m.api_set)), 2)}
    reasons = collections.Counter(f"{r.rule}: {r.reason[:120]}" for _, r in results if not r.valid)
    return {
        **summarise([r for _, r in results]),
        "share_valid": len(valid) / len(results) if results else 0.0,
        "declined_by_composer": dict(declined.most_common()),
        "distinct_apis_valid": len(apis),
        "distinct_api_pairs_valid": len(pairs),
        "distinct_apis_all": len({a for m, _ in results for a in m.api_set}),
        "wall_s": wall_s,
        "compose_s": compose_s,
        "proposals_per_minute": 60 * len(results) / wall_s if wall_s else None,
        "valid_per_minute": 60 * len(valid) / wall_s if wall_s else None,
        "median_runtime_ms": _median([r.details.get("runtime_ms") for _, r in results if r.valid]),
        "failure_reasons": dict(reasons.most_common(30)),
        "failures": [
            {"api_set": m.api_set, "rule": r.rule, "reason": r.reason, "source": m.source} for m, r in results if not r.valid
        ][:40],
    }


def _median(values: list[Any]) -> float | None:
    import statistics

    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--problems", nargs="+", metavar="DIR")
    what.add_argument("--composer", type=int, metavar="N")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--min-ms", type=float, default=None, help="runtime lower bound (default: the device's setting; 0: none)")
    parser.add_argument("--max-ms", type=float, default=None, help="runtime upper bound (default: the device's setting; 0: none)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per module (default: the setting)")
    parser.add_argument("--memory-gib", type=float, default=None, help="address-space limit per CPU child")
    parser.add_argument("--parallel", type=int, default=1, help="children at once")
    parser.add_argument("--dedupe", action="store_true", help="--problems: also report duplicates among the files")
    parser.add_argument("--seed", type=int, default=0, help="--composer: first seed")
    parser.add_argument("--batch", type=int, default=50, help="--composer: modules validated per batch")
    parser.add_argument(
        "--shrink",
        type=int,
        default=0,
        metavar="CAP",
        help="--problems: cap the module-level size constants at CAP (0: run the files as they are)",
    )
    parser.add_argument("--shrink-batch", type=int, default=None, help="--shrink: cap of batch* constants (default: CAP)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    settings = get_settings()
    if args.memory_gib:
        settings = settings.model_copy(update={"sandbox_memory_bytes": int(args.memory_gib * (1 << 30))})
    options = ValidationOptions(device=args.device, min_ms=args.min_ms, max_ms=args.max_ms, timeout_s=args.timeout)
    with Validator(options, settings, warm_children=args.parallel) as validator:
        report = run_problems(args, options, validator) if args.problems else run_composer(args, options, validator)
    shown = {k: v for k, v in report.items() if k not in ("failures", "machine", "options")}
    print(json.dumps(shown, indent=1, default=str))


if __name__ == "__main__":
    main()
