#!/usr/bin/env bash
# Time spent by `attnlab run` outside the kernel (issue 8, part 7).
#
#   scripts/run_overhead.sh [ATTNLAB] [RUNS] [IMPL]
#
# Makes float32 Q, K, V of shape (1, 8, 4096, 128) (16 MiB each) with numpy, runs
# `ATTNLAB run --impl IMPL` RUNS times (default build/attnlab, 5, flash) and prints, per run
# and as medians: the whole process's wall time, the kernel time attnlab reports, and the
# difference (loading, checking, writing O and LSE). Target: overhead <= 150 ms.
# The load average is printed too: on a busy machine the numbers are noisy.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
exe="${1:-$here/build/attnlab}"
runs="${2:-5}"
impl="${3:-flash}"
[[ -x "$exe" ]] || { echo "error: $exe is not an executable (build attnlab first)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 - "$exe" "$runs" "$impl" "$work" <<'EOF'
import os, re, statistics, subprocess, sys, time
import numpy as np

exe, runs, impl, work = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rng = np.random.default_rng(1)
paths = {}
for name in ("q", "k", "v"):
    paths[name] = os.path.join(work, name + ".npy")
    np.save(paths[name], rng.standard_normal((1, 8, 4096, 128), dtype=np.float32))
cmd = [exe, "run", "--impl", impl, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
       "--out", os.path.join(work, "o.npy"), "--lse", os.path.join(work, "lse.npy")]
print("command:", " ".join(cmd))
print("load before:", open("/proc/loadavg").read().split()[:3])
walls, kernels = [], []
for r in range(runs):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"attnlab failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    kernel = float(re.search(r"time ([0-9.]+) ms", p.stdout).group(1)) / 1e3
    walls.append(wall)
    kernels.append(kernel)
    print(f"run {r + 1}: wall {wall * 1e3:7.1f} ms, kernel {kernel * 1e3:7.1f} ms, "
          f"outside the kernel {(wall - kernel) * 1e3:6.1f} ms")
over = [w - k for w, k in zip(walls, kernels)]
print(f"median: wall {statistics.median(walls) * 1e3:.1f} ms, kernel "
      f"{statistics.median(kernels) * 1e3:.1f} ms, outside the kernel "
      f"{statistics.median(over) * 1e3:.1f} ms (target <= 150 ms)")
print("load after:", open("/proc/loadavg").read().split()[:3])
EOF
