# Sourced by the benchmarks that need the running platform: `platform_up LOG DEVICE [ENV=VALUE ...]`
# starts `kernelzero up` in the background, the reward worker on GPU 0 where DEVICE is cuda, no API keys
# asked (both exported: the sourcing script's later commands talk to that platform; the extra variables
# go to its environment only), waits until every service reports ready (at most 300 s) and stops it when
# the sourcing script exits (an EXIT trap: it replaces one the sourcing script set).
platform_up() {
    local log=$1 device=$2
    shift 2
    if [ "$device" = cuda ]; then export KZ_GPU_DEVICES='[0]'; fi
    export KZ_AUTH_ENABLED=false
    env "$@" python3 -m kernelzero up > "$log" 2>&1 &
    platform=$!
    trap 'kill -INT $platform 2>/dev/null; wait $platform' EXIT
    local started
    started=$(date +%s)
    until python3 -m kernelzero status --json 2>/dev/null \
        | python3 -c 'import json, sys; sys.exit(set(json.load(sys.stdin)["services"].values()) != {"ready"})'; do
        kill -0 $platform 2>/dev/null || { echo "platform: kernelzero up stopped" >&2; tail -30 "$log" >&2; return 1; }
        (( $(date +%s) - started < 300 )) || { echo "platform: not ready in 300 s" >&2; return 1; }
        sleep 2
    done
    echo "platform: ready in $(( $(date +%s) - started )) s"
}
