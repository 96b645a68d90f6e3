#!/usr/bin/python3
"""The lab's kernels from Python: one attention computed by attnlab (no copies of the numpy
inputs, the GIL released while the kernel runs) and by numpy in float64, with both timings.

    PYTHONPATH=build/python /usr/bin/python3 scripts/python_example.py [--q-len 1024] [--kernel flash]

(`scripts/lab python` prints the PYTHONPATH line for this build.)
"""

import argparse
import time

import numpy as np

import attnlab


def numpy_attention(q, k, v, causal):
    """float64 reference, bhsd, bottom-right causal, GQA by repeating K/V heads."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1).astype(np.float64), np.repeat(v, g, axis=1).astype(np.float64)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k) / np.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape[-2:]
        s = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--q-heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--q-len", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--kernel", default="flash")
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    q = rng.uniform(-1, 1, (1, a.q_heads, a.q_len, a.head_dim)).astype(np.float32)
    k = rng.uniform(-1, 1, (1, a.kv_heads, a.q_len, a.head_dim)).astype(np.float32)
    v = rng.uniform(-1, 1, (1, a.kv_heads, a.q_len, a.head_dim)).astype(np.float32)
    label = next(x["label"] for x in attnlab.kernels() if x["name"] == a.kernel and x["default"])
    attnlab.attention(q, k, v, kernel=a.kernel, causal=a.causal)  # warm-up
    t0 = time.perf_counter()
    o = attnlab.attention(q, k, v, kernel=a.kernel, causal=a.causal)
    t_lab = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = numpy_attention(q, k, v, a.causal)
    t_np = time.perf_counter() - t0
    print(f"attnlab {label}: {t_lab * 1e3:.2f} ms; numpy float64: {t_np * 1e3:.2f} ms "
          f"({t_np / t_lab:.1f}x); max |difference| {np.max(np.abs(o - ref)):.2e}")


if __name__ == "__main__":
    main()
