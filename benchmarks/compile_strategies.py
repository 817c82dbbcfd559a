"""Compile time of a KernelBench-style load_inline kernel under each strategy of reward_svc.compile.

The kernel is the KernelBench example (elementwise add): ``cpp_sources`` holds the declaration,
``cuda_sources`` starts with ``#include <torch/extension.h>``. Each row compiles one unit
(``main.cpp`` with the host compiler, ``cuda.cu`` with ``nvcc -c``) at one header tier, so the
rows say where the time goes; the end-to-end rows go through ``install_fast_load_inline``.

- header tiers (``original``/``light``/``minimal``: see reward_svc/compile.py);
- torch's default arch flags (compute_90 PTX + sm_90) against our single ``sm_90`` target;
- the bindings unit against its precompiled header, and the CUDA unit's final host compile against
  its precompiled host prefix (``compile.build_precompiled_headers``; torch's own ``use_pch`` writes
  its .gch into site-packages, read-only in the sandbox);
- the two units one after the other against in parallel, ``--repeat`` misses with the precompiled
  headers built (the p50 is the issue's cold ``load_inline`` figure), then a cache hit;
- with ``--kernelbench PATH`` (a KernelBench checkout), the CUDA unit of every ``load_inline`` call in
  its prompts' examples and unit-test kernels at its first tier, without and with the host prefix:
  which take it, and what it saves.

With ``--gpu`` (on the GPU machine) it also times stock ``load_inline`` and our full path
(compile + link + import + call, checked against torch), and a cache hit in a fresh process.

Usage: .venv/bin/python benchmarks/compile_strategies.py [--gpu] [--skip-original] [--repeat N] [--kernelbench PATH]
Writes benchmarks/results/compile_strategies_{cpu,gpu}.json. Each original-tier compile takes
1-2 minutes on a 2-core machine: run it rarely.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cuda_cases import ELEMENTWISE_ADD_CPP as CPP_SOURCE  # noqa: E402
from cuda_cases import ELEMENTWISE_ADD_CUDA as CUDA_SOURCE  # noqa: E402
from reward_svc import compile as kzc  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "elementwise_add"
LOAD_KWARGS: dict[str, Any] = dict(
    name=NAME,
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["elementwise_add_cuda"],
    verbose=False,
    extra_cflags=[""],
    extra_ldflags=[""],
)
TORCH_DEFAULT_ARCH = ("-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90")


@dataclasses.dataclass
class Row:
    group: str
    variant: str
    seconds: float
    ok: bool
    note: str = ""


def request() -> kzc.InlineRequest:
    return kzc.make_request(NAME, CPP_SOURCE, CUDA_SOURCE, ["elementwise_add_cuda"], [""], None, [""])


def unit_rows(toolchain: kzc.Toolchain, tiers: list[str], work: Path) -> list[Row]:
    """One compile per (unit, tier): where the time goes."""
    rows = []
    for tier in tiers:
        for cuda in (True, False):
            attempt = kzc.compile_unit(request(), toolchain, tier, work, cuda=cuda)
            unit = "cuda.cu (nvcc -c)" if cuda else "main.cpp (c++ -c)"
            rows.append(Row(unit, f"tier {tier}", attempt.seconds, attempt.ok, attempt.stderr[-200:] if not attempt.ok else ""))
    return rows


def arch_row(toolchain: kzc.Toolchain, work: Path) -> Row:
    """The minimal .cu with torch's default 9.0+PTX flags, to set against our single target."""
    torch_arch = dataclasses.replace(toolchain, arch_flags=TORCH_DEFAULT_ARCH)
    attempt = kzc.compile_unit(request(), torch_arch, "minimal", work, cuda=True)
    return Row("cuda.cu (nvcc -c)", "tier minimal, torch arch flags (sm_90 + PTX)", attempt.seconds, attempt.ok)


def pch_rows(toolchain: kzc.Toolchain, work: Path, *, compile_only: bool) -> list[Row]:
    """The precompiled headers (compile.build_precompiled_headers, what a GPU worker builds once): the bindings
    base, then main.cpp at the lean tier against it; the CUDA host prefix, then cuda.cu at the lean tier from it."""
    rows = []
    units = [("main.cpp (c++ -c)", False, [(True, ())], []), ("cuda.cu (nvcc -c)", True, [], kzc.HOST_PREFIX_VARIANTS)]
    for unit, cuda, bindings, hosts in units:
        started = time.perf_counter()
        built = kzc.build_precompiled_headers(work / "pch", compile_only=compile_only, bindings=bindings, cuda_hosts=hosts)
        built_s = time.perf_counter() - started
        size_mb = sum(p.stat().st_size for d in built for p in d.glob("*.gch")) / 2**20
        os.environ[kzc.PRECOMPILED_HEADERS_ENV] = str(work / "pch")
        try:
            attempt = kzc.compile_unit(request(), toolchain, "lean", work, cuda=cuda)
        finally:
            del os.environ[kzc.PRECOMPILED_HEADERS_ENV]
        kind = f"CUDA host prefix, {len(hosts)} sets of flags" if cuda else "bindings base"
        rows.append(Row(unit, f"PCH build ({kind}, once per machine)", built_s, bool(built), f"{size_mb:.0f} MiB .gch"))
        rows.append(Row(unit, "tier lean + PCH", attempt.seconds, attempt.ok and attempt.pch))
    return rows


