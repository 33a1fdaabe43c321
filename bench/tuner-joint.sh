#!/usr/bin/env bash
# The joint search of batch size and power cap (`tune energy --with batch-size`) against an
# exhaustive 2-D sweep (every cap at every batch that fits) on gpusim (BENCHMARKS.md, "Energy
# tuner: batch size with the cap"). Simulated time: the result is the same on any machine.
# Extra arguments go to the bench (--eta E, --step-w W).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q --bench tuner -- --joint "$@"
