"""Where one candidate's device time goes, with nothing else on the device: the reference's run, then
the candidate's whole harness run (warm-ups, trials, knockout, refresh, recall, timing), each problem
in a process of its own under ``torch.profiler``: the device time by kernel (the harness's clones,
fingerprints and NaN fills beside the candidate's kernels and PyTorch's), against each side's phases
in wall seconds. The throughput runs show a candidate holding the device lock shared for about 2 s;
this says how much of that is device work, and whose.

Not sandboxed: the harness runs in plain processes (trusted template candidates, a benchmark). No
judge runs, so outputs are written and left; their comparison is the throughput run's business.

    python benchmarks/trial_profile.py run --problems .device/KernelBench/level2 --candidates .device/cands_l2 \\
        --only 14_ --only 16_ --out gpu-results/trial_profile.json
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

from reward_svc.evaluate import choose_knockout_case
from reward_svc.protocol import CandidateSpec, ReferenceSpec

app = typer.Typer(add_completion=False)
TOP_KERNELS = 15


def _profiled_run(reference: Path, candidate: Path, device: str, workdir: Path) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from reward_svc.harness.candidate import run_candidate
    from reward_svc.harness.child import warm_up
    from reward_svc.harness.reference import run_reference
    from services.children.report import AUDIT_LOG

    warm_up(device)  # as a pool child is before its job: Triton's stubs, cuBLAS and cuDNN are loaded outside the profile
    weights = secrets.randbelow(2**30)
    ref_dir, cand_dir = workdir / "reference", workdir / "candidate"
    ref_dir.mkdir()
    cand_dir.mkdir()
    common = {"device": device, "weight_seeds": [weights, weights + 1], "time": device == "cuda", "timing_budget_s": 10.0}
    ref_spec: ReferenceSpec = {
        **common,  # type: ignore[typeddict-item]
        "role": "reference",
        "reference_path": str(reference),
        "trials": 3,
        "input_seed": secrets.randbelow(2**30),
        "time_compiled": False,
        "exchange_max_bytes": 1 << 40,
        "atol": None,
        "rtol": None,
        "scratch_min_free_bytes": 0,
    }
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sides: dict[str, Any] = {}
    with profile(activities=activities) as reference_profile:
        ref_result = run_reference(ref_spec, ref_dir)
    sides["reference"] = {k: ref_result.get(k) for k in ("status", "reason", "phases")}
    if ref_result.get("status") != "ok":
        return {"sides": sides}
    knockout_case, copies_are_work = choose_knockout_case(ref_result)
    cand_spec: CandidateSpec = {
        **common,  # type: ignore[typeddict-item]
        "role": "candidate",
        "candidate_path": str(candidate),
        "backend": "triton",
        "trials": ref_result["cases"],
        "exchange_dir": str(ref_dir / "exchange"),
        "compile_cache": str(cand_dir / "build"),
        "compile_cache_readonly": False,
        "fingerprint_key": secrets.randbits(62),
        "outputs_in_flight": 0,  # no judge takes them: never wait for one
        "knockout_case": knockout_case,
        "copies_are_work": copies_are_work,
    }
    with profile(activities=activities) as candidate_profile:
        cand_result = run_candidate(cand_spec, cand_dir)
    sides["candidate"] = {k: cand_result.get(k) for k in ("status", "reason", "phases", "trial_holds")}
    refused = (cand_dir / AUDIT_LOG).read_text().splitlines() if (cand_dir / AUDIT_LOG).exists() else []
    if refused:  # what the audit hook refused, and where: a harness run here that a pool child would pass
        sides["candidate"]["audit"] = refused[:5]
    for side, profiled in (("reference", reference_profile), ("candidate", candidate_profile)):
        sides[side].update(_kernels(profiled, device))
    if device == "cuda":
        sides["candidate"]["device_peak_gb"] = round(torch.cuda.max_memory_reserved() / 1e9, 2)
    return {"sides": sides}


def _kernels(profiled: Any, device: str) -> dict[str, Any]:
    """The ops' self time on the device (the CPU's where there is none), the largest first; on a GPU also
    the host's (a build on the CPU, a synchronize waiting for the device: host time inside a device hold)."""
    events = profiled.key_averages()

    def top(clock: str) -> tuple[float, list[dict[str, Any]]]:
        timed = [(e.key, getattr(e, f"self_{clock}_time_total"), e.count) for e in events]
        timed = sorted((row for row in timed if row[1] > 0), key=lambda row: -row[1])
        rows = [{"op": key[:120], "ms": round(us / 1e3, 3), "calls": count} for key, us, count in timed[:TOP_KERNELS]]
        return round(sum(us for _, us, _ in timed) / 1e3, 3), rows

    total_ms, rows = top("device" if device == "cuda" else "cpu")
    report: dict[str, Any] = {"clock": "device" if device == "cuda" else "cpu", "total_ms": total_ms, "top": rows}
    if device == "cuda":
        report["host_total_ms"], report["host_top"] = top("cpu")
    return report


@app.command()
def one(reference: Path, candidate: Path, workdir: Path, device: str = "cuda") -> None:
    """One problem, in this process, its files in ``workdir`` (the harness's audit hook, armed once the candidate
    is imported, refuses their removal here): its JSON on stdout's last line."""
    print(json.dumps(_profiled_run(reference.resolve(), candidate.resolve(), device, workdir.resolve())))


@app.command()
def run(
    problems: Path = typer.Option(..., help="KernelBench level dir (the references)"),
    candidates: Path = typer.Option(..., help="the template candidates, one file per problem, named as it"),
    only: list[str] = typer.Option(..., help="problem file name prefixes, e.g. 14_ (repeat)"),
    device: str = "cuda",
    out: Path = typer.Option(Path("trial_profile.json")),
) -> None:
    """Each problem named in a fresh process (nothing warm carried from one to the next); the report as JSON."""
    rows = []
    for prefix in only:
        for reference in sorted(problems.glob(f"{prefix}*.py")):
            with tempfile.TemporaryDirectory(prefix="kz-trial-profile-") as workdir:
                script, candidate = Path(__file__).resolve(), (candidates / reference.name).resolve()
                command = [sys.executable, str(script), "one", str(reference.resolve()), str(candidate), workdir]
                command += ["--device", device]
                # as a pool child's: its own Triton cache (the stubs built there, not in the home dir)
                env = {**os.environ, "TRITON_CACHE_DIR": str(Path(workdir) / "triton")}
                if device == "cpu":
                    env["TRITON_INTERPRET"] = "1"
                # in the work dir, as a pool child: Triton builds its launchers in the cwd
                done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=workdir)
            lines = done.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr[-2000:]}
            rows.append({"problem": reference.name, **row})
            sides = row.get("sides", {})
            summary = {side: (s.get("total_ms"), (s.get("phases") or {}).get("trials")) for side, s in sides.items()}
            print(f"{reference.name}: {summary or row.get('error', '')[-300:]}", flush=True)
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device": device, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    app()
