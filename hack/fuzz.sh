#!/usr/bin/env bash
# Run the cargo-fuzz targets (fuzz/fuzz_targets/*.rs), one after another, for SECONDS each:
#   hack/fuzz.sh [SECONDS] [TARGET...]      # default: $FUZZ_SECONDS, else 60; all targets
# FUZZ_RUNS=N also stops a target after N inputs, whichever comes first (the long run is
# 10 minutes or 10 million inputs: FUZZ_RUNS=10000000 hack/fuzz.sh 600).
# New inputs go to fuzz/corpus-new/<target>; the seeds and them are then merged (only inputs
# adding coverage) into fuzz/corpus-min/<target>. Both are ignored by git: commit from
# corpus-min only what is small (one 20 s run of every target grows it by tens of MB). Crashes and hangs are
# left in fuzz/artifacts/<target>/: copy them to fuzz/regressions/<target>/ once fixed.
# Prints, per target: seconds, inputs run, and the outcome; exits non-zero on any finding.
# Builds into $CARGO_TARGET_DIR/fuzz when CARGO_TARGET_DIR is set, else fuzz/target.
# Limits: 1 s per input, 256 MiB of memory.
set -euo pipefail

cd "$(dirname "$0")/.."
secs="${FUZZ_SECONDS:-60}"
runs=()
[[ -n ${FUZZ_RUNS:-} ]] && runs=(-runs="$FUZZ_RUNS")
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    secs=$1
    shift
fi
if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    targets=()
    for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "cargo-fuzz needs a nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz

target_dir="${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR/fuzz}"
target_dir="${target_dir:-$PWD/fuzz/target}"
# No sanitizer: the code under test is safe Rust over a few syscalls; debug assertions on, so
# arithmetic overflows are findings.
fuzz=(cargo +nightly fuzz)
opts=(--fuzz-dir fuzz --target-dir "$target_dir" -s none -a)
"${fuzz[@]}" build "${opts[@]}"

status=0
summary=()
for t in "${targets[@]}"; do
    new="fuzz/corpus-new/$t"
    mkdir -p "$new" "fuzz/corpus/$t" "fuzz/regressions/$t" "fuzz/artifacts/$t"
    log="fuzz/artifacts/$t/last-run.log"
    started=$(date +%s)
    outcome=ok
    if ! "${fuzz[@]}" run "${opts[@]}" "$t" "$new" "fuzz/corpus/$t" "fuzz/regressions/$t" -- \
        -max_total_time="$secs" "${runs[@]}" -timeout=1 -rss_limit_mb=256 -print_final_stats=1 \
        >"$log" 2>&1; then
        outcome="FINDING: $(grep -m1 -E 'ERROR: libFuzzer|panicked at|deadly signal' "$log" || echo 'see log')"
        status=1
    fi
    took=$(($(date +%s) - started))
    inputs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || true)
    summary+=("$(printf '%-20s %6ss %12s inputs  %s  (%s)' "$t" "$took" "${inputs:-?}" "$outcome" "$log")")
    # A minimized corpus, to review before committing any of it.
    mkdir -p "fuzz/corpus-min/$t"
    "${fuzz[@]}" run "${opts[@]}" "$t" "fuzz/corpus-min/$t" "fuzz/corpus/$t" "$new" -- -merge=1 \
        >/dev/null 2>&1 || true
    echo "${summary[-1]}"
done
printf '\n%s\n' "${summary[@]}"
exit "$status"
