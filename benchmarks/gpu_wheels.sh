#!/usr/bin/env bash
# Run here (a machine with PyPI and Debian's archive), in the repo root: fills .whl/ (git-ignored)
# with what the GPU machine's image lacks to run the platform's GPU tests and benchmarks — the
# project's own dependencies that are not in that image, at the versions .venv holds, as CPython
# 3.12 manylinux wheels, and Debian's bubblewrap for the sandbox. benchmarks/gpu_env.sh installs
# them there. The image already has torch, triton, numpy, httpx, typer, psutil, matplotlib. Its rich has
# been found without a module of its own (rich._emoji_codes: a progress bar's first render failed), so
# rich and its dependencies are carried too.
# With --trainer, also what the trainer's GPU figures need: TRL and datasets, for
# benchmarks/trainer_step.py (the image's pyarrow, xxhash and peft serve them: pyarrow's wheel, 55 MB,
# would not fit the 64 MiB a call carries), and Debian's Redis, for the loop's rounds (benchmarks/loop_gpu.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MISSING_THERE=(pydantic pydantic-core pydantic-settings annotated-types typing-inspection typing-extensions python-dotenv
    sqlalchemy greenlet alembic mako celery kombu billiard vine amqp click-didyoumean click-plugins click-repl
    prompt-toolkit wcwidth tzdata tzlocal redis fastapi annotated-doc opentelemetry-api starlette uvicorn structlog
    prometheus-fastapi-instrumentator tenacity fastapi-offline rich markdown-it-py mdurl pygments)

debs=(bubblewrap)
if [ "${1:-}" = --trainer ]; then
    MISSING_THERE+=(trl datasets dill multiprocess fsspec)
    debs+=(redis-server redis-tools liblzf1 libjemalloc2 libatomic1)
fi

pins=()
for name in "${MISSING_THERE[@]}"; do  # those .venv lacks are optional there too (greenlet, tzdata on some systems)
    version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null) || continue
    pins+=("$name==$version")
done

mkdir -p .whl
platforms=()
for tag in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 \
           manylinux_2_31_x86_64 manylinux_2_34_x86_64; do
    platforms+=(--platform "$tag")
done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "${pins[@]}"
# py-spy: the throughput benchmark's stacks of what a waiting timing waits behind (device_lock_trace.py), PROFILE=1
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 -d .whl py-spy==0.4.3
(cd .whl && apt-get download "${debs[@]}" 2>/dev/null)
echo "gpu_wheels: $(ls .whl | wc -l) files in .whl ($(du -sh .whl | cut -f1)); carry .whl and source benchmarks/gpu_env.sh there"