def end_to_end_rows(cache: Path, *, compile_only: bool, pch_dir: Path | None = None, repeat: int = 1) -> list[Row]:
    """Through the drop-in: a miss with the two units serial, a miss in parallel, ``repeat`` misses where a worker
    built the precompiled headers and their median, then a hit."""
    rows = []
    builder = kzc.Builder(cache / "serial", compile_only=compile_only)
    serial = dataclasses.replace(kzc.choose_plan(request(), builder.toolchain), parallel=False)
    builder.load(request(), serial)
    entry = builder.log.entries[-1]
    rows.append(Row("end to end", "miss, units one after the other", entry.seconds, entry.ok, entry.strategy))
    log = kzc.install_fast_load_inline(cache / "parallel", compile_only=compile_only)
    from torch.utils.cpp_extension import load_inline

    module = load_inline(**LOAD_KWARGS)
    rows.append(
        Row("end to end", "miss, default plan (parallel)", log.entries[-1].seconds, log.entries[-1].ok, log.entries[-1].strategy)
    )
    if not compile_only:
        rows.append(call_row(module))
    if pch_dir is not None:  # the same miss where a worker built the headers (another cache each: a miss again)
        os.environ[kzc.PRECOMPILED_HEADERS_ENV] = str(pch_dir)
        seconds, oks = [], []
        try:
            for run in range(repeat):
                with_pch = kzc.install_fast_load_inline(cache / f"with-pch-{run}", compile_only=compile_only)
                from torch.utils.cpp_extension import load_inline as load_with_pch

                load_with_pch(**LOAD_KWARGS)
                entry = with_pch.entries[-1]
                seconds.append(entry.seconds)
                oks.append(entry.ok)
                variant = f"miss, default plan, precompiled headers built (run {run + 1})"
                rows.append(Row("end to end", variant, entry.seconds, entry.ok, entry.strategy))
        finally:
            del os.environ[kzc.PRECOMPILED_HEADERS_ENV]
        rows.append(Row("end to end", f"miss with precompiled headers, p50 of {repeat}", statistics.median(seconds), all(oks)))
    load_inline(**LOAD_KWARGS)  # the drop-in installed first, its cache now warm
    rows.append(Row("end to end", "hit, same process", log.entries[-1].seconds, log.entries[-1].cache_hit))
    rows.append(fresh_process_hit_row(cache / "parallel", compile_only=compile_only))
    return rows


def kernelbench_rows(checkout: Path, toolchain: kzc.Toolchain, work: Path, pch_dir: Path) -> list[Row]:
    """Each CUDA ``load_inline`` call of KernelBench's examples and test kernels (recorded by running the files with
    ``load_inline`` stubbed out): its ``cuda.cu`` at its first tier, without then with the precompiled headers."""
    import inspect
    import runpy

    import torch.utils.cpp_extension as cpp_extension

    calls: list[tuple[str, dict[str, Any]]] = []
    original = cpp_extension.load_inline
    signature = inspect.signature(original)
    sources = sorted(checkout.glob("src/kernelbench/prompts/**/*.py")) + sorted(
        checkout.glob("src/kernelbench/unit_tests/**/*.py")
    )
    for path in sources:
        if "load_inline" not in path.read_text() or "hip" in path.name or "thunderkittens" in path.name:
            continue

        def record(*args: Any, _file: str = path.name, **kwargs: Any) -> None:
            calls.append((_file, dict(signature.bind(*args, **kwargs).arguments)))

        cpp_extension.load_inline = record
        try:
            runpy.run_path(str(path))
        except Exception as error:  # a template with placeholders, or a file that needs a GPU past its load_inline
            print(f"{path.name}: {type(error).__name__}")
        finally:
            cpp_extension.load_inline = original
    rows = []
    for index, (file, call) in enumerate(calls):
        if not call.get("cuda_sources"):
            continue
        request = kzc.make_request(
            call["name"],
            call.get("cpp_sources", ""),
            call.get("cuda_sources"),
            call.get("functions"),
            call.get("extra_cflags"),
            call.get("extra_cuda_cflags"),
            call.get("extra_ldflags"),
            call.get("extra_include_paths"),
        )
        tier = kzc.choose_plan(request, toolchain).cuda_tiers[0]
        for with_headers in (False, True):
            unit_work = work / f"kernelbench-{index}-{with_headers}"
            unit_work.mkdir()
            if with_headers:
                os.environ[kzc.PRECOMPILED_HEADERS_ENV] = str(pch_dir)
            try:
                attempt = kzc.compile_unit(request, toolchain, tier, unit_work, cuda=True)
            finally:
                os.environ.pop(kzc.PRECOMPILED_HEADERS_ENV, None)
            variant = f"KernelBench {file}:{call['name']}, {'with the host prefix' if with_headers else 'without'}"
            note = f"{attempt.describe()} flags={list(request.extra_cuda_cflags)}"
            rows.append(Row("cuda.cu (nvcc -c)", variant, attempt.seconds, attempt.ok, note))
    return rows


