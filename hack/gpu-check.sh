#!/usr/bin/env bash
# crishim on a machine with a real NVIDIA GPU and driver: builds crishim, serves the node's GPUs
# and runs, in busybox containers with a 2 GiB memory limit and a 30% core limit (GPU 0):
#   - nvidia-smi;
#   - a driver-API program allocating past its limit through cuMemAlloc, cuGetProcAddress,
#     cuMemAllocAsync, a memory pool and arrays, and a pool that keeps freed memory;
#   - two processes sharing the limit, one of them killed;
#   - the core limit, alone and beside a neighbour container that keeps the GPU busy.
# Every step prints what it saw (the test `tests/tests/gpu_real.rs`, run with --ignored).
#
#   hack/gpu-check.sh
#
# Needs root, the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1, /dev/nvidia*) and what the
# test suite needs (hack/install-deps.sh). There is no GPU in CI: the same paths are tested
# there against the fake driver in tests/gpu/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[ "$(id -u)" -eq 0 ] || { echo "gpu-check: run as root" >&2; exit 1; }
if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1 || ! ldconfig -p | grep -q 'libcuda.so.1 '; then
    echo "gpu-check: no NVIDIA GPU or driver here (/dev/nvidia0, libcuda.so.1)" >&2
    exit 1
fi
nvidia-smi -L || true

./hack/install-deps.sh
echo "+ cargo build --workspace" >&2
cargo build --workspace
CRISHIM_INIT_BIN="$(./hack/build-init.sh)"
export CRISHIM_INIT_BIN
echo "+ cargo test -p crishim-tests --test gpu_real -- --ignored --nocapture" >&2
exec cargo test -p crishim-tests --test gpu_real -- --ignored --nocapture --test-threads 1
