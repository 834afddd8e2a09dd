#!/usr/bin/env bash
# Build crishim-init (or PACKAGE: crishim-pause, crishim-shim) as a static executable and print
# its path. crishim-init is bind-mounted into containers of any image (some have no libc at all),
# so it must not link libc dynamically; crishim-pause, each pod's infra process, then maps no
# shared library. crishim-shim, started for every pod, skips the dynamic loader's work (about
# half the CPU of its start: 0.37 against 0.70 ms) and links libseccomp statically; it stays at a
# fixed address (shim/build.rs), so nothing in it is relocated at load.
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
flags="-C target-feature=+crt-static"
# Fixed address: `-static` rather than `-static-pie` (which `-no-pie` would contradict).
[ "$package" = crishim-shim ] && flags="$flags -C relocation-model=static"
# libseccomp's archive, for the shim (libseccomp-dev installs it beside the shared library).
seccomp_dir="$(pkg-config --variable=libdir libseccomp 2>/dev/null || echo "/usr/lib/$(gcc -print-multiarch)")"
LIBSECCOMP_LINK_TYPE=static LIBSECCOMP_LIB_PATH="${LIBSECCOMP_LIB_PATH:-$seccomp_dir}" \
RUSTFLAGS="$flags" cargo build -q -p "$package" --bin "$package" --target "$host" ${release[@]+"${release[@]}"} >&2
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
echo "$target_dir/$host/$profile/$package"