def call_row(module: Any) -> Row:
    import torch

    a, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    started = time.perf_counter()
    out = module.elementwise_add_cuda(a, b)
    torch.cuda.synchronize()
    ok = bool(torch.allclose(out, a + b))
    return Row("end to end", "first call, checked against a + b", time.perf_counter() - started, ok)


def fresh_process_hit_row(cache: Path, *, compile_only: bool) -> Row:
    """A hit as the sandboxed child sees it: new process, torch imported, CUDA initialised."""
    script = (
        "import json, sys, time, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from reward_svc.compile import install_fast_load_inline\n"
        f"{'' if compile_only else 'torch.cuda.init()'}\n"
        f"log = install_fast_load_inline({str(cache)!r}, compile_only={compile_only})\n"
        "from torch.utils.cpp_extension import load_inline\n"
        f"load_inline(**{LOAD_KWARGS!r})\n"
        "e = log.entries[-1]\n"
        "print(json.dumps([e.seconds, e.cache_hit]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if out.returncode != 0:
        return Row("end to end", "hit, fresh process", 0.0, False, out.stderr[-200:])
    seconds, hit = json.loads(out.stdout.strip().splitlines()[-1])
    return Row("end to end", "hit, fresh process (load_inline call only)", seconds, hit)


def stock_row(work: Path) -> Row:
    """Stock torch load_inline, fresh build directory: the 50 s this module exists to avoid."""
    import torch
    from torch.utils.cpp_extension import load_inline

    build_dir = work / "stock"
    build_dir.mkdir()
    started = time.perf_counter()
    module = load_inline(**{**LOAD_KWARGS, "build_directory": str(build_dir)})
    a = torch.randn(1024, device="cuda")
    ok = bool(torch.allclose(module.elementwise_add_cuda(a, a), a + a))
    return Row("end to end", "stock torch load_inline (compile+link+load+call)", time.perf_counter() - started, ok)


def machine() -> dict[str, Any]:
    import torch

    toolchain = kzc.detect_toolchain(Path(tempfile.gettempdir()), compile_only=True, arch=None)
    info = {
        "hostname": socket.gethostname(),
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cxx": toolchain.cxx_version,
        "nvcc": toolchain.nvcc_version,
        "cuda_library_headers": "stubbed (compile-only)" if toolchain.stub_include else "toolkit",
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def show(rows: list[Row]) -> None:
    table = Table(title="load_inline compile strategies (seconds, wall)")
    for column in ("what", "variant", "seconds", "ok", "note"):
        table.add_column(column, justify="right" if column == "seconds" else "left")
    for row in rows:
        table.add_row(row.group, row.variant, f"{row.seconds:.2f}", "yes" if row.ok else "NO", row.note)
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="also link, load and call, and time stock load_inline")
    parser.add_argument("--skip-original", action="store_true", help="skip the slow original-tier unit compiles")
    parser.add_argument("--kernelbench", type=Path, help="a KernelBench checkout: its CUDA examples with and without the prefix")
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        choices=range(1, 101),
        metavar="N",
        help="misses timed with the precompiled headers (p50)",
    )
    args = parser.parse_args()
    info = machine()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kz-compile-bench-") as tmp:
        work = Path(tmp)
        toolchain = kzc.Builder(work / "probe", compile_only=not args.gpu).toolchain
        tiers = ["lean", "minimal", "light"] + ([] if args.skip_original else ["original"])
        rows += unit_rows(toolchain, tiers, work)
        rows.append(arch_row(toolchain, work))
        rows += pch_rows(toolchain, work, compile_only=not args.gpu)
        if args.gpu:
            rows.append(stock_row(work))
        rows += end_to_end_rows(work / "cache", compile_only=not args.gpu, pch_dir=work / "pch", repeat=args.repeat)
        if args.kernelbench:
            rows += kernelbench_rows(args.kernelbench, toolchain, work, work / "pch")
    show(rows)
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "load_average_at_end": os.getloadavg(),
        "kernel": "KernelBench elementwise_add (torch/extension.h in cuda_sources)",
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"compile_strategies_{'gpu' if args.gpu else 'cpu'}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
