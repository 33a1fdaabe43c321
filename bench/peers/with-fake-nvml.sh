#!/bin/sh
# Runs a command against the fake NVML library (crates/fake-nvml), e.g.
#   bench/peers/with-fake-nvml.sh -s crates/fake-nvml/scenarios/8xh100.toml nvtop
#   bench/peers/with-fake-nvml.sh gpustat --json
# Uses $FAKE_NVML_LIB if set, else target/release/libnvidia_ml.so, else target/debug/.
# The node is shared through $FAKE_NVML_STATE (default: per scenario under /tmp/fake-nvml-$UID).
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
while getopts s: opt; do
    case $opt in
        s) FAKE_NVML_SCENARIO=$(cd "$(dirname "$OPTARG")" && pwd)/$(basename "$OPTARG"); export FAKE_NVML_SCENARIO ;;
        *) echo "usage: $0 [-s SCENARIO.toml] COMMAND [ARGS...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-s SCENARIO.toml] COMMAND [ARGS...]" >&2; exit 2; }

lib=${FAKE_NVML_LIB:-}
if [ -z "$lib" ]; then
    for candidate in "$root/target/release/libnvidia_ml.so" "$root/target/debug/libnvidia_ml.so"; do
        if [ -f "$candidate" ]; then lib=$candidate; break; fi
    done
fi
[ -n "$lib" ] || { echo "no libnvidia_ml.so: run 'cargo build --release -p fake-nvml' first" >&2; exit 1; }

dir=${TMPDIR:-/tmp}/fake-nvml-lib-$(id -u)
mkdir -p "$dir"
ln -sf "$lib" "$dir/libnvidia-ml.so.1"
LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
exec "$@"
