#!/usr/bin/env bash
# The GPU runs the reward service's and the Coder's figures come from, as steps of one device call
# (device time is scarce: put the steps that belong together into one call). On the device
# machine, in the repo root, with .whl (benchmarks/gpu_wheels.sh) and a KernelBench checkout
# carried; results go under $OUT (the device tool's return folder) or ./gpu-results.
#
#     bash benchmarks/gpu_run.sh tests throughput:1 throughput:4 kernelbench:4 eval:1
#     bash benchmarks/gpu_run.sh tests@150 throughput:4@240     # step@SECONDS: that step's time limit
#
# Steps:
#   tests[:EXPR]   pytest -m gpu (the GPU path: kernels verified and timed, GPU-only hacks), -k EXPR
#   throughput:G   ours on the 24 level-2 problems, groups of G (template candidates in $CANDIDATES)
#   exchange_ab:G  throughput with the device exchange off, then on (half the step's limit each, on emptied state dirs,
#                  replayable seeds $SEED), then benchmarks/verdict_equality.py on the two runs' rows
#   verdicts:G     every group's verdicts with replayable seeds $SEED, over as many calls as it takes: resumes from the
#                  rows of earlier calls in $VERDICTS_FROM (carried); one side per set (KZ_REWARD_DEVICE_EXCHANGE as set)
#   kernelbench:G  KernelBench's eval script on the same problems' variant 1 of G (their per-sample rate)
#   eval:LEVELS    kernelzero eval of the template backend (resumes from $EVAL_RESUME)
#   compile[:N]    benchmarks/compile_strategies.py --gpu: the cold load_inline by header tier, with the precompiled headers
#                  (N misses, default 5: the p50), and KernelBench's CUDA examples (in $KB/src) with and without them
#   reward[:STEPS] benchmarks/reward_gpu.py (timing accuracy, repeatability, compile and end-to-end); STEPS: a
#                  comma-separated few of its steps (timing_accuracy,repeatability,cuda_compile,...)
#   trainer_step   benchmarks/trainer_step.py: our policy step against TRL's GRPOTrainer, a 0.5B Qwen2, one batch,
#                  the sides timed in turns, then one profiled step each (trainer_step_profile.txt: top kernels
#                  by self CUDA time per side, and the kernels whose time differs most between them)
#   score[:N]      `kernelzero score` of the Triton ReLU in tests/kernels, N times in a row (the first
#                  on a cold Triton cache), each a fresh process: wall seconds and the verdict's phases
#   score_latency[:N]  benchmarks/score_latency.sh: N single scores of the ReLU in the CLI's own sandboxes, then N with
#                  --service on `kernelzero up`'s warm reward worker (needs gpu_wheels.sh --trainer, for Redis)
#   supply         benchmarks/child_supply.py: a warm-up's phases (1 and 16 at once) and the pool's children per
#                  minute at 8 and 16 warm children (a child serves one job: the cap on evaluations per minute)
#   trial_profile[:PREFIXES]  benchmarks/trial_profile.py: each problem's reference and candidate harness run alone under
#                  torch.profiler (device time by kernel against the phases); PREFIXES comma-separated (default 14_,16_)
#   timing_noise[:SECONDS]  benchmarks/timing_noise.py: a ReLU's and 10_'s and 14_'s reference timings sampled on a quiet host,
#                  under CPU load, beside fresh children's warm-ups, and both; the spread and where each stop rule ends
#   memory_noise[:SECONDS]  timing_noise.py on 100_ConvTranspose3d's reference (3.5 GB output): quiet, then with another
#                  process holding all but each of $FREE_GIB (default "40 12 8") GiB of device memory
#   loop[:ROUNDS]  benchmarks/loop_gpu.sh: the loop's rounds through `kernelzero up` (needs gpu_wheels.sh --trainer)
# Environment: KB (KernelBench checkout, default .device), SEED (exchange_ab's, default 1), CANDIDATES (default $KB/cands_l2, made by
# `kernelbench_throughput.py prepare`), CONCURRENCY (default 8), LIMIT (throughput's problems, default 24),
# EVAL_RESUME (a samples.jsonl), EVAL_REDO (statuses to evaluate again on resume, e.g. runtime_error),
# PROFILE=1 (throughput runs under py-spy, every process of the tree, carried in .whl; its stacks are
# summarised by benchmarks/profile_summary.py into profile_g<G>.txt).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benchmarks/gpu_env.sh || exit 1
KB=${KB:-.device}
CANDIDATES=${CANDIDATES:-$KB/cands_l2}
CONCURRENCY=${CONCURRENCY:-8}
RESULTS=${OUT:-gpu-results}
PYTHON=$(type -P python3)
mkdir -p "$RESULTS"
# Host memory and its largest processes every 5 s: a GPU child has no address-space limit, so
# a step the OOM killer cut can be read back from here.
echo "scratch: $(df -h --output=size,used "$KZ_REWARD_SCRATCH_DIR" | tail -1)" > "$RESULTS/memory.log"
while sleep 5; do
    { date -u +%T; free -m | sed -n 2p; ps -eo rss=,args= --sort=-rss | head -3 | cut -c1-120; } >> "$RESULTS/memory.log"
