#!/usr/bin/env bash
# GPU check of the CUDA kernels (issue 5), for a machine with an NVIDIA GPU (compute
# capability 8.0 or newer: A100, H100/H200, ...) and nvcc (CUDA 12.x/13). Target: under 5
# minutes on an H200 with 16 cores.
#
#   1. builds with CUDA (Release, sm_80 + sm_90 + PTX) into $ATTN_GPU_BUILD_DIR (build-gpu/);
#   2. runs the CUDA tests: host side, the emulated device code, the real device, and the
#      registry's agreement grid and extreme-value tests for cuda_naive and cuda_flash;
#   3. `attnlab cuda --time`: kernel-only CUDA-event times, copies apart, TFLOP/s and the
#      fraction of the FP32 (non-tensor) peak, for causal q_len = kv_len = 512..8192,
#      head_dim 64/128, MHA (16/16) and GQA (16/4), batch 2, every point verified first;
#   4. the same grid as a sweep (experiments/gpu_check.json; wall times incl. copies).
# Everything lands in one results folder (default results/<date>-gpu_check):
#   device.txt nvidia-smi.txt build.log tests.txt tests.xml kernel_times.{txt,csv} sweep/
#   summary.txt (the flash line at q_len 4096, head_dim 128) log.txt
# Exit status: 0 all passed, 1 a test or verification failed, 2 no usable GPU / build failed.
# Usage: scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/results/$(date +%Y-%m-%d-%H%M%S)-gpu_check}"
BUILD="${ATTN_GPU_BUILD_DIR:-$ROOT/build-gpu}"
JOBS="$(nproc 2>/dev/null || echo 4)"
mkdir -p "$OUT"
START=$SECONDS
log() { echo "[gpu_check +$((SECONDS - START))s] $*" | tee -a "$OUT/log.txt" >&2; }
status=0

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed (see nvidia-smi.txt)"

NVCC="${CUDACXX:-$(command -v nvcc || true)}"
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
if [[ -z "$NVCC" ]]; then
  log "no nvcc (PATH, \$CUDACXX, /usr/local/cuda/bin): cannot build the CUDA kernels"
  exit 2
fi

log "build ($NVCC, $JOBS jobs) -> $BUILD"
"$ROOT/scripts/setup.sh" >> "$OUT/build.log" 2>&1 || log "scripts/setup.sh failed; building with what is installed"
if ! { cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTN_ENABLE_CUDA=ON \
         -DCMAKE_CUDA_COMPILER="$NVCC" -DATTN_BUILD_BENCH=OFF &&
       timeout 240 cmake --build "$BUILD" -j "$JOBS" --target attnlab attn_tests; } >> "$OUT/build.log" 2>&1; then
  log "build failed (tail of build.log follows)"
  tail -30 "$OUT/build.log" >&2
  exit 2
fi
EXE="$BUILD/attnlab"

"$EXE" cuda | tee "$OUT/device.txt"
if grep -q "unavailable" "$OUT/device.txt"; then
  log "no usable CUDA device; nothing to check"
  exit 2
fi

log "tests: CUDA suite + agreement grid + extremes for the CUDA kernels"
cd "$BUILD"
if ! timeout 120 ./attn_tests --gtest_brief=1 --gtest_output="xml:$OUT/tests.xml" \
    --gtest_filter='Cuda*:*Emulated*:*KernelAgreement*/cuda_*:*Extreme*/cuda_*' > "$OUT/tests.txt" 2>&1; then
  status=1
  log "TESTS FAILED (see tests.txt)"
fi
tail -5 "$OUT/tests.txt" >&2
cd "$ROOT"

log "kernel-only timings (attnlab cuda --time)"
if ! timeout 150 "$EXE" cuda --time --csv "$OUT/kernel_times.csv" 2>&1 | tee "$OUT/kernel_times.txt"; then
  status=1
  log "kernel timing: a verification failed or it did not finish (see kernel_times.txt)"
fi

log "sweep experiments/gpu_check.json"
if ! timeout 150 "$EXE" sweep --experiment "$ROOT/experiments/gpu_check.json" --out "$OUT/sweep" \
    --peak-repeats 1 > "$OUT/sweep.txt" 2>&1; then
  status=1
  log "sweep: failed or did not finish (see sweep.txt)"
fi

{
  echo "device: $(sed -n 's/^CUDA: //p' "$OUT/device.txt")"
  echo "cuda_flash, causal, batch 2, 16 heads, q_len = kv_len = 4096, head_dim 128 (kernel only):"
  awk -F, 'NR > 1 && $1 == "cuda_flash" && $5 == 4096 && $7 == 128 {
             printf "  kv_heads %s: %.3f ms, %.2f TFLOP/s = %.1f%% of the FP32 peak (%.1f TFLOP/s), verify %s\n",
                    $4, $10, $13, 100 * $15, $14, $16 }' "$OUT/kernel_times.csv" 2>/dev/null
  echo "tests: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.txt" | tr '\n' ' ')"
  echo "status: $status, $((SECONDS - START)) s"
} | tee "$OUT/summary.txt"
exit "$status"
