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

# Incremental caches are dead weight for a one-shot build, and CI's disk is small.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "+ cargo build --workspace --all-targets" >&2
cargo build --workspace --all-targets

echo "+ hack/build-init.sh" >&2
CRISHIM_INIT_BIN="$(./hack/build-init.sh)"
export CRISHIM_INIT_BIN
# The daemons the integration tests start run the shim and the infra as installed: static, side
# by side.
echo "+ hack/build-init.sh crishim-shim, crishim-pause" >&2
CRISHIM_SHIM_BIN="$(./hack/build-init.sh crishim-shim)"
./hack/build-init.sh crishim-pause >/dev/null
export CRISHIM_SHIM_BIN

echo "+ cargo fmt --check, cargo clippy -D warnings" >&2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

# Every test binary runs, even after a failure, so one run shows every failing test. A test that
# fails is run once more, alone; one that then passes is reported as FLAKY (and the run passes),
# so that a timing accident on a loaded CI machine does not hide the rest. A test that fails
# twice, a binary that dies without naming a failed test, or a failed doc test fails the run.
echo "+ cargo test --workspace --no-fail-fast $*" >&2
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] && exit 0
# "<binary> <test>" for each failed test; "<binary> -" for a binary that failed without naming a
# test, or never finished (a crash).
failed="$(awk '
  function close_bin() { if (bin != "" && !result) print bin, "-" }
  /^ +Running / { close_bin(); bin = $NF; result = 0; named = 0; next }
  /^ +Doc-tests / { close_bin(); bin = "doc"; result = 0; named = 0; next }
  /^test .* \.\.\. FAILED$/ { print bin, $2; named = 1; next }
  /^test result: / { result = 1; if ($3 == "FAILED" && !named) print bin, "-"; next }
  END { close_bin() }
' "$log")"
[ -n "$failed" ] || exit "$status"
echo "+ $(echo "$failed" | wc -l) failed; each runs once more, alone" >&2
flaky=()
while read -r bin name; do
  if [ "$bin" = doc ] || [ "$name" = - ]; then
    echo "FAILED (not retried): $bin $name" >&2
    exit "$status"
  fi
  if ! RUST_TEST_THREADS=1 cargo test --workspace -- --exact "$name"; then
    echo "FAILED twice: $name $bin" >&2
    exit "$status"
  fi
  flaky+=("$name")
done <<<"$failed"
for t in "${flaky[@]}"; do echo "FLAKY: $t failed, then passed alone" >&2; done
