#!/usr/bin/env bash
# Prometheus's view of a `/metrics` port flooded by slow clients (BENCHMARKS.md, "`/metrics`
# under a slow-client flood"): a daemon on the simulator (4 GPUs) with `--metrics-addr` on
# loopback; DRIPPERS connections each send one byte of a never-ending request head every 0.5 s
# and reconnect when closed, while curl (3 s timeout) scrapes once a second, SCRAPES times.
# Prints scrapes answered (a 200 with the whole page) and their median time, for each BINARY,
# ROUNDS times (alternating).
#
#   bench/metrics-flood.sh DRIPPERS SCRAPES ROUNDS BINARY...
set -euo pipefail
[[ $# -ge 4 ]] || {
    sed -n '2,9p' "$0" >&2
    exit 2
}
exec python3 "$(dirname "$0")/metrics_flood.py" "$@"
