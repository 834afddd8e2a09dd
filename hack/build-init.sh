#!/usr/bin/env bash
# Build crishim-init as a static executable and print its path. It is bind-mounted into containers
# of any image (some have no libc at all), so it must not link libc dynamically. crt-static is
# passed with an explicit --target so it never reaches host-side build scripts or proc-macros.
# Honours an exported CARGO_TARGET_DIR (relative ones are taken from the workspace root).
#   hack/build-init.sh [--release]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
host="$(rustc -vV | sed -n 's/^host: //p')"
profile=debug
[ "${1:-}" = "--release" ] && profile=release
RUSTFLAGS="-C target-feature=+crt-static" cargo build -q -p crishim-init --target "$host" ${1:+"$1"} >&2
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
echo "$target_dir/$host/$profile/crishim-init"
