#!/usr/bin/env bash
# Chapter 6's GPU check in one command, for a lent machine with one NVIDIA GPU.
#
#   bash scripts/device_check.sh              # writes $OUT/gpu_<device>.json and its log
#   bash scripts/device_check.sh --rehearse   # the same run on a CPU, at tiny sizes
#
# (`python3 scripts/gpu_check.py ...` from the repository root works as well: the script
# puts the repository on sys.path itself, so nothing needs installing.)
#
# No install step: it runs under the machine's own python3 (or $PYTHON), says which
# package is missing if one is, runs scripts/gpu_check.py under a hard time limit with
# its log beside the JSON in $OUT (a new temporary folder when OUT is unset), and
# prints the summary line of whatever file was written, last. Other arguments
# (--fail-section NAME, --device cuda:1) go to scripts/gpu_check.py. BUDGET_S (default
# 240) is the check's own budget; the hard limit is 45 s more: under five minutes in all.
set -u
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-240}

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "device_check: no $PY on PATH; set PYTHON to the interpreter that has torch" >&2
    exit 4
fi
# Needed: torch. Optional, each reported: what the check loses without it.
report=$("$PY" - <<'EOF'
import importlib.util

optional = {
    "numpy": "torch.utils.benchmark's Timer needs it: the agreement section would fail",
    "triton": "no do_bench agreement, no Triton read, paged or fp8-KV kernels",
    "pynvml": "clocks read by nvidia-smi instead of NVML (package nvidia-ml-py)",
}
if importlib.util.find_spec("torch") is None:
    print("MISSING torch")
for name, loss in optional.items():
    if importlib.util.find_spec(name) is None:
        print(f"optional package {name} is missing: {loss}")
EOF
)
echo "$report" | grep -v '^MISSING' | sed '/^$/d; s/^/device_check: /'
if echo "$report" | grep -q '^MISSING'; then
    missing=$(echo "$report" | sed -n 's/^MISSING //p' | tr '\n' ' ')
    echo "device_check: missing Python package(s) for $PY: ${missing}(the check cannot" \
        "run without them; carry them as wheels or use an image that has them)" >&2
    exit 4
fi

if ! command -v ncu >/dev/null 2>&1; then
    echo "device_check: ncu (Nsight Compute) is not on PATH: the ncu section is skipped"
fi

if [ -z "${OUT:-}" ]; then
    OUT=$(mktemp -d)
    echo "device_check: OUT is unset; writing to $OUT"
fi
mkdir -p "$OUT" || exit 2
log="$OUT/gpu_check.log"
limit=()
if command -v timeout >/dev/null 2>&1; then
    # TERM first: the check records the section it was in and keeps its file.
    limit=(timeout -k 10 "$((${BUDGET_S%.*} + 35))")
fi
started=$(date +%s)
PYTHONUNBUFFERED=1 ${limit[@]+"${limit[@]}"} "$PY" -m scripts.gpu_check \
    --budget-s "$BUDGET_S" --out-dir "$OUT" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "device_check: gpu_check.py exited with status $status after $(($(date +%s) - started)) s"

file=$(ls -t "$OUT"/gpu_*.json "$OUT"/rehearsal_*.json 2>/dev/null | head -n 1)
if [ -z "$file" ]; then
    echo "device_check: no JSON was written under $OUT (status $status); the log is $log"
    exit "$((status == 0 ? 1 : status))"
fi
"$PY" -m scripts.gpu_check --summarize "$file"
exit "$status"
