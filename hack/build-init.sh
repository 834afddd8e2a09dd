#!/usr/bin/env bash
# Build crishim-init (or PACKAGE: crishim-pause) as a static executable and print its path.
# crishim-init is bind-mounted into containers of any image (some have no libc at all), so it must
# not link libc dynamically; crishim-pause, each pod's infra process, then maps no shared library.
# crt-static is passed with an explicit --target so it never reaches host-side build scripts or
# proc-macros.
# Honours an exported CARGO_TARGET_DIR (relative ones are taken from the workspace root).
#   hack/build-init.sh [--release] [PACKAGE]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
host="$(rustc -vV | sed -n 's/^host: //p')"
profile=debug
release=()
if [ "${1:-}" = "--release" ]; then profile=release; release=(--release); shift; fi
package="${1:-crishim-init}"
RUSTFLAGS="-C target-feature=+crt-static" cargo build -q -p "$package" --bin "$package" --target "$host" ${release[@]+"${release[@]}"} >&2
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
echo "$target_dir/$host/$profile/$package"
