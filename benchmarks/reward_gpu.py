"""Reward-service figures on a GPU machine, in one run (device time is scarce).

    python benchmarks/reward_gpu.py --out DIR

1. timing accuracy: a 4096-element ReLU timed by harness.timing vs triton's do_bench vs a CUDA graph
2. repeatability: speedup of a ≥ 50 µs kernel over 5 full evaluations (coefficient of variation)
3. Triton candidate end to end (verify + time) on a warm evaluator: p50 wall time
4. CUDA candidate compile: cold p50 and cache-hit wall time of load_inline through reward_svc.compile
Prints a table and writes DIR/reward_gpu.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


@triton.jit
def _relu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


def timing_accuracy() -> dict:
    from services.children.timing import time_gpu

    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)

    def fn() -> None:
        _relu[(4,)](x, out, 4096, BLOCK=1024)

    ours = time_gpu(fn)["median_ms"]
    do_bench = triton.testing.do_bench(fn, return_mode="median")
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(100):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(20):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) / 100)
    naive = []
    for _ in range(100):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        naive.append(start.elapsed_time(end))
    return {
        "ours_ms": ours,
        "do_bench_ms": do_bench,
        "cuda_graph_ms": statistics.median(per_call),
        "naive_events_ms": statistics.median(naive),
        "ours_vs_do_bench": ours / do_bench,
    }


def relu_reference(numel: int) -> str:
    from reward_cases import RELU_REFERENCE

    return RELU_REFERENCE.replace("torch.randn(4, 1024)", f"torch.randn({numel})")


def repeatability(evaluator) -> dict:  # type: ignore[no-untyped-def]
    from reward_cases import CORRECT
    from services.schemas.reward import ScoreOptions

    reference = relu_reference(1 << 26)  # 256 MB in, 256 MB out: ~120 µs on an H200
    speedups, runtimes = [], []
    for _ in range(5):
        verdict = evaluator.evaluate_group(reference, [CORRECT], ScoreOptions(device="cuda", trials=2)).verdicts[0]
        assert verdict.status == "correct", verdict.reason
        speedups.append(verdict.speedup)
        runtimes.append(verdict.runtime_ms)
    return {
        "speedups": speedups,
        "runtime_ms": runtimes,
        "speedup_cv": statistics.pstdev(speedups) / statistics.fmean(speedups),
        "runtime_cv": statistics.pstdev(runtimes) / statistics.fmean(runtimes),
    }


def triton_end_to_end(evaluator) -> dict:  # type: ignore[no-untyped-def]
    from reward_cases import CORRECT, RELU_REFERENCE
    from services.schemas.reward import ScoreOptions

    # A warm worker: its pool finished warming before the first request, as for a worker that was
    # running when the jobs arrived; then requests back to back, each waiting for its verdict.
    warmed = evaluator.pool("cuda").wait_ready(timeout_s=300)
    walls, statuses = [], []
    for i in range(10):
        source = CORRECT + f"\n# variant {i}\n"  # a new source each time: no compile cache
        start = time.perf_counter()
        verdict = evaluator.evaluate_group(RELU_REFERENCE, [source], ScoreOptions(device="cuda")).verdicts[0]
        walls.append(time.perf_counter() - start)
        statuses.append(verdict.status)
    return {
        "walls_s": walls,
        "p50_s": statistics.median(walls),
        "statuses": statuses,
        "pool_warm_at_start": warmed,
        "warm_children": evaluator.pool("cuda").size,
    }


def cuda_compile(evaluator) -> dict:  # type: ignore[no-untyped-def]
    from cuda_cases import CUDA_RELU
    from reward_cases import RELU_REFERENCE
    from services.schemas.reward import ScoreOptions

    cold, hits, statuses = [], [], []
    for i in range(3):
        source = CUDA_RELU.replace("relu_ext", f"relu_ext_{i}")
        for bucket in (cold, hits):
            start = time.perf_counter()
            verdict = evaluator.evaluate_group(RELU_REFERENCE, [source], ScoreOptions(backend="cuda", device="cuda")).verdicts[0]
            bucket.append(time.perf_counter() - start)
            statuses.append((verdict.status, verdict.details.get("compile_cache_hit"), verdict.speedup))
    # The compile alone, in a plain process (what the evaluation's wall time above includes).
    script = (
        "import time,sys; from pathlib import Path; sys.path.insert(0,'tests');"
        "from reward_svc.compile import install_fast_load_inline as i; import tempfile;"
        "log=i(Path(sys.argv[1])); import torch.utils.cpp_extension as c; from cuda_cases import CUDA_RELU;"
        "src=CUDA_RELU.split('ext = load_inline')[0]; exec(src);"
        "t=time.perf_counter(); c.load_inline(name='bench_relu', cpp_sources=cpp, cuda_sources=cuda, functions=['relu_cuda']);"
        "print(log.to_json()[-1]['strategy'], file=sys.stderr); print(time.perf_counter()-t)"
    )
    cache = tempfile.mkdtemp()
    runs = [subprocess.run([sys.executable, "-c", script, cache], capture_output=True, text=True, check=True) for _ in range(2)]
    compile_only = [float(run.stdout.split()[-1]) for run in runs]
    return {
        "eval_cold_s": cold,
        "eval_hit_s": hits,
        "eval_cold_p50_s": statistics.median(cold),
        "eval_hit_p50_s": statistics.median(hits),
        "statuses": statuses,
        "load_inline_cold_s": compile_only[0],
        "load_inline_hit_s": compile_only[1],
        "load_inline_cold_strategy": runs[0].stderr.strip().splitlines()[-1] if runs[0].stderr.strip() else None,
    }


def compiled_reference(evaluator) -> dict:  # type: ignore[no-untyped-def]
    """The reference timed in eager mode and under torch.compile, in the same sandboxed child."""
    from reward_cases import CORRECT
    from services.schemas.reward import ScoreOptions

    reference = relu_reference(1 << 24)
    start = time.perf_counter()
    verdict = evaluator.evaluate_group(reference, [CORRECT], ScoreOptions(device="cuda", time_compiled=True)).verdicts[0]
    return {
        "status": verdict.status,
        "wall_s": time.perf_counter() - start,
        "ref_runtime_ms": verdict.ref_runtime_ms,
        "runtime_ms": verdict.runtime_ms,
        "speedup": verdict.speedup,
        "speedup_vs_compiled": verdict.details.get("speedup_vs_compiled"),
    }


def gpu_hacks(evaluator) -> dict:  # type: ignore[no-untyped-def]
    from reward_cases import HACKS, RELU_REFERENCE
    from services.schemas.reward import ScoreOptions
    from test_reward_gpu import SIDE_STREAM

    names = ["side_stream", "decoy_scratch_kernel", "pytorch_does_the_work_kernel_copies", "cache_by_address", "mutates_input"]
    sources = [SIDE_STREAM] + [HACKS[n][0] for n in names[1:]]
    verdicts = evaluator.evaluate_group(RELU_REFERENCE, sources, ScoreOptions(device="cuda")).verdicts
    return {
        n: {
            "status": v.status,
            "guard": v.guard,
            "reason": v.reason[:200],
            "speedup": v.speedup,
            "side_stream_work": v.details.get("timing", {}).get("side_stream_work"),
        }
        for n, v in zip(names, verdicts)
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--only", nargs="*", help="Run only these steps.")
    args = parser.parse_args()
    os.environ.setdefault("KZ_DATA_DIR", tempfile.mkdtemp(prefix="kz-bench-"))
    from reward_svc.evaluate import Evaluator
    from services.sandbox import sandbox_available

    console = Console()
    results: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sandbox": sandbox_available(),
        },
    }
    evaluator = Evaluator()
    for name, step in (
        ("timing_accuracy", lambda: timing_accuracy()),
        ("triton_end_to_end", lambda: triton_end_to_end(evaluator)),
        ("repeatability", lambda: repeatability(evaluator)),
        ("cuda_compile", lambda: cuda_compile(evaluator)),
        ("gpu_hacks", lambda: gpu_hacks(evaluator)),
        ("compiled_reference", lambda: compiled_reference(evaluator)),
    ):
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        try:
            results[name] = step()
        except Exception as exc:  # one failed figure must not cost the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        console.print(f"{name}: {time.perf_counter() - start:.1f} s", json.dumps(results[name], default=str)[:800])
        _write(args.out, results)  # after every step: a run its time limit cuts keeps the figures it has
    evaluator.close()
    table = Table(title=f"reward service on {results['machine']['gpu']}")
    table.add_column("figure"), table.add_column("measured"), table.add_column("target")
    t, r, e, c = (results.get(k, {}) for k in ("timing_accuracy", "repeatability", "triton_end_to_end", "cuda_compile"))
    table.add_row("4096 ReLU: ours / do_bench", f"{t.get('ours_vs_do_bench', float('nan')):.2f}", "within 20%")
    table.add_row("speedup CV over 5 repeats (≥50 µs kernel)", f"{r.get('speedup_cv', float('nan')):.2%}", "≤ 2%")
    table.add_row("Triton end to end p50", f"{e.get('p50_s', float('nan')):.2f} s", "≤ 3 s")
    table.add_row("CUDA load_inline cold", f"{c.get('load_inline_cold_s', float('nan')):.1f} s", "≤ 10 s")
    table.add_row("CUDA load_inline cache hit", f"{c.get('load_inline_hit_s', float('nan')):.2f} s", "≤ 0.5 s")
    console.print(table)


def _write(out: Path, results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward_gpu.json").write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
