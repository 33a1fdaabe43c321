#!/usr/bin/env bash
# What the console's run-list poll costs on a node that keeps many ended runs (BENCHMARKS.md,
# "The run list, polled by a console"): a daemon on the simulator with ENDED ended runs and one
# live run; a client asks `runs` POLLS times as a console did once a refresh (the whole list),
# then `runs` with `live: true` POLLS times as it does now. Prints the answer's size and the
# daemon's CPU (schedstat of all its threads) per request, for each BINARY, ROUNDS times
# (alternating), and the medians. A daemon older than `live` answers the whole list to both.
#
#   bench/run-list.sh ENDED POLLS ROUNDS BINARY...
set -euo pipefail
[[ $# -ge 4 ]] || {
    sed -n '2,9p' "$0" >&2
    exit 2
}
exec python3 "$(dirname "$0")/polls.py" list "$@"
