#!/usr/bin/env bash
# A few rounds of the alternating loop's Coder half on this machine's GPU, through the real platform
# (`kernelzero up`: Redis, the four services and their workers; the reward worker on GPU 0, the Coder
# serving a tiny model with the hf backend on the GPU), as the README's CPU loop does on a CPU. Each
# round's record splits its wall time (propose, generate, train, publish) and its generation jobs'
# time (sampling, scoring); `summary.json` under OUT_DIR gathers them.
#
#     source benchmarks/gpu_env.sh && bash benchmarks/loop_gpu.sh OUT_DIR [ROUNDS]
#     KZ_DATA_DIR=/tmp/kz LOOP_DEVICE=cpu bash benchmarks/loop_gpu.sh /tmp/loop 2   # the same on a CPU
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$1
rounds=${2:-4}
device=${LOOP_DEVICE:-cuda}
mkdir -p "$out"
model=$KZ_DATA_DIR/tiny-coder

python3 -m kernelzero train tiny-model "$model" --module tests/kernels/relu/reference.py \
    --kernel tests/kernels/relu/triton_correct.py --device "$device" 2>&1 | tee "$out/tiny_model.log"

source benchmarks/platform.sh
platform_up "$out/up.log" "$device" KZ_CODER_MODEL_BACKEND=hf KZ_CODER_HF_MODEL_PATH="$model"

cat > "$out/loop.yaml" <<YAML
coder: {model_path: $model, group_size: 8, groups_per_step: 1, learning_rate: 0.005}
rounds: $rounds
coder_steps: 1
model_backend: hf
device: $device
max_tokens: 64
scoring_timeout_s: 120
YAML
python3 -m kernelzero train run --config "$out/loop.yaml" 2>&1 | tee "$out/train.log"
run_dir=$(grep -o 'curves in [^ ]*curves\.png' "$out/train.log" | tail -1 | sed 's/curves in //; s/curves\.png$//')
cp "$run_dir/records.jsonl" "$run_dir/curves.png" "$out/"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rounds = [r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines()) if r.get("kind") == "round"]
rows = [
    {"round": r["round"], **{f"{k}_s": round(v, 3) for k, v in r["seconds"].items()},
     **{f"job_{k}_s": round(v, 3) for k, v in r.get("generation_job_seconds", {}).items()},
     **{k: r.get(k) for k in ("pass_rate", "step_seconds", "tokens_per_second", "published")}}
    for r in rounds
]
(out / "summary.json").write_text(json.dumps(rows, indent=1))
for row in rows:
    print(row)
PY
