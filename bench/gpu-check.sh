#!/usr/bin/env bash
# bench/gpu-check.sh [OUT_DIR]: gpupilot on a real GPU machine, in under 8 minutes.
#
#   doctor; status --json against nvidia-smi (each mismatch said); bench gemm (FP32, BF16,
#   FP16) and bench memory; a 5-point power sweep on GPU 0 (skipped, and said, where setting
#   a cap is refused); a 2-minute bench burn; every GPU's power cap from before put back and
#   checked; PyTorch's GEMM on the same GPU when `python3 -c 'import torch'` works there.
#
# Everything goes into OUT_DIR (default ./gpu-check-out): gpu-check.json (one object, each
# step's exit status, time and output), gpu-check.log, and each step's raw output.
#
# Needs: the gpupilot binary ($GPUPILOT, else `gpupilot` on PATH, else ./gpupilot), bash,
# coreutils, awk, and nvidia-smi ($NVIDIA_SMI to name another). python3 and jq are not needed.
# Run as root to sweep caps. Exit status: 0 every step passed, 1 some step failed,
# 3 no NVIDIA GPU here (said on the first line, nothing else run).
#
# cuBLAS: gpupilot looks for libcublas.so and libcublas.so.13. Where only a CUDA 12
# libcublas.so.12 is installed (a CUDA toolkit's lib64, or PyTorch's nvidia/cublas/lib), the
# script links it as OUT_DIR/lib/libcublas.so and puts that first on LD_LIBRARY_PATH.

set -u

OUT=${1:-./gpu-check-out}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu-check.log
JSON=$OUT/gpu-check.json
: >"$LOG"
SMI=${NVIDIA_SMI:-nvidia-smi}
GP=${GPUPILOT:-}
if [ -z "$GP" ]; then
    if command -v gpupilot >/dev/null 2>&1; then GP=$(command -v gpupilot); else GP=./gpupilot; fi
fi
# A home of its own: its daemon, its events, nothing left in the user's.
export GPUPILOT_HOME=$OUT/home
unset GPUPILOT_SOURCE GPUPILOT_SYSTEM
START=$(date +%s)

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }

# A JSON string of $1 (backslash, quote and control characters escaped).
json_str() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\r'/\\r}
    s=${s//$'\t'/\\t}
    s=$(printf '%s' "$s" | tr -d '\000-\010\013\014\016-\037')
    printf '"%s"' "$s"
}

# Output that is one JSON object or array goes in as it is; anything else as a string.
json_or_str() {
    local f=$1 first last
    first=$(tr -d ' \n\t' <"$f" | head -c 1)
    last=$(tr -d ' \n\t' <"$f" | tail -c 1)
    if { [ "$first" = "{" ] && [ "$last" = "}" ]; } || { [ "$first" = "[" ] && [ "$last" = "]" ]; }; then
        cat "$f"
    else
        json_str "$(head -c 20000 "$f")"
    fi
}

FIELDS=()   # "key": value, in order
add() { FIELDS+=("$(json_str "$1"): $2"); }
FAILED=0

# step NAME SECONDS CMD...: run CMD with a time limit, stdout to NAME.out, stderr to
# NAME.err; adds {"rc", "seconds", "output", "stderr"} under NAME.
step() {
    local name=$1 limit=$2
    shift 2
    log "$name: $*"
    local t0 rc
    t0=$(date +%s.%N)
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    rc=$?
    local secs
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    [ "$rc" = 0 ] || FAILED=1
    [ "$rc" = 124 ] && log "$name: stopped after $limit s"
    log "$name: exit $rc in $secs s"
    add "$name" "{\"command\": $(json_str "$*"), \"rc\": $rc, \"seconds\": $secs, \"output\": $(json_or_str "$OUT/$name.out"), \"stderr\": $(json_str "$(tail -c 4000 "$OUT/$name.err")")}"
    return "$rc"
}

