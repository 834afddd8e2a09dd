#!/usr/bin/env bash
# Run a container image as a plain OCI bundle with `crishim bundle run`: copy the image into an OCI
# layout with skopeo, unpack it into a bundle with umoci, set the command, run it.
#
#   examples/bundle/run.sh                                   # busybox from Docker Hub, `echo hello`
#   examples/bundle/run.sh docker://docker.io/library/alpine:3.20 -- cat /etc/os-release
#   examples/bundle/run.sh oci:/path/to/layout:tag -- sh     # any skopeo source; a tty if we have one
#
# Needs root, skopeo, umoci and jq; CRISHIM (default: crishim on PATH, else target/debug/crishim).
# Extra skopeo flags (e.g. --src-tls-verify=false for a local registry) go in SKOPEO_FLAGS.
# Exits with the container's exit code.
set -euo pipefail

image="${1:-docker://docker.io/library/busybox:latest}"
shift || true
[ "${1:-}" = "--" ] && shift
[ "$#" -gt 0 ] || set -- echo hello from a crishim bundle

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
crishim="${CRISHIM:-$(command -v crishim || echo "$here/../../target/debug/crishim")}"

work="$(mktemp -d /tmp/crishim-bundle-example.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# shellcheck disable=SC2086
skopeo --insecure-policy copy ${SKOPEO_FLAGS:-} "$image" "oci:$work/layout:example" >&2
umoci unpack --image "$work/layout:example" "$work/bundle" >&2

# umoci writes a runc-style config.json (sh on a terminal); run our command instead, on a terminal
# only when we have one.
tty=false
[ -t 0 ] && [ -t 1 ] && tty=true
jq --argjson args "$(printf '%s\n' "$@" | jq -R . | jq -s .)" --argjson tty "$tty" \
  '.process.args = $args | .process.terminal = $tty' \
  "$work/bundle/config.json" >"$work/config.json"
mv "$work/config.json" "$work/bundle/config.json"

status=0
"$crishim" bundle run "$work/bundle" --id "example-$$" || status=$?
exit "$status"
