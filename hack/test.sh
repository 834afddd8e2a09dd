#!/usr/bin/env bash
# Build everything and run the whole test suite (unit tests and the integration tests in
# tests/, which start a real docker-registry and the crishim daemon).
#
#   hack/test.sh                      # everything
#   hack/test.sh -- --nocapture       # extra arguments go to `cargo test --workspace`
#
# Exits non-zero when any step fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

"./hack/install-deps.sh"

# The integration tests start one registry and one daemon per test; two at a time is the
# minimum we want, more when the machine has the cores.
if [ -z "${RUST_TEST_THREADS:-}" ]; then
  cores="$(nproc 2>/dev/null || echo 2)"
  [ "$cores" -ge 2 ] || cores=2
  export RUST_TEST_THREADS="$cores"
fi

echo "+ cargo build --workspace --all-targets" >&2
cargo build --workspace --all-targets

echo "+ hack/build-init.sh" >&2
CRISHIM_INIT_BIN="$(./hack/build-init.sh)"
export CRISHIM_INIT_BIN

echo "+ cargo fmt --check, cargo clippy -D warnings" >&2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

echo "+ cargo test --workspace $*" >&2
cargo test --workspace "$@"
