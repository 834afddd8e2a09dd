#!/usr/bin/env bash
# critest (cri-tools' CRI validation suite) against crishim, or containerd for comparison, with
# no internet: the images critest pulls are stand-ins built here from busybox-static (and two small
# C programs in hack/critest/), served by a local docker-registry on 127.0.0.1:5000 that both
# runtimes use as a mirror of registry.k8s.io and gcr.io.
#
#   hack/critest.sh [crishim|containerd] [critest args...]
#
# critest itself is not built here: put a critest binary built from kubernetes-sigs/cri-tools
# v1.26.1 (`GOFLAGS=-mod=vendor go test -c -o critest ./cmd/critest`, Go 1.19) on PATH, or set
# CRITEST. Needs root. crishim comes from $CARGO_TARGET_DIR (or target/)/debug. Logs and state go
# to $CRITEST_DIR (default /tmp/crishim-critest). Stand-ins differ from the real images where
# noted in docs/testing.md ("Conformance: critest").
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=${1:-crishim}
shift || true
CRITEST=${CRITEST:-critest}
W=${CRITEST_DIR:-/tmp/crishim-critest}
REG=127.0.0.1:5000
target=${CARGO_TARGET_DIR:-$PWD/target}
command -v "$CRITEST" >/dev/null || { echo "critest not found (set CRITEST)" >&2; exit 1; }
mkdir -p "$W"

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The registry.
mkdir -p "$W/reg"
cat > "$W/reg/config.yml" <<Y
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $W/reg/data}, delete: {enabled: true}}
http: {addr: $REG}
Y
if ! curl -sf "http://$REG/v2/" >/dev/null; then
    docker-registry serve "$W/reg/config.yml" >"$W/reg/log" 2>&1 &
    pids+=($!)
    for _ in $(seq 50); do curl -sf "http://$REG/v2/" >/dev/null && break; sleep 0.1; done
fi

