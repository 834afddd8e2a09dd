#!/usr/bin/env bash
# crishim and containerd side by side, through the same CRI client, CNI config and images (from a
# local docker-registry): pod start, burst, ExecSync, stop + remove, memory per pod, cold pull.
# Prints a table (crishim, containerd, ratio) and writes the raw samples as JSON.
#
#   hack/bench.sh                      # 50 pods, burst 10 at a time, 5 cold pulls
#   hack/bench.sh --pods 10            # a quick run; --help lists every option
#   hack/bench.sh --nri-plugins 3      # only what 3 NRI plugins add to CreateContainer
#   hack/bench.sh --lazy               # only lazy pull: a 4 GiB image through a 100 MiB/s registry
#   hack/bench.sh --lazy --lazy-image-mib 300   # the same, quicker
#
# Needs root. Installs containerd, runc and the rest with hack/install-deps.sh when missing, and
# builds crishim in release mode (the figures mean little for a debug build). The static
# crishim-init is not built: no benchmarked container runs under it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[ "$(id -u)" -eq 0 ] || { echo "bench: run as root (pods need namespaces, mounts, cgroups)" >&2; exit 1; }

./hack/install-deps.sh

echo "+ cargo build --release -p crishim -p crishim-shim -p crishim-bench, crishim-nri-test-plugin" >&2
cargo build --release -p crishim -p crishim-shim -p crishim-bench
cargo build --release -p crishim-tests --bin crishim-nri-test-plugin
# The FUSE server of lazy layers, which the daemon runs from beside itself (where the tree has it).
if grep -q '^name = "crishim-lazyfs"' lazy/Cargo.toml; then
  cargo build --release -p crishim-lazy --bin crishim-lazyfs
fi

bin="${CARGO_TARGET_DIR:-$PWD/target}/release"
# The shim and the infra process as installed (hack/run.sh): static, side by side.
install -m 0755 "$(./hack/build-init.sh --release crishim-shim)" "$bin/crishim-shim"
install -m 0755 "$(./hack/build-init.sh --release crishim-pause)" "$bin/crishim-pause"
exec "$bin/crishim-bench" --crishim-bin "$bin/crishim" "$@"
