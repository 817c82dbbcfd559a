# Sourced on the GPU machine (the device tool's H200), in the repo root, with .whl carried (made by
# benchmarks/gpu_wheels.sh): installs the carried wheels beside the image's torch and triton,
# unpacks bubblewrap (the sandbox the tests and figures must run under) and, where carried, Redis
# (its libraries reached through a wrapper, so no other program loads them), and points the platform's
# state at /tmp and its trial tensors at a tmpfs, as deployments do (KZ_REWARD_SCRATCH_DIR).
#
#     source benchmarks/gpu_env.sh && python3 -m pytest -m gpu -q
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/kz-site .whl/*.whl || return 1
for deb in .whl/*.deb; do dpkg -x "$deb" /tmp/kz-debs || return 1; done
mkdir -p /tmp/kz-debs/bin
if [ -e /tmp/kz-debs/usr/bin/redis-server ]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/kz-debs/usr/lib/x86_64-linux-gnu exec /tmp/kz-debs/usr/bin/redis-server "$@"\n' \
        > /tmp/kz-debs/bin/redis-server
    chmod +x /tmp/kz-debs/bin/redis-server
fi
export PYTHONPATH="/tmp/kz-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/kz-debs/bin:/tmp/kz-debs/usr/bin:$PATH"
export KZ_DATA_DIR=/tmp/kz KZ_REWARD_SCRATCH_DIR=/dev/shm/kz PYTHONUNBUFFERED=1
mkdir -p "$KZ_DATA_DIR" "$KZ_REWARD_SCRATCH_DIR"
echo "gpu_env: $(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'); bwrap $(bwrap --version)"