write_json() {
    {
        printf '{\n'
        local i n=${#FIELDS[@]}
        for ((i = 0; i < n; i++)); do
            printf '  %s%s\n' "${FIELDS[$i]}" "$([ $((i + 1)) -lt "$n" ] && echo ,)"
        done
        printf '}\n'
    } >"$JSON"
}

add script '"bench/gpu-check.sh"'
add started "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
add host "$(json_str "$(uname -n)")"

# --- Is there a GPU at all? ---------------------------------------------------------------
QUERY=index,name,uuid,memory.total,power.limit,temperature.gpu,clocks.max.sm
if ! SMI_CSV=$(timeout 30 "$SMI" --query-gpu=$QUERY --format=csv,noheader,nounits 2>&1) ||
    [ -z "$SMI_CSV" ]; then
    log "no NVIDIA GPU here: \`$SMI --query-gpu\` gave: ${SMI_CSV:-nothing}"
    add gpu_present false
    add reason "$(json_str "nvidia-smi: ${SMI_CSV:-no output}")"
    write_json
    exit 3
fi
add gpu_present true
add nvidia_smi "$(json_str "$SMI_CSV")"
add driver "$(json_str "$(timeout 30 "$SMI" --query-gpu=driver_version --format=csv,noheader | head -n 1)")"
NGPU=$(printf '%s\n' "$SMI_CSV" | grep -c .)
log "$NGPU GPU(s): $(printf '%s\n' "$SMI_CSV" | cut -d, -f2 | sort -u | tr '\n' ' ')"
if [ ! -x "$GP" ] && ! command -v "$GP" >/dev/null 2>&1; then
    log "no gpupilot binary at $GP (set GPUPILOT=PATH)"
    add gpupilot_missing "$(json_str "$GP")"
    write_json
    exit 1
fi
add gpupilot_version "$(json_str "$("$GP" --version 2>&1)")"

# --- The caps to put back -----------------------------------------------------------------
ORIG_CAPS=$(timeout 30 "$SMI" --query-gpu=index,power.limit --format=csv,noheader,nounits)
add caps_before "$(json_str "$ORIG_CAPS")"
restore_caps() {
    local idx cap now
    while IFS=', ' read -r idx cap; do
        [ -n "$idx" ] || continue
        now=$(timeout 30 "$SMI" -i "$idx" --query-gpu=power.limit --format=csv,noheader,nounits | tr -d ' ')
        if awk -v a="$now" -v b="$cap" 'BEGIN { exit !(a - b > 0.5 || b - a > 0.5) }'; then
            log "GPU $idx: cap $now W, was $cap W: putting it back"
            timeout 30 "$SMI" -i "$idx" -pl "$cap" >>"$LOG" 2>&1 || log "GPU $idx: could not put $cap W back"
        fi
    done <<<"$ORIG_CAPS"
}
DPID=
cleanup() {
    restore_caps
    if [ -n "$DPID" ]; then kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; fi
}
trap 'cleanup; write_json; exit 130' INT TERM HUP

# --- cuBLAS where gpupilot finds it -------------------------------------------------------
find_cublas() {
    local d f
    for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/lib/x86_64-linux-gnu \
        /usr/local/lib/python3*/dist-packages/nvidia/cublas/lib \
        /usr/local/lib/python3*/site-packages/nvidia/cublas/lib \
        /usr/lib/python3/dist-packages/nvidia/cublas/lib \
        /opt/conda/lib /opt/conda/lib/python3*/site-packages/nvidia/cublas/lib \
        "$HOME"/.local/lib/python3*/site-packages/nvidia/cublas/lib; do
        for f in "$d"/libcublas.so.13 "$d"/libcublas.so.12; do
            [ -e "$f" ] && { printf '%s\n' "$f"; return 0; }
        done
    done
    if command -v python3 >/dev/null 2>&1; then
        d=$(timeout 60 python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
        for f in "$d"/libcublas.so.13 "$d"/libcublas.so.12; do
            [ -n "$d" ] && [ -e "$f" ] && { printf '%s\n' "$f"; return 0; }
        done
    fi
    return 1
}
if CUBLAS=$(find_cublas); then
    mkdir -p "$OUT/lib"
    ln -sf "$CUBLAS" "$OUT/lib/libcublas.so"
    export LD_LIBRARY_PATH="$OUT/lib:$(dirname "$CUBLAS")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "cuBLAS: $CUBLAS"
    add cublas "$(json_str "$CUBLAS")"
else
    log "cuBLAS: none found (bench gemm will say so)"
    add cublas null
fi

# --- doctor, and status against nvidia-smi ------------------------------------------------
step doctor 120 "$GP" --source nvml doctor --json
step status 60 "$GP" --source nvml status --json

# Fields of each GPU from status --json (pretty-printed: a GPU's own fields sit 6 spaces in).
status_field() { # GPU FIELD
    awk -v gpu="$1" -v key="\"$2\":" '
        /^      "index": / { idx = $2; sub(/,$/, "", idx) }
        idx == gpu && index($0, "      " key) == 1 && substr($0, 7 + length(key), 1) == " " {
            v = substr($0, 8 + length(key)); sub(/,$/, "", v); gsub(/^"|"$/, "", v); print v; exit
        }' "$OUT/status.out"
}
MISMATCHES=()
while IFS=',' read -r idx name uuid mem cap temp clock; do
    idx=${idx// /}; name=${name# }; uuid=${uuid// /}; mem=${mem// /}; cap=${cap// /}
    temp=${temp// /}; clock=${clock// /}
    g_name=$(status_field "$idx" name)
    g_uuid=$(status_field "$idx" uuid)
    g_mem=$(status_field "$idx" memory_total_bytes)
    g_cap=$(status_field "$idx" power_limit_w)
    g_temp=$(status_field "$idx" temperature_c)
    g_clock=$(status_field "$idx" sm_clock_max_mhz)
    [ "$g_name" = "$name" ] || MISMATCHES+=("GPU $idx name: gpupilot '$g_name', nvidia-smi '$name'")
    [ "$g_uuid" = "$uuid" ] || MISMATCHES+=("GPU $idx uuid: gpupilot '$g_uuid', nvidia-smi '$uuid'")
    awk -v g="$g_mem" -v s="$mem" 'BEGIN { exit !(g != "" && g != "null" && (g / 1048576 - s) ^ 2 <= 1) }' ||
        MISMATCHES+=("GPU $idx memory.total: gpupilot ${g_mem} B, nvidia-smi ${mem} MiB")
    awk -v g="$g_cap" -v s="$cap" 'BEGIN { exit !(g != "" && g != "null" && (g - s) ^ 2 <= 0.25) }' ||
        MISMATCHES+=("GPU $idx power.limit: gpupilot ${g_cap} W, nvidia-smi ${cap} W")
    # Read a moment apart: a few degrees is the GPU, not a disagreement.
    awk -v g="$g_temp" -v s="$temp" 'BEGIN { exit !(g != "" && g != "null" && (g - s) ^ 2 <= 9) }' ||
        MISMATCHES+=("GPU $idx temperature.gpu: gpupilot ${g_temp} C, nvidia-smi ${temp} C")
    [ "$g_clock" = "$clock" ] || MISMATCHES+=("GPU $idx clocks.max.sm: gpupilot ${g_clock} MHz, nvidia-smi ${clock} MHz")
done <<<"$SMI_CSV"
if [ ${#MISMATCHES[@]} -eq 0 ]; then
    log "status --json agrees with nvidia-smi on $NGPU GPU(s)"
    add status_vs_nvidia_smi '[]'
else
    FAILED=1
    list=
    for m in "${MISMATCHES[@]}"; do
        log "mismatch: $m"
        list+="${list:+, }$(json_str "$m")"
    done
    add status_vs_nvidia_smi "[$list]"
fi

# --- GEMM and memory ----------------------------------------------------------------------
step bench_gemm 200 "$GP" bench gemm --precision all --duration 10s --json
step bench_memory 90 "$GP" bench memory --duration 10s --json

# PyTorch's GEMM on GPU 0, the same sizes and precisions, for comparison (optional).
TORCH_GEMM='
import json, time, torch
torch.backends.cuda.matmul.allow_tf32 = False
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0), "gemm": []}
for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
    n = 16384
    a = torch.randn(n, n, device="cuda", dtype=dt) / 4
    b = torch.randn(n, n, device="cuda", dtype=dt) / 4
    for _ in range(3):
        c = a @ b
    torch.cuda.synchronize()
    windows = []
    for _ in range(5):
        k, t = 0, time.perf_counter()
        while time.perf_counter() - t < 2.0:
            for _ in range(4):
                c = a @ b
            torch.cuda.synchronize()
            k += 4
        windows.append(k * 2 * n ** 3 / (time.perf_counter() - t) / 1e12)
    windows.sort()
    out["gemm"].append({"precision": name, "n": n, "tflops": windows[2], "tflops_windows": windows})
    del a, b, c
print(json.dumps(out))
'
if command -v python3 >/dev/null 2>&1 &&
    timeout 120 python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    step torch_gemm 150 python3 -c "$TORCH_GEMM" || true
else
    log "torch_gemm: no python3 with a CUDA PyTorch here; skipped"
    add torch_gemm '"skipped: no python3 with a CUDA PyTorch"'
fi

# --- A daemon of this home, for the sweep and the burn (it puts caps back when it stops) --
"$GP" --source nvml daemon --restore-on-exit >"$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 1 40); do
    "$GP" ps >/dev/null 2>&1 && break
    sleep 0.5
done

# --- Power sweep: 5 caps on GPU 0 ---------------------------------------------------------
if "$GP" bench power-sweep --help >/dev/null 2>&1; then
    LIMITS=$(timeout 30 "$SMI" -i 0 --query-gpu=power.limit,power.min_limit,power.max_limit --format=csv,noheader,nounits | tr -d ' ')
    CUR=${LIMITS%%,*}
    if [ "$(id -u)" != 0 ]; then
        log "power sweep: not root, so no cap can be set; nothing swept"
        add power_sweep '"skipped: setting a power cap needs root"'
    elif ! timeout 30 "$SMI" -i 0 -pl "$CUR" >"$OUT/cap-probe.out" 2>&1; then
        log "power sweep: setting GPU 0's cap is refused here ($(tr '\n' ' ' <"$OUT/cap-probe.out")); nothing swept"
        add power_sweep "$(json_str "skipped: setting the cap is refused: $(cat "$OUT/cap-probe.out")")"
    else
        CAPS=$(awk -F, '{ max = int($3); min = int($2 + 0.999); step = int((max - min) / 4); if (step < 1) step = 1; printf "%d:%d:%d", max, min, step }' <<<"$LIMITS")
        log "power sweep: caps $CAPS on GPU 0"
        step power_sweep 200 "$GP" --source nvml bench power-sweep --gpu 0 --caps "$CAPS" --warmup 5s --window 10s --json
    fi
else
    log "power sweep: this gpupilot has no \`bench power-sweep\`"
    add power_sweep '"missing: this gpupilot has no bench power-sweep"'
fi

# --- Burn: 2 minutes on every GPU ---------------------------------------------------------
if "$GP" bench burn --help >/dev/null 2>&1; then
    step burn 200 "$GP" --source nvml bench burn --duration 2m --json
else
    log "burn: this gpupilot has no \`bench burn\`"
    add burn '"missing: this gpupilot has no bench burn"'
fi

# --- Caps put back, and checked -----------------------------------------------------------
cleanup
DPID=
trap - INT TERM HUP
CAPS_AFTER=$(timeout 30 "$SMI" --query-gpu=index,power.limit --format=csv,noheader,nounits)
add caps_after "$(json_str "$CAPS_AFTER")"
if [ "$(tr -d ' ' <<<"$CAPS_AFTER")" = "$(tr -d ' ' <<<"$ORIG_CAPS")" ]; then
    log "caps as before: $(tr '\n' ' ' <<<"$CAPS_AFTER")"
    add caps_restored true
else
    FAILED=1
    log "caps NOT as before: before $(tr '\n' ' ' <<<"$ORIG_CAPS"), after $(tr '\n' ' ' <<<"$CAPS_AFTER")"
    add caps_restored false
fi
add seconds $(($(date +%s) - START))
add passed "$([ "$FAILED" = 0 ] && echo true || echo false)"
write_json
log "done in $(($(date +%s) - START)) s: $JSON"
exit "$FAILED"
