#!/usr/bin/env bash
# The GPU check, from the bundle scripts/lab gpu-bundle makes (scripts/gpu/bundle.sh), on a bare
# machine with an NVIDIA GPU: nothing is built or installed there.
#
#   BUNDLE/run.sh OUTDIR             every step below (each step has a time limit)
#   BUNDLE/run.sh --cpu-only OUTDIR  the steps that need no GPU (tests that need none, the
#                                    PyTorch comparison on the CPU where a Python with torch is
#                                    found, the thread scaling, the summary): here, and in CI
#
#   1. facts -> device.txt: machine, CPU, nvidia-smi, the CUDA device, its FP32 and bf16 tensor-core
#      peaks and its memory's measured bandwidth (`attnlab cuda --bandwidth`), Python and PyTorch
#   2. tests -> tests.txt: the CUDA tests (host side, emulated device code, the device itself)
#      and the agreement grid, sparse-pattern and special-value cases of the CUDA kernels
#   3. kernel times -> kernel_times.csv: `attnlab cuda --time` (the device memory's read and copy
#      bandwidth measured first): cuda_flash and cuda_naive in float32, causal and not, q_len =
#      kv_len 512..16384; cuda_flash_bf16 (tensor cores) 512..32768, both at head_dim 64 and 128,
#      MHA 16/16 and GQA 16/4, batch 2; cuda_decode (one query row, 32/8 heads, head_dim 128)
#      over caches of 4k, 32k and 128k tokens stored f32, bf16, f16, q8_0, q4_0, u8 and fp8_e4m3,
#      contiguous and paged (16-token blocks); every point verified on sampled rows first;
#      kernel-only times from back-to-back launches between CUDA events
#   4. PyTorch -> torch.csv: scaled_dot_product_attention in float32 (the backend it picks) and
#      in bf16 on the same inputs, timed with CUDA events, kernel only; the outputs go through
#      .npy files to `attnlab verify --expect` against cuda_flash and the float64 reference
#   5. CPU thread scaling -> threads.csv: `attnlab sweep` of flash (prefill) and decode at
#      1, 2, 4, ... up to every core, % of the peak measured in the same run
#   (about 5 minutes on an H100 or H200 with 16 cores; every limit together 565 s, under the 10
#   minutes a device call may take)
#   6. summary.md (summarize.py); details.tar.gz: the sweep folder, test XML, every step's log
# OUTDIR receives exactly those 8 files (a GPU machine returns at most 8).
# Environment: ATTN_PYTHON (default python3: the Python with torch), ATTN_BUNDLE_WORK (scratch
# folder, default a fresh one under /tmp).
# Exit status: 0 every step passed; 1 a test or verification failed or a step did not finish;
# 2 bad usage, or the bundle's binaries cannot start here.
set -uo pipefail

B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cpu_only=0
if [[ "${1:-}" == --cpu-only ]]; then
  cpu_only=1
  shift
fi
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: $0 [--cpu-only] OUTDIR" >&2
  exit 2
fi
OUT="$1"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
W="${ATTN_BUNDLE_WORK:-$(mktemp -d /tmp/attn-gpu-check.XXXXXX)}"
mkdir -p "$W/logs"
PY="${ATTN_PYTHON:-python3}"
EXE="$B/bin/attnlab"
TESTS="$B/bin/attn_tests"
export ATTNLAB_EXE="$EXE"  # the CLI tests run the bundle's attnlab, not the build folder's
export PYTHONUNBUFFERED=1
START=$SECONDS
status=0
log() { echo "[run.sh +$((SECONDS - START))s] $*" | tee -a "$OUT/log.txt" >&2; }
: >"$OUT/log.txt"

# step NAME LIMIT_S OUTFILE CMD...: runs CMD with a time limit, its output into OUTFILE; records
# ok / FAILED / TIMED OUT in log.txt.
step() {
  local name="$1" limit="$2" file="$3" t0=$SECONDS rc=0
  shift 3
  timeout --kill-after=10 "$limit" "$@" >"$file" 2>&1 || rc=$?
  if ((rc == 0)); then
    log "step $name: ok ($((SECONDS - t0)) s)"
  elif ((rc == 124 || rc == 137)); then
    log "step $name: TIMED OUT after $limit s"
    status=1
  else
    log "step $name: FAILED (exit $rc, $((SECONDS - t0)) s)"
    status=1
  fi
  return 0
}

