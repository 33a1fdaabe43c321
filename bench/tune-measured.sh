#!/usr/bin/env bash
# `gpupilot tune energy` end to end on measured power curves of real GPUs (BENCHMARKS.md,
# "on measured curves, end to end"): for each curve of tests/data/zeus_power_curves.csv at eta
# 0.5 and 1, a fake NVML GPU drawing the curve's power, a synthetic trainer paced by the same
# curve, the daemon at its default 1 Hz. Prints one Markdown row a case; about 16 × 30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
GPUPILOT_MEASURED_CASES=all cargo test -q --test control every_measured_curve_when_asked \
    -- --nocapture 2>&1 | grep '^|'
