#!/usr/bin/env bash
# Runs one Go fuzz target for a duration: fuzz.sh PACKAGE TARGET FUZZTIME.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context
# deadline exceeded" when -fuzztime expires while a worker is mid-call on
# a busy machine (golang/go#75804, fixed in Go 1.27): no input failed and
# none is written. A real finding always writes its input to
# testdata/fuzz/TARGET and says "Failing input written to". So a failure
# that names no such input and ends in that deadline is replayed
# deterministically (the seeds and the corpus, -run) and passes when the
# replay does; every other failure fails.
set -uo pipefail
pkg=$1 target=$2 fuzztime=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "./$pkg/" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [ "$status" -eq 0 ]; then
  exit 0
fi
if grep -q 'Failing input written to' "$log" || ! grep -q '^    context deadline exceeded$' "$log"; then
  exit "$status"
fi
echo "fuzz $pkg:$target: the fuzz coordinator's deadline race (golang/go#75804), no failing input; replaying the corpus"
go test -count=1 -run "^${target}\$" "./$pkg/"
