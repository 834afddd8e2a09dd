#!/usr/bin/env bash
# Build and install crishim on a Debian machine, then run it.
#   hack/run.sh            install, then run in the foreground (Ctrl-C stops it)
#   hack/run.sh --systemd  install and start the systemd unit instead
set -euo pipefail
cd "$(dirname "$0")/.."

bash hack/install-deps.sh
cargo build --release --workspace
rel="${CARGO_TARGET_DIR:-target}/release"
install -m 0755 "$rel"/crishim /usr/local/bin/crishim
# Lazy layers' FUSE servers, started by the daemon, one per layer ([images] lazy).
install -m 0755 "$rel"/crishim-lazyfs /usr/local/bin/crishim-lazyfs
modprobe fuse 2>/dev/null || true
# The per-pod shim, static (hack/build-init.sh says why).
install -m 0755 "$(hack/build-init.sh --release crishim-shim)" /usr/local/bin/crishim-shim
# The GPU interceptor: [gpu] interceptor defaults to this file next to the crishim binary.
install -m 0755 "$rel"/libcrishim_vgpu.so /usr/local/bin/libcrishim_vgpu.so
install -m 0755 "$(hack/build-init.sh --release)" /usr/local/bin/crishim-init
# Each pod's infra process, exec'd by crishim-shim from its own directory.
install -m 0755 "$(hack/build-init.sh --release crishim-pause)" /usr/local/bin/crishim-pause
install -d -m 0755 /etc/crishim
[ -f /etc/crishim/config.toml ] || install -m 0644 hack/config.toml /etc/crishim/config.toml

if [ "${1:-}" = "--systemd" ]; then
  install -m 0644 hack/crishim.service /etc/systemd/system/crishim.service
  systemctl daemon-reload
  systemctl enable --now crishim.service
  echo "crishim is running: crictl --runtime-endpoint unix:///run/crishim/crishim.sock --image-endpoint unix:///run/crishim/crishim.sock images"
else
  exec /usr/local/bin/crishim serve --config /etc/crishim/config.toml
fi
