# shellcheck shell=bash
# The shapes the emulated-CPU checks verify (scripts/qemu_check.sh, scripts/bochs_check.sh), one
# per entry: small, so the float64 reference and naive stay quick under emulation, and together
# they reach every SIMD kernel (simd, threaded, flash; decode at q_len 1 and 16) with vector
# tails, GQA, windows, per-batch kv lengths (0 included), both layouts and fully masked rows.
# shellcheck disable=SC2034  # used by the scripts that source this file
SHAPES=(
  "--batch 1 --q-heads 4 --kv-heads 2 --q-len 37 --kv-len 45 --head-dim 36 --causal"
  "--batch 2 --q-heads 8 --kv-heads 2 --q-len 1 --kv-len 300 --head-dim 64 --causal"
  "--batch 3 --q-heads 6 --kv-heads 2 --q-len 16 --kv-len 64 --head-dim 24 --window 8,0 --kv-lens 0,64,33 --layout bshd"
  "--batch 1 --q-heads 2 --kv-heads 1 --q-len 70 --kv-len 200 --head-dim 128 --causal-top-left"
  "--batch 1 --q-heads 3 --kv-heads 3 --q-len 40 --kv-len 17 --head-dim 8 --causal"
)