# The images: busybox-static with hard links (as the busybox image has), a passwd and group with
# the users critest expects, `pgrep` and `ipcs` scripts (Debian's busybox lacks them), an nginx
# stand-in and a setuid program for the no_new_privs specs.
gcc -static -O2 -o "$W/nginx" hack/critest/nginx.c
gcc -static -O2 -o "$W/nnp" hack/critest/nnp.c
rootfs() {
    local r=$1
    mkdir -p "$r"/{bin,etc,tmp,www,root,usr/sbin,var/run,home/default-user}
    cp /bin/busybox "$r/bin/busybox"
    for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -f "$r/bin/busybox" "$r/bin/$a"; done
    printf '#!/bin/sh\nfor d in /proc/[0-9]*; do [ "$(cat $d/comm 2>/dev/null)" = "$1" ] && echo ${d#/proc/}; done; true\n' >"$r/bin/pgrep"
    printf '#!/bin/sh\ncat /proc/sysvipc/shm\n' >"$r/bin/ipcs"
    chmod 755 "$r/bin/pgrep" "$r/bin/ipcs"
    cp "$W/nnp" "$r/nnp" && chmod 4755 "$r/nnp"
    cp "$W/nginx" "$r/usr/sbin/nginx"
    printf 'root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/sh\ndefault-user:x:1000:1000::/home/default-user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$r/etc/passwd"
    printf 'root:x:0:\nwww-data:x:33:\ndefault-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\nnogroup:x:65534:\n' >"$r/etc/group"
    echo "<h1>Welcome to nginx!</h1>" >"$r/www/index.html"
    chmod 1777 "$r/tmp"
}
image() { # REF USER CMD... (the rest is the image's Cmd)
    local ref=$1 user=$2; shift 2
    local d="$W/img/${ref//[\/:]/_}"
    rm -rf "$d"
    umoci init --layout "$d/oci" >/dev/null
    umoci new --image "$d/oci:t" >/dev/null
    umoci unpack --image "$d/oci:t" "$d/b" >/dev/null
    rootfs "$d/b/rootfs"
    echo "$ref" >"$d/b/rootfs/etc/image-name"
    umoci repack --image "$d/oci:t" "$d/b" >/dev/null
    local args=(--image "$d/oci:t" --os linux --architecture amd64 --config.workingdir /
        --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
    [ -n "$user" ] && args+=(--config.user "$user")
    for c in "$@"; do args+=(--config.cmd "$c"); done
    umoci config "${args[@]}" >/dev/null
    skopeo copy -q --dest-tls-verify=false "oci:$d/oci:t" "docker://$REG/$ref"
}
E2E=e2e-test-images
CT=k8s-staging-cri-tools
image pause:3.6 "" sh -c "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done"
image $E2E/busybox:1.29-2 "" sh
image $E2E/nginx:1.14-2 "" /usr/sbin/nginx
image $E2E/httpd:2.4.39-4 "" sh -c "echo 'AH00094: Command line: httpd -D FOREGROUND' >&2; exec httpd -f -p 80 -h /www"
image $E2E/nonewprivs:1.3 "" /nnp
image $CT/hostnet-nginx-amd64:latest "" sh -c "PORT=12003 exec /usr/sbin/nginx"
for ref in test-image-latest:latest test-image-tag:test test-image-tag:all \
    test-image-1:latest test-image-2:latest test-image-3:latest test-image-tags:1; do
    image "$CT/$ref" "" sh
done
for t in 2 3; do
    skopeo copy -q --src-tls-verify=false --dest-tls-verify=false \
        "docker://$REG/$CT/test-image-tags:1" "docker://$REG/$CT/test-image-tags:$t"
done
image $CT/test-image-user-uid:latest 1002 sh
image $CT/test-image-user-username:latest www-data sh
image $CT/test-image-user-uid-group:latest 1003:1004 sh
image $CT/test-image-user-username-group:latest www-data:1004 sh
image $CT/test-image-predefined-group:latest 1000 sh

# The runtime, on fresh directories, with its own bridge.
rdir="$W/$runtime"
# What an interrupted run left: pods outlive their daemon, so their shims, infra processes and
# mounts under $rdir go first, or the directory cannot be removed.
if [ -d "$rdir" ]; then
    for pid in $(pgrep -f -- "--dir $rdir/" || true); do
        pkill -KILL -P "$pid" 2>/dev/null || true
        kill -KILL "$pid" 2>/dev/null || true
    done
    awk -v d="$rdir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
fi
rm -rf "$rdir"
mkdir -p "$rdir/cni"
cat >"$rdir/cni/10-critest.conflist" <<J
{"cniVersion": "1.0.0", "name": "critest-$runtime", "plugins": [
  {"type": "bridge", "bridge": "crt-$runtime", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.97.$([ "$runtime" = crishim ] && echo 7 || echo 8).0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$rdir/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
J
case $runtime in
crishim)
    sock="$rdir/crishim.sock"
    cat >"$rdir/config.toml" <<T
socket = "$sock"
root_dir = "$rdir/root"
state_dir = "$rdir/state"
[cni]
conf_dir = "$rdir/cni"
[registry.mirrors."registry.k8s.io"]
endpoint = ["http://$REG"]
[registry.mirrors."gcr.io"]
endpoint = ["http://$REG"]
T
    "$target/debug/crishim" serve --config "$rdir/config.toml" >"$rdir/daemon.log" 2>&1 &
    ;;
containerd)
    sock="$rdir/containerd.sock"
    cat >"$rdir/config.toml" <<T
version = 2
root = "$rdir/root"
state = "$rdir/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$rdir/cni"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."registry.k8s.io"]
    endpoint = ["http://$REG"]
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."gcr.io"]
    endpoint = ["http://$REG"]
T
    containerd --config "$rdir/config.toml" >"$rdir/daemon.log" 2>&1 &
    ;;
*) echo "usage: $0 [crishim|containerd] [critest args...]" >&2; exit 2 ;;
esac
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
"$CRITEST" --runtime-endpoint "unix://$sock" --image-endpoint "unix://$sock" \
    -ginkgo.timeout=25m -ginkgo.no-color "$@" 2>&1 | tee "$rdir/critest.log"
