#!/usr/bin/env bash
# The cluster view on the head node: 64 nodes × 8 GPUs through Prometheus's query API at 1 Hz.
#
#   bench/cluster.sh [SECONDS] [NODES] [GPUS]      (default 60 64 8)
#
# Runs benches/cluster.rs three times (release build): a stand-in Prometheus in a child
# process answers the view's three instant queries with NODES × GPUS generated series; the
# measured process runs the view's query thread at 1 Hz and renders the grid on a 200×50
# TestBackend per answer. Prints each run's key=value line; results also in
# bench/out/cluster-<time>.txt.
set -euo pipefail
secs=${1:-60}
nodes=${2:-64}
gpus=${3:-8}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p bench/out
out=bench/out/cluster-$(date -u +%Y%m%dT%H%M%SZ).txt
for i in 1 2 3; do
    cargo bench --quiet --bench cluster -- "$secs" "$nodes" "$gpus" 2>/dev/null | tee -a "$out"
done
echo "results: $out"
