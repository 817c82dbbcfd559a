#!/usr/bin/env bash
# Wall seconds of a single `kernelzero score` of the Triton ReLU (tests/kernels/relu), each a fresh CLI
# process: N runs in this process's own sandboxes (children started for the run), then N with --service
# on the running platform's warm reward worker (`kernelzero up`, started here). OUT_DIR/score_latency.json
# has each run's seconds and status, and the medians; the script exits 1 where the statuses differ, or
# (set -e) at the first run that ends without a verdict.
#
#     source benchmarks/gpu_env.sh && bash benchmarks/score_latency.sh OUT_DIR [N]      # on the GPU
#     PATH=$PWD/.venv/bin:$PATH KZ_DATA_DIR=/tmp/kz-latency SCORE_DEVICE=cpu bash benchmarks/score_latency.sh /tmp/latency 3
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$1
runs=${2:-3}
device=${SCORE_DEVICE:-cuda}
mkdir -p "$out"

score() {  # score MODE RUN [--service]: one timed CLI run, its verdict in OUT_DIR/MODE_RUN.json
    local mode=$1 run=$2 started
    shift 2
    # a source of its own per run: the service answers a pair it has scored with that job, unevaluated
    { cat tests/kernels/relu/triton_correct.py; echo "# score_latency $mode $run $(date +%s.%N)"; } > "$out/${mode}_$run.py"
    started=$(date +%s.%N)
    python3 -m kernelzero score --reference tests/kernels/relu/reference.py --candidate "$out/${mode}_$run.py" \
        --backend triton --device "$device" --json "$@" > "$out/${mode}_$run.json"
    python3 -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 3))' "$started" > "$out/${mode}_$run.seconds"
    echo "score_latency: $mode run $run: $(cat "$out/${mode}_$run.seconds") s, $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["status"])' "$out/${mode}_$run.json")"
}

for run in $(seq "$runs"); do score in_process "$run"; done
source benchmarks/platform.sh
platform_up "$out/up.log" "$device"
score service 0 --service  # the first reaches a worker that has not scored yet (its Triton cache cold): not counted
for run in $(seq "$runs"); do score service "$run" --service; done

python3 - "$out" "$runs" "$device" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, os, platform, statistics, sys
from datetime import UTC, datetime
from pathlib import Path

out, runs, device, commit = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = {
    mode: [
        {"seconds": float((out / f"{mode}_{run}.seconds").read_text()), "status": json.loads((out / f"{mode}_{run}.json").read_text())["status"]}
        for run in range(1, runs + 1)
    ]
    for mode in ("in_process", "service")
}
report = {
    "date": datetime.now(UTC).isoformat(timespec="seconds"),
    "commit": commit,
    "machine": {"host": platform.node(), "cpus": os.cpu_count()},
    "device": device,
    "runs": runs,
    "median_s": {mode: statistics.median(r["seconds"] for r in rows[mode]) for mode in rows},
    "statuses_agree": len({r["status"] for mode in rows for r in rows[mode]}) == 1,
    "rows": rows,
}
(out / "score_latency.json").write_text(json.dumps(report, indent=1))
print(json.dumps({k: v for k, v in report.items() if k != "rows"}))
sys.exit(0 if report["statuses_agree"] else 1)
PY