# The binaries start, with the machine's own libstdc++ or, when that is older than the one they
# were built with, the bundle's fallback copy.
if ! "$EXE" list >"$W/logs/loader.txt" 2>&1; then
  if grep -q "GLIBCXX\|CXXABI\|GCC_" "$W/logs/loader.txt"; then
    export LD_LIBRARY_PATH="$B/lib/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "this machine's libstdc++ is older than the bundle's build: using lib/fallback"
  fi
  if ! "$EXE" list >"$W/logs/loader.txt" 2>&1; then
    log "the bundle's attnlab does not start here:"
    cat "$W/logs/loader.txt" | tee -a "$OUT/log.txt" >&2
    exit 2
  fi
fi
log "bundle $(sed -n 's/^commit: //p' "$B/MANIFEST"); mode $([[ $cpu_only == 1 ]] && echo cpu-only || echo gpu); work $W"

facts() {
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm); $(nproc) cores; $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "bundle: $(sed -n 's/^commit: //p' "$B/MANIFEST"); $(sed -n 's/^build: //p' "$B/MANIFEST")"
  "$EXE" cuda --bandwidth
  "$EXE" list | sed -n '1,3p'
  echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1 | tail -1)"
  "$PY" -c 'import torch; print("torch:", torch.__version__, "cuda", torch.version.cuda, "device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")' 2>&1 | tail -1
  if command -v nvidia-smi >/dev/null; then
    echo "--- nvidia-smi"
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total,power.limit --format=csv
  else
    echo "nvidia-smi: not found"
  fi
}
export EXE B PY
export -f facts
step facts 20 "$OUT/device.txt" bash -c facts
if ((!cpu_only)) && grep -q "^CUDA: unavailable" "$OUT/device.txt"; then
  log "no usable CUDA device: $(sed -n 's/^CUDA: unavailable: //p' "$OUT/device.txt"); the GPU steps cannot run"
  status=1
fi

# 2. tests, as 4 gtest shards in parallel (each a CUDA context; ~1000 agreement cases otherwise
# run one after another). Without a GPU the device cases skip with the reason; the emulated run.
# ATTN_L2_BYTES: the tests' tile plans, as ctest sets it (for this step only: the sweep below
# plans for the machine's own caches).
tests() {
  local i rc=0 pids=()
  for i in 0 1 2 3; do
    GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i ATTN_L2_BYTES=1048576 "$TESTS" --gtest_brief=1 \
      --gtest_filter='Cuda*:*Emulated*:*KernelAgreement*/cuda_*:*PatternAgreement*/cuda_*:*Extreme*/cuda_*:*SpecialValues*/cuda_*' \
      --gtest_output="xml:$W/tests_$i.xml" >"$W/logs/tests_$i.txt" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do wait "${pids[$i]}" || rc=1; done
  for i in 0 1 2 3; do echo "=== shard $i of 4"; cat "$W/logs/tests_$i.txt"; done
  return "$rc"
}
export TESTS W
export -f tests
step tests 70 "$OUT/tests.txt" bash -c tests

