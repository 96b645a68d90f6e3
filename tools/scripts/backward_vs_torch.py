"""flash's backward pass against torch's SDPA backward, alternated in one process (informal: the
sweep has no `pass` axis yet). Needs torch and the attnlab package (pip install . or
PYTHONPATH=build/python). Medians of 3 rounds x 5 calls; % of the FMA peak with the backward's
2.5x-forward FLOP convention (backward.hpp), O and LSE given (the backward alone).

    VENV/bin/python tools/scripts/backward_vs_torch.py [--threads 2]
"""
import argparse
import time

import numpy as np
import torch

import attnlab

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
torch.set_num_threads(args.threads)


def med(f, n=5):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


peak = attnlab.peak(threads=args.threads, seconds=0.3)["fma_flops"]
for (h, L, d, causal) in [(8, 1024, 128, False), (8, 1024, 128, True), (8, 2048, 128, False), (8, 2048, 64, True)]:
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.uniform(-1, 1, (1, h, L, d)).astype(np.float32) for _ in range(4))
    o, lse = attnlab.attention(q, k, v, kernel="flash", causal=causal, return_lse=True, threads=args.threads)
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    tdo = torch.from_numpy(do)
    lab = lambda: attnlab.attention_backward(q, k, v, do, o=o, lse=lse, kernel="flash", causal=causal, threads=args.threads)
    pt = lambda: torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True)
    rounds = [(med(lab), med(pt)) for _ in range(3)]
    a = np.median([r[0] for r in rounds]); b = np.median([r[1] for r in rounds])
    fwd = 4 * L * L * d * h * (0.5 if causal else 1.0)  # 2 (d + d_v) per visible pair (causal ~ half)
    bwd = 2.5 * fwd
    print(f"{h}/{h} d{d} {L} causal={causal}: flash bwd {a*1e3:.1f} ms ({bwd/a/1e9:.1f} GFLOP/s, {100*bwd/a/peak:.0f}% of {peak/1e9:.0f} peak) | torch {b*1e3:.1f} ms -> lab {b/a:.2f}x")
