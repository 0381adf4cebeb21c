#!/usr/bin/env bash
# The GPU checklist (../shared/GPU_CHECKLIST.md) in one command, within a time budget.
#
#   OUT=/tmp/gpu bash benchmarks/gpu_checklist.sh [seconds, default 400]
#
# Logs go to $OUT: doctor.log, pytest.log (the cuda tests), sync.log (no host sync inside a
# step, eager or captured; eager and captured losses equal over 50 steps; CPU/GPU parity),
# examples.log (the training scripts on synthetic data), step.log (benchmarks/gpu_step.py at
# batch 128 and 512: the eager step, the eager step with CuPy's products, the captured step,
# each beside PyTorch eager; goal at batch 128: the captured step <= 0.85x PyTorch's),
# epoch.log (benchmarks/gpu_epoch.py: a 50,000-image Mixer epoch through the whole pipeline,
# with and without the graph; goal under 4.5 s on an H100), profile.log (benchmarks/gpu_profile.py:
# the kernels a step runs, counted by CUPTI, beside PyTorch eager's), cublas.log (the capturable
# products of tinymlp/fast/cublas.py against cupy.matmul, and replayed in a graph). The cuda tests
# run in the background beside the sync check and the examples; the benchmarks run alone once
# they are done.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tinymlp-gpu}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
PY=${PYTHON:-python3}
start=$(date +%s)
deadline=$((start + ${1:-400}))
left() { local l=$((deadline - $(date +%s))); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
step() {   # step CAP LOG COMMAND...: run COMMAND with at most CAP seconds (less if the budget is short)
    local cap log t0; cap=$(left "$1"); log=$2; shift 2
    if [ "$cap" -le 5 ]; then echo "### skipped (no time left): $*" >>"$log"; return; fi
    t0=$(date +%s)
    echo "### $* (cap ${cap}s)" >>"$log"
    timeout "$cap" "$@" >>"$log" 2>&1
    echo "### rc=$? in $(( $(date +%s) - t0 )) s" >>"$log"
}

nvidia-smi -L >"$OUT/doctor.log" 2>&1
step 30 "$OUT/doctor.log" "$PY" -m tinymlp doctor
step 30 "$OUT/doctor.log" "$PY" -c "import cupy; cupy.show_config()"

( step 300 "$OUT/pytest.log" "$PY" -m pytest -m cuda -q -rfEw --maxfail=30 --durations=10 \
      -p no:cacheprovider ) &
tests=$!

step 150 "$OUT/sync.log" "$PY" benchmarks/gpu_sync_check.py
step 60 "$OUT/cublas.log" "$PY" benchmarks/gpu_cublas_check.py
runs=$(mktemp -d)
step 60 "$OUT/examples.log" "$PY" examples/train_cifar_mixer.py --device cuda --dataset synthetic \
    --epochs 2 --no-progress --out "$runs/mixer"
step 50 "$OUT/examples.log" "$PY" examples/train_cifar_gmlp.py --device cuda --dataset synthetic \
    --epochs 2 --no-progress --out "$runs/gmlp"
step 50 "$OUT/examples.log" "$PY" examples/train_cifar_gmlp.py --device cuda --dataset synthetic \
    --epochs 2 --no-progress --attn-dim 64 --out "$runs/amlp"
step 40 "$OUT/examples.log" "$PY" examples/train_cifar_mixer.py --device cuda --dataset synthetic \
    --synthetic-size 512 --epochs 1 --out "$runs/small"
ls -R "$runs/small" >>"$OUT/examples.log" 2>&1
step 40 "$OUT/examples.log" "$PY" examples/train_text_gmlp.py --device cuda --dataset synthetic \
    --epochs 1 --limit-batches 3 --no-progress --out "$runs/text"
wait "$tests"

step 90 "$OUT/step.log" "$PY" benchmarks/gpu_step.py --batch-size 128 --steps 20 --warmup 3
step 120 "$OUT/epoch.log" "$PY" benchmarks/gpu_epoch.py --images 50000 --epochs 2 --batch-size 128
step 70 "$OUT/step.log" "$PY" benchmarks/gpu_step.py --batch-size 512 --steps 20 --warmup 3 --ways eager,graph
step 90 "$OUT/profile.log" "$PY" benchmarks/gpu_profile.py --models mixer_cifar,gmlp_cifar,amlp_cifar --top 12
echo "checklist done in $(( $(date +%s) - start )) s"