# 3. kernel-only times (needs the device).
if ((!cpu_only)); then
  grid=(--q-len 512,1024,2048,4096,8192,16384 --head-dim 64,128 --gqa-groups 1,4 --batch 2 --q-heads 16 --reps 5
        --verify-rows 64 --naive-max-seq 4096)
  step cuda-causal 60 "$W/logs/cuda_causal.txt" "$EXE" cuda --time "${grid[@]}" --csv "$W/kt_causal.csv"
  step cuda-nomask 60 "$W/logs/cuda_nomask.txt" "$EXE" cuda --time "${grid[@]}" --causal=false --csv "$W/kt_nomask.csv"
  tc=(--impl cuda_flash_bf16 --dtype bf16 --q-len 512,1024,2048,4096,8192,16384,32768 --head-dim 64,128
      --gqa-groups 1,4 --batch 2 --q-heads 16 --reps 3 --verify-rows 32)
  step tensor-causal 60 "$W/logs/tensor_causal.txt" "$EXE" cuda --time "${tc[@]}" --csv "$W/kt_tc_causal.csv"
  step tensor-nomask 60 "$W/logs/tensor_nomask.txt" "$EXE" cuda --time "${tc[@]}" --causal=false --csv "$W/kt_tc_nomask.csv"
  dec=(--impl cuda_decode --q-len 1 --kv-len 4096,32768,131072 --q-heads 32 --gqa-groups 4 --head-dim 128 --batch 1
       --causal --kv-block 0,16 --reps 3 --verify-rows 32)
  step decode-16bit 60 "$W/logs/decode_16bit.txt" "$EXE" cuda --time "${dec[@]}" --dtype f32,bf16,f16 --csv "$W/kt_dec16.csv"
  step decode-quantized 60 "$W/logs/decode_quantized.txt" "$EXE" cuda --time "${dec[@]}" --kv-dtype q8_0,q4_0,u8,fp8_e4m3 \
    --csv "$W/kt_decq.csv"
  {
    cat "$W/kt_causal.csv" 2>/dev/null
    for f in kt_nomask kt_tc_causal kt_tc_nomask kt_dec16 kt_decq; do tail -n +2 "$W/$f.csv" 2>/dev/null; done
  } >"$OUT/kernel_times.csv"
else
  echo "kernel,skipped" >"$OUT/kernel_times.csv"
  echo "--cpu-only: no kernel times" >"$W/logs/cuda_causal.txt"
fi

# 4. PyTorch on the same inputs. --cpu-only: the same script on the CPU (tiny shapes, the CPU
# flash kernel), when a Python with torch is found; else the step says why it was left out.
if "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
  if ((cpu_only)); then
    step torch 60 "$W/logs/torch.txt" "$PY" "$B/torch_compare.py" --attnlab "$EXE" --work "$W/torch" \
      --csv "$OUT/torch.csv" --device cpu --impl flash --quick
  else
    step torch 60 "$W/logs/torch.txt" "$PY" "$B/torch_compare.py" --attnlab "$EXE" --work "$W/torch" \
      --csv "$OUT/torch.csv" --device cuda --impl cuda_flash
  fi
else
  # A bare GPU machine has no torch: the comparison is left out (summary.md quotes the published
  # anchors instead), not the run failed - every other step still says what the GPU did.
  echo "impl,skipped" >"$OUT/torch.csv"
  log "step torch: skipped ($PY cannot import torch and numpy: no PyTorch comparison on this machine)"
fi

# 5. CPU thread scaling: 1, 2, 4, ... and every core.
cores="$(nproc)"
threads="" t=1
while ((t < cores)); do threads+="$t, "; t=$((t * 2)); done
threads+="$cores"
cat >"$W/threads.json" <<EOF
{
  "description": "CPU thread scaling on the GPU machine (run.sh): flash prefill (16/16 heads, head_dim 128, q_len = kv_len = 2048, no mask) and decode (32/8 heads, head_dim 128, one query row, kv_len 32768) at 1, 2, 4, ... threads up to every core.",
  "grids": [
    {"implementations": ["flash"], "q_heads": 16, "q_len": 2048, "head_dim": 128, "threads": [$threads]},
    {"implementations": ["decode"], "q_heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 32768, "head_dim": 128,
     "causal": true, "threads": [$threads]}
  ],
  "repetitions": 3,
  "min_time_s": 0.1,
  "time_cap_s": 20,
  "verify_rows": 32
}
EOF
step threads 40 "$W/logs/threads.txt" "$EXE" sweep --experiment "$W/threads.json" --out "$W/threads" --peak-repeats 1
cp "$W/threads/results.csv" "$OUT/threads.csv" 2>/dev/null || echo "kernel,skipped" >"$OUT/threads.csv"

# 6. summary and details.
step summary 15 "$W/logs/summary.txt" "$PY" "$B/summarize.py" "$OUT" --manifest "$B/MANIFEST" \
  --mode "$([[ $cpu_only == 1 ]] && echo cpu-only || echo gpu)"
log "done: exit status $status"
cp "$B/MANIFEST" "$W/"
tar -czf "$OUT/details.tar.gz" -C "$W" --exclude='torch/*.npy' . 2>/dev/null || log "details.tar.gz: tar failed"
echo "run.sh: $(ls "$OUT" | wc -l) files in $OUT; summary: $OUT/summary.md" >&2
exit "$status"
