#!/usr/bin/env bash
# Mutation testing of the store and the worker (issue 13, item 5). Not part of CI: every mutant
# rebuilds the runtime and relinks the selected test binaries (15-40 s a mutant on two cores).
#
#   scripts/mutants.sh store                  # every mutant of outbox-runtime/src/store
#   scripts/mutants.sh worker --shard 1/4     # a quarter of outbox-runtime/src/worker
#   scripts/mutants.sh worker --file 'outbox-runtime/src/worker/completer.rs'
#   scripts/mutants.sh store --list           # count them, build nothing
#
# Needs `cargo install --locked cargo-mutants`, cargo-nextest and the test database
# (127.0.0.1:5432, see README). Further arguments go to cargo-mutants. Results:
# target/mutants/<folder>/mutants.out/ (caught.txt, missed.txt, unviable.txt, timeout.txt, outcomes.json). docs/proof.md lists the
# survivors judged equivalent, with the reason. Skipped in every binary: the fuzz targets'
# property tests (they test neither folder), a 20,000-event throughput test and a timing
# measurement (each mutant would spend most of its minute there; shorter tests drive the
# same statements).
set -euo pipefail
cd "$(dirname "$0")/.."

folder="${1:-}"
shift || true
# The test binaries run against each mutant ("lib": the runtime's unit tests). Running all ~46
# for each mutant would take days here; these are the ones that drive the folder's code.
# MUTANTS_TESTS="lib store_fencing ..." overrides the list.
case "$folder" in
  store)
    default_tests="lib store_fencing store_claim store_enqueue store_enqueue_attacks store_guards
                   store_schema poison_isolation worker_batch worker_ordering testing_kit"
    ;;
  worker)
    default_tests="lib worker_batch worker_delivery worker_failures worker_lifecycle
                   worker_ordering worker_prefetch worker_vacuum worker_wakeups poison_isolation
                   observability_metrics"
    ;;
  *)
    echo "usage: $0 store|worker [cargo-mutants arguments]" >&2
    exit 2
    ;;
esac

# The tests run under nextest, eight at a time across every selected binary (each test has a
# database of its own): the worker's selection takes 24 s that way against 70 s under
# `cargo test`, which runs the binaries one after another. MUTANTS_TEST_TOOL=cargo goes back.
tool="${MUTANTS_TEST_TOOL:-nextest}"
skips=(--skip fuzz_targets --skip eight_connections_deliver_twenty_thousand_events_exactly_once
       --skip measure_notify_cost)
# The selection goes to the build as well as to the tests (--cargo-arg): otherwise every mutant
# would build and link all ~46 test binaries of the workspace, and run a handful.
targets=()
for t in ${MUTANTS_TESTS:-$default_tests}; do
  if [ "$t" = lib ]; then targets+=(--lib); else targets+=(--test "$t"); fi
done
selection=()
for a in "${targets[@]}"; do selection+=("--cargo-arg=$a"); done
parallel=()
if [ "$tool" = nextest ]; then parallel+=(-j "${MUTANTS_TEST_THREADS:-8}"); fi
# For a mutant, the first failing test is the verdict: the tests still running are killed
# then, not waited for. Many worker mutants make some test wait out its 60 s limit, and
# waiting for the other seven slots' tests too doubled a caught mutant's time.
stop_at_first=()
if [ "$tool" = nextest ]; then stop_at_first+=(--cargo-test-arg=--max-fail=1:immediate); fi
packages=(--package outbox-runtime --package outbox-workspace)

# --in-place: the mutants are applied to this tree and built in its target/ (cargo-mutants
# restores each file after its mutant). A copy would not keep target/'s timestamps and so
# rebuild every dependency first. Do not edit the tree while this runs.
# The unmutated tree is tested first, here, with the same selection: a red baseline, or
# arguments the test tool rejects, would otherwise count every mutant as caught. (cargo-mutants'
# own baseline builds only the mutated package's tests, where the selected binaries are not.)
# MUTANTS_BASELINE_PASSED=1 skips it, for a loop that runs it once and then the folder's files
# one run each (MUTANTS_OUTPUT keeps each run's results apart).
if [[ " $* " == *" --list "* ]]; then
  :
elif [ "${MUTANTS_BASELINE_PASSED:-}" = 1 ]; then
  echo "baseline: skipped (MUTANTS_BASELINE_PASSED=1)" >&2
else
  if [ "$tool" = nextest ]; then run=(nextest run); else run=(test); fi
  echo "baseline: cargo ${run[*]} on the unmutated tree" >&2
  cargo "${run[@]}" --locked "${packages[@]}" "${targets[@]}" "${parallel[@]}" -- "${skips[@]}" \
    || { echo "the unmutated tree fails its tests; no mutant was run" >&2; exit 1; }
fi
# The whole folder, unless the arguments name files of it (cargo-mutants adds --file globs up,
# so the folder's glob would take the others back in).
files=(--file "outbox-runtime/src/$folder/*.rs")
if [[ " $* " == *" --file "* || " $* " == *" -f "* ]]; then files=(); fi
output="${MUTANTS_OUTPUT:-target/mutants/$folder}"
mkdir -p "$output"
exec cargo mutants \
  --in-place \
  --baseline skip \
  --package outbox-runtime \
  --test-package outbox-runtime --test-package outbox-workspace \
  "${files[@]}" \
  --test-tool "$tool" \
  --timeout "${MUTANTS_TEST_TIMEOUT:-300}" \
  --build-timeout "${MUTANTS_BUILD_TIMEOUT:-900}" \
  --output "$output" \
  "${selection[@]}" "${parallel[@]/#/--cargo-test-arg=}" "${stop_at_first[@]}" \
  "$@" \
  -- -- "${skips[@]}"
