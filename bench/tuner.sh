#!/usr/bin/env bash
# The energy tuner against an exhaustive sweep on gpusim (BENCHMARKS.md, "Energy tuner").
# Simulated time: the result is the same on any machine. Extra arguments go to the bench
# (--eta E, --step-w W).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q --bench tuner -- "$@"
