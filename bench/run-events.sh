#!/usr/bin/env bash
# What a console watching a run costs the daemon in `run_events` polls (BENCHMARKS.md, "A run's
# events, polled by a console"): a run whose events.jsonl holds EVENTS events (knob changes,
# written as the daemon writes them), paged through to its end, then asked again from `next`
# POLLS times, as the console's run view does once a refresh. Prints the daemon's CPU
# (schedstat of all its threads) and the wall time per poll, for each BINARY in turn, ROUNDS
# times (alternating), and the medians.
#
#   bench/run-events.sh EVENTS POLLS ROUNDS BINARY...
#
# The daemon runs on the simulator (`--source sim`), with a home of its own per measurement.
set -euo pipefail
[[ $# -ge 4 ]] || {
    sed -n '2,11p' "$0" >&2
    exit 2
}
exec python3 "$(dirname "$0")/polls.py" events "$@"
