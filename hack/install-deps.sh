#!/usr/bin/env bash
# Install the system packages crishim needs to build and test, on Debian 12 (bookworm).
#
# Idempotent: when every package is already installed it changes nothing and needs neither
# root nor the network. Rust itself is not installed here: cargo must already be on PATH.
set -euo pipefail

PACKAGES=(
  # Tests: a real registry, image tools, the busybox put into test images, htpasswd, certs.
  docker-registry
  skopeo
  umoci
  busybox-static
  apache2-utils
  openssl
  zstd
  # The systemd cgroup driver's test boots a real systemd with a system bus (nsenter: util-linux).
  systemd
  dbus
  util-linux
  # apparmor_parser: crishim loads its RuntimeDefault profile with it (and the tests compile it)
  apparmor
  # Runtime: OCI runtime, CNI plugins, networking, seccomp.
  runc
  containerd
  containernetworking-plugins
  iptables
  libseccomp-dev
  # Build: protoc for generated gRPC code, pkg-config for native libraries; a C compiler, which
  # also builds the fake GPU driver and the test program of the GPU tests.
  protobuf-compiler
  pkg-config
  gcc
  libc6-dev
  # libbpf (built from source by libbpf-sys) for the cgroup v2 device filter.
  libelf-dev
  zlib1g-dev
)

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if ! command -v cargo >/dev/null 2>&1; then
  die "cargo not found on PATH: install Rust >= 1.85 first (for example with rustup, https://rustup.rs), then re-run"
fi

command -v dpkg >/dev/null 2>&1 || die "dpkg not found: this script supports Debian 12 (and derivatives) only"

installed() {
  # dpkg -s also knows removed packages whose config files remain: require "install ok installed".
  # (dpkg-query, not `dpkg -s | grep -q`: under pipefail, grep quitting early fails the pipe.)
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  log "all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

log "installing: ${missing[*]}"
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "not root and sudo not found; install as root: ${missing[*]}"
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update
"${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"

still=()
for p in "${missing[@]}"; do
  installed "$p" || still+=("$p")
done
[ "${#still[@]}" -eq 0 ] || die "still missing after apt-get install: ${still[*]}"
log "done"