done &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

for step in "$@"; do
    limit=600
    [[ $step == *@* ]] && limit=${step##*@} step=${step%@*}
    name=${step%%:*}
    arg=${step#*:}
    echo "=== $step, at most ${limit} s ($(date -u +%FT%TZ))"
    python3() { timeout -s INT -k 15 "$limit" "$PYTHON" "$@"; }  # a step cut short keeps the rows it checkpointed
    case "$name" in
        tests)
            [ "$arg" = tests ] && arg=  # tests:EXPR runs only the tests pytest -k EXPR selects
            python3 -m pytest -m gpu -v --durations=0 -p no:cacheprovider ${arg:+-k "$arg"} tests/test_judged_conditions.py tests/test_timed_check_call.py tests/test_compile.py tests/test_reward_gpu.py tests/test_reward_integrity_gpu.py tests/test_device_exchange_gpu.py \
                2>&1 | tee "$RESULTS/gpu_tests${arg:+_${arg//[^A-Za-z0-9_]/_}}.log" ;;  # a file name the device tool returns
        throughput)
            profiler=()
            [ -n "${PROFILE:-}" ] && profiler=(/tmp/kz-site/bin/py-spy record --subprocesses --idle --rate 25 --format raw
                --output "${TMPDIR:-/tmp}/stacks_g$arg.txt" --)
            timeout -s INT -k 15 "$limit" "${profiler[@]}" "$PYTHON" benchmarks/kernelbench_throughput.py run --problems "$KB/KernelBench/level2" \
                --candidates "$CANDIDATES" --limit "${LIMIT:-24}" --only ours --concurrency "$CONCURRENCY" --group "$arg" \
                --out "$RESULTS/throughput_g$arg"
            [ -n "${PROFILE:-}" ] && "$PYTHON" benchmarks/profile_summary.py "${TMPDIR:-/tmp}/stacks_g$arg.txt" > "$RESULTS/profile_g$arg.txt" ;;
        exchange_ab)
            for side in files exchange; do
                rm -rf "${KZ_DATA_DIR:?}"/* "${KZ_REWARD_SCRATCH_DIR:?}"/*
                on=false
                [ "$side" = exchange ] && on=true
                KZ_REWARD_DEVICE_EXCHANGE=$on timeout -s INT -k 15 "$((limit / 2))" "$PYTHON" benchmarks/kernelbench_throughput.py run \
                    --problems "$KB/KernelBench/level2" --candidates "$CANDIDATES" --limit "${LIMIT:-24}" --only ours \
                    --concurrency "$CONCURRENCY" --group "$arg" --seed "${SEED:-1}" --out "$RESULTS/ab_g${arg}_$side"
            done
            "$PYTHON" benchmarks/verdict_equality.py "$RESULTS/ab_g${arg}_files/ours_rows.jsonl" \
                "$RESULTS/ab_g${arg}_exchange/ours_rows.jsonl" --json "$RESULTS/ab_g${arg}_verdicts.json" ;;
        verdicts)
            mkdir -p "$RESULTS/verdicts_g$arg"
            [ -n "${VERDICTS_FROM:-}" ] && cp "$VERDICTS_FROM/ours_rows.jsonl" "$RESULTS/verdicts_g$arg/"
            python3 benchmarks/kernelbench_throughput.py run --problems "$KB/KernelBench/level2" --candidates "$CANDIDATES" \
                --limit "${LIMIT:-24}" --only ours --concurrency "$CONCURRENCY" --group "$arg" --seed "${SEED:-1}" --resume \
                --out "$RESULTS/verdicts_g$arg" ;;
        compile)
            [ "$arg" = compile ] && arg=5
            python3 benchmarks/compile_strategies.py --gpu --skip-original --repeat "$arg" --kernelbench "$KB"
            cp benchmarks/results/compile_strategies_gpu.json "$RESULTS/" ;;
        trial_profile)
            [ "$arg" = trial_profile ] && arg=14_,16_
            only=()
            for prefix in ${arg//,/ }; do only+=(--only "$prefix"); done
            python3 benchmarks/trial_profile.py run --problems "$KB/KernelBench/level2" --candidates "$CANDIDATES" "${only[@]}" \
                --out "$RESULTS/trial_profile.json" ;;
        kernelbench)
            python3 benchmarks/kernelbench_throughput.py run --problems "$KB/KernelBench/level2" --candidates "$CANDIDATES" \
                --limit "${KB_LIMIT:-6}" --only kernelbench --kernelbench "$KB" --group "$arg" --variant 1 --out "$RESULTS/kernelbench_g$arg" ;;
        eval)
            mkdir -p "$RESULTS/eval"
            [ -n "${EVAL_RESUME:-}" ] && cp "$EVAL_RESUME" "$RESULTS/eval/samples.jsonl"
            python3 -m kernelzero eval --problems "$KB/KernelBench" --levels "$arg" --backend triton --samples 1 \
                --model-backend template --device cuda --concurrency "${EVAL_CONCURRENCY:-2}" ${EVAL_REDO:+--redo "$EVAL_REDO"} \
                --out "$RESULTS/eval" ;;
        reward)
            [ "$arg" = reward ] && arg=  # reward:STEP,STEP runs only those of reward_gpu.py's steps
            python3 benchmarks/reward_gpu.py --out "$RESULTS" ${arg:+--only ${arg//,/ }} ;;
        trainer_step)
            python3 benchmarks/trainer_step.py --size 0.5b --profile --out "$RESULTS/trainer_step" --model-dir "${TMPDIR:-/tmp}/kz-trainer-step-model" ;;
        supply)
            python3 benchmarks/child_supply.py --device cuda --together 1 16 --sizes 8 16 --seconds 30 --out "$RESULTS/child_supply.json" ;;
        score)
            [ "$arg" = score ] && arg=2
            for run in $(seq "$arg"); do
                started=$(date +%s.%N)
                python3 -m kernelzero score --reference tests/kernels/relu/reference.py --candidate tests/kernels/relu/triton_correct.py \
                    --backend triton --json > "$RESULTS/score_$run.json"
                echo "score run $run: $("$PYTHON" -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 2))' "$started") s wall"
                "$PYTHON" -c 'import json, sys; v = json.load(open(sys.argv[1])); print(v["status"], json.dumps(v["details"].get("seconds")), json.dumps(v["details"].get("phases")))' "$RESULTS/score_$run.json"
            done ;;
        score_latency)
            [ "$arg" = score_latency ] && arg=3
            timeout -s INT -k 30 "$limit" bash benchmarks/score_latency.sh "$RESULTS/score_latency" "$arg" ;;
        timing_noise)
            [ "$arg" = timing_noise ] && arg=11
            python3 benchmarks/timing_noise.py --seconds "$arg" --out "$RESULTS/timing_noise" \
                --problem "$KB/KernelBench/level2/10_ConvTranspose2d_MaxPool_Hardtanh_Mean_Tanh.py" \
                --problem "$KB/KernelBench/level2/14_Gemm_Divide_Sum_Scaling.py" ;;
        memory_noise)
            [ "$arg" = memory_noise ] && arg=15
            conditions="quiet memory"
            for free in ${FREE_GIB:-40 12 8}; do
                python3 benchmarks/timing_noise.py --seconds "$arg" --conditions $conditions --free-gib "$free" --no-relu \
                    --out "$RESULTS/memory_noise_free${free}" --problem "$KB/KernelBench/level2/100_ConvTranspose3d_Clamp_Min_Divide.py"
                conditions=memory
            done ;;
        loop)
            [ "$arg" = loop ] && arg=4
            timeout -s INT -k 30 "$limit" bash benchmarks/loop_gpu.sh "$RESULTS/loop" "$arg" ;;
        *)
            echo "gpu_run: unknown step $step" >&2; exit 2 ;;
    esac
done
