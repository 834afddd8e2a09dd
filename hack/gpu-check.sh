#!/usr/bin/env bash
# crishim on a machine with a real NVIDIA GPU and driver: serves the node's GPUs and runs, in
# busybox containers with a 2 GiB memory limit and a 30% core limit (GPU 0):
#   - nvidia-smi;
#   - a driver-API program allocating past its limit through cuMemAlloc, cuGetProcAddress,
#     cuMemAllocAsync, a memory pool and arrays, and a pool that keeps freed memory;
#   - two processes sharing the limit, one of them killed;
#   - a graph's memory allocation nodes, launched again, and after the graph memory is trimmed;
#   - the core limit in 1-second windows: alone over 30 s (and 10 s through cooperative and
#     graph launches), and over 30 s beside a neighbour container that keeps the GPU busy; a
#     table of each run's mean, minimum and maximum share of the unlimited rate, which it also
#     prints.
# Every step prints what it saw (the test `tests/tests/gpu_real.rs`, run with --ignored), once
# with each way of injecting the interceptor: `preload` and `replace`.
#
#   hack/gpu-check.sh                  build here (cargo, hack/install-deps.sh), then run
#   hack/gpu-check.sh --pack DIR       build on a dev machine into DIR (no GPU needed)
#   hack/gpu-check.sh --prebuilt DIR   run DIR's build on a GPU node without a toolchain
#
# Running needs root, the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1, /dev/nvidia*) and a C
# compiler (cudatest is built against the node's glibc); --prebuilt also needs this checkout at
# the path it was packed from (the test finds tests/gpu/ there). There is no GPU in CI: the
# same paths are tested there against the fake driver in tests/gpu/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${1:-}" = "--pack" ]; then
    out="${2:?--pack DIR}"
    mkdir -p "$out"
    cargo build --release -p crishim -p crishim-shim -p crishim-vgpu >&2
    test_bin="$(cargo test --release -p crishim-tests --test gpu_real --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*gpu_real[^"]*\)".*/\1/p' | tail -1)"
    init="$(./hack/build-init.sh --release)"
    pause="$(./hack/build-init.sh --release crishim-pause)"
    target_dir="${CARGO_TARGET_DIR:-target}"
    case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
    rel="$target_dir/release"
    cp "$rel/crishim" "$rel/crishim-shim" "$rel/libcrishim_vgpu.so" "$init" "$pause" "$out/"
    cp "$test_bin" "$out/gpu_real"
    # The node may lack these packages: the registry and the busybox the test images hold.
    cp /usr/bin/docker-registry /bin/busybox "$out/"
    echo "$out: copy it and this checkout (same path) to the GPU node, then: hack/gpu-check.sh --prebuilt $out" >&2
    exit 0
fi

[ "$(id -u)" -eq 0 ] || { echo "gpu-check: run as root" >&2; exit 1; }
if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1 || ! ldconfig -p | grep -q 'libcuda.so.1 '; then
    echo "gpu-check: no NVIDIA GPU or driver here (/dev/nvidia0, libcuda.so.1)" >&2
    exit 1
fi
nvidia-smi -L || true

if [ "${1:-}" = "--prebuilt" ]; then
    dir="$(cd "${2:?--prebuilt DIR}" && pwd)"
    export CRISHIM_BIN="$dir/crishim" CRISHIM_INIT_BIN="$dir/crishim-init"
    export DOCKER_REGISTRY_BIN="$dir/docker-registry" BUSYBOX_BIN="$dir/busybox"
    for mode in preload replace; do
        CRISHIM_GPU_CHECK_INJECT=$mode "$dir/gpu_real" --ignored --nocapture --test-threads 1
    done
    exit 0
fi

./hack/install-deps.sh
echo "+ cargo build --workspace" >&2
cargo build --workspace
CRISHIM_INIT_BIN="$(./hack/build-init.sh)"
export CRISHIM_INIT_BIN
for mode in preload replace; do
    echo "+ CRISHIM_GPU_CHECK_INJECT=$mode cargo test -p crishim-tests --test gpu_real -- --ignored --nocapture" >&2
    CRISHIM_GPU_CHECK_INJECT=$mode cargo test -p crishim-tests --test gpu_real -- --ignored --nocapture --test-threads 1
done
