#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention beside the lab's CUDA kernel, on the same inputs
(part of the GPU bundle: scripts/gpu/run.sh step 4).

Per shape (batch 2, 16 query heads, causal or not, MHA or GQA 16/4):
  - float32: torch.nn.functional.scaled_dot_product_attention with whatever backend PyTorch picks
    (named from the profiler's largest kernel); bf16: the same call on the inputs rounded to bf16
    (flash / cuDNN / efficient attention on tensor cores): the bar for a later bf16 CUDA kernel.
  - time: like `attnlab cuda --time`: back-to-back calls between two CUDA events (enough for
    ~20 ms, 1 to 50), the median of 5 such runs; kernel only (inputs already on the device).
  - agreement: Q, K, V and PyTorch's O go through .npy files to `attnlab verify --impl IMPL
    --expect O.npy` (sampled rows against the float64 reference, then IMPL against the file).
    float32 must agree within the lab's float32 tolerance. For bf16 the inputs written are the
    bf16-rounded values (both sides compute on the same numbers) and the figure is O's relative
    error against the float64 reference: bf16 output alone rounds at 2^-9 (0.2%); within 1% passes.
Writes one CSV row per (shape, precision). --device cpu --quick runs the same path on tiny shapes
on the CPU (the --cpu-only check), timed with the wall clock.
"""
import argparse
import csv
import math
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

BF16_PASS = 1e-2  # O's relative error a bf16 computation must stay within


def shapes(quick):
    """(batch, q_heads, kv_heads, seq, head_dim, causal, verify): verify=False only where the
    float64 reference and the .npy files would cost more than the step's time."""
    if quick:
        return [(1, 4, 2, 96, 32, True, True), (1, 4, 4, 128, 64, False, True)]
    return [
        (2, 16, 16, 4096, 128, True, True),  # the target shape
        (2, 16, 16, 4096, 128, False, True),
        (2, 16, 16, 4096, 64, True, True),
        (2, 16, 4, 4096, 128, True, True),
        (2, 16, 16, 1024, 128, True, True),
        (2, 16, 16, 16384, 128, True, False),
    ]


class Timer:
    def __init__(self, device):
        self.cuda = device == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def per_call_ms(self, fn, calls):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e3 / calls

    def median_ms(self, fn, reps=5):
        fn()  # warm-up: kernel selection, workspace
        self.sync()
        first = self.per_call_ms(fn, 1)
        calls = max(1, min(50, math.ceil(20.0 / max(first, 1e-3))))
        return statistics.median(self.per_call_ms(fn, calls) for _ in range(reps)), calls


def backend_of(fn, device):
    """The name of the kernel that took the most device time in one call (cuda), else 'cpu'."""
    if device != "cuda":
        return "cpu"
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        events = prof.key_averages()

        def device_time(e):
            for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
                if hasattr(e, attr):
                    return getattr(e, attr)
            return 0

        top = max(events, key=device_time)
        return re.sub(r"[,\s]+", " ", top.key)[:90]
    except Exception as e:  # the profiler is informative only
        return f"unknown ({type(e).__name__})"


def verify(attnlab, impl, work, tag, q, k, v, o, causal, sample_rows):
    """attnlab verify --expect: (file's O error vs float64, file verdict, impl's verdict, rc)."""
    paths = {}
    for name, arr in (("q", q), ("k", k), ("v", v), ("o", o)):
        paths[name] = os.path.join(work, f"{tag}_{name}.npy")
        np.save(paths[name], np.ascontiguousarray(arr, dtype=np.float32))
    cmd = [attnlab, "verify", "--impl", impl, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
           "--expect", paths["o"], "--sample-rows", str(sample_rows)]
    if causal:
        cmd.append("--causal")
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(work, f"{tag}_verify.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    for p in paths.values():
        os.remove(p)
    m = re.search(r"expected file vs float64 reference: O (\S+), LSE \S+ -> (\w+)", r.stdout)
    file_err = float(m.group(1)) if m else float("nan")
    file_verdict = m.group(2) if m else "?"
    row = re.search(r"^\s+" + re.escape(impl) + r"\S*\s+\S+\s+(\S+)\s+\S+\s+(PASS|FAIL|SKIP)", r.stdout, re.M)
    impl_verdict = row.group(2) if row else "?"
    return file_err, file_verdict, impl_verdict, r.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attnlab", required=True, help="the attnlab executable")
    ap.add_argument("--work", required=True, help="scratch folder for the .npy files and logs")
    ap.add_argument("--csv", required=True, help="the table, written whole at the end")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--impl", default="cuda_flash", help="the lab kernel verify runs against PyTorch's output")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the --cpu-only check)")
    ap.add_argument("--sample-rows", type=int, default=128)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_compare: torch sees no CUDA device")
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    timer = Timer(a.device)
    rows, failed = [], False
    print(f"torch {torch.__version__} on {a.device}"
          + (f" ({torch.cuda.get_device_name(0)})" if a.device == "cuda" else ""), flush=True)
    for b, hq, hkv, s, d, causal, check in shapes(a.quick):
        # Standard normal inputs (scores of unit scale after 1/sqrt(d)); float32 on the host, then on the device.
        q = rng.standard_normal((b, hq, s, d), dtype=np.float32)
        k = rng.standard_normal((b, hkv, s, d), dtype=np.float32)
        v = rng.standard_normal((b, hkv, s, d), dtype=np.float32)
        flops = 4.0 * b * hq * s * s * d * (0.5 if causal else 1.0)  # visible pairs (q_len = kv_len)
        for prec, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            tq, tk, tv = (torch.from_numpy(x).to(a.device, dtype) for x in (q, k, v))

            def call():
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=hkv != hq)

            row = {"impl": f"torch_sdpa_{prec}", "torch": torch.__version__, "device": a.device, "batch": b,
                   "q_heads": hq, "kv_heads": hkv, "seq": s, "head_dim": d, "causal": int(causal)}
            try:
                ms, calls = timer.median_ms(call)
                row.update(backend=backend_of(call, a.device), ms=f"{ms:.4f}", calls=calls,
                           tflops=f"{flops / ms * 1e-9:.3f}")
                if check:
                    o = call().float().cpu().numpy()
                    ins = [x.float().cpu().numpy() for x in (tq, tk, tv)]  # bf16: the rounded values
                    err, file_v, impl_v, rc = verify(a.attnlab, a.impl, a.work, f"s{s}_d{d}_h{hkv}_c{int(causal)}_{prec}",
                                                     *ins, o, causal, a.sample_rows)
                    if prec == "f32":
                        ok = file_v == "agrees" and impl_v == "PASS" and rc == 0
                    else:  # the impl runs in float32 on bf16 values; the file holds bf16 rounding
                        ok = err <= BF16_PASS
                    row.update(o_rel_err=f"{err:.3g}", file_vs_float64=file_v, lab_kernel=a.impl, lab_vs_file=impl_v,
                               verdict="PASS" if ok else "FAIL")
                    failed |= not ok
                else:
                    row.update(verdict="not checked (time only: the float64 reference would not fit the step's time)")
            except Exception as e:
                row.update(verdict=f"FAIL: {type(e).__name__}: {str(e)[:200]}")
                failed = True
            print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            rows.append(row)
            del tq, tk, tv
            if a.device == "cuda":
                torch.cuda.empty_cache()
    fields = ["impl", "torch", "device", "backend", "batch", "q_heads", "kv_heads", "seq", "head_dim", "causal",
              "ms", "calls", "tflops", "o_rel_err", "file_vs_float64", "lab_kernel", "lab_vs_file", "verdict"]
    tmp = a.csv + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, a.csv)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
