#!/usr/bin/env python3
"""Independent attention outputs made with numpy, for `attnlab verify --expect`.

Writes q.npy, k.npy, v.npy (float32) and o.npy, lse.npy computed in float64 with an
explicit dense boolean mask built the way PyTorch users build it (tril with a diagonal
offset, as torch's causal_lower_right / causal_upper_left), GQA by repeat_interleave,
per-batch kv lengths as a padding mask. None of the lab's C++ code is used, so agreement
checks the semantics, not just the arithmetic.

  /usr/bin/python3 scripts/numpy_attention.py OUT --batch 2 --q-heads 6 --kv-heads 2 \
      --q-len 5 --kv-len 9 --head-dim 16 --causal --kv-lens 9,4
  attnlab verify --q OUT/q.npy --k OUT/k.npy --v OUT/v.npy --expect OUT/o.npy \
      --expect-lse OUT/lse.npy --causal --kv-lens 9,4
"""
import argparse
import os

import numpy as np


def dense_mask(lq, lk, lk_b, causal, left, right):
    """keep[i, j] for one batch entry (lk columns, the first lk_b valid)."""
    keep = np.zeros((lq, lk), dtype=bool)
    keep[:, :lk_b] = True
    off = 0 if causal == "top-left" else lk_b - lq
    ones = np.ones((lq, lk), dtype=bool)
    if causal != "none":
        keep &= np.tril(ones, k=off)          # j <= i + off
    if right >= 0:
        keep &= np.tril(ones, k=off + right)  # j <= i + off + right
    if left >= 0:
        keep &= np.triu(ones, k=off - left)   # j >= i + off - left
    return keep


def attention(q, k, v, scale, causal, left, right, kv_lens):
    """q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D) float64 -> o (B, Hq, Lq, D), lse (B, Hq, Lq)."""
    b_n, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hkv, axis=1)       # repeat_interleave: head h uses kv head h // G
    v = np.repeat(v, hq // hkv, axis=1)
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    o = np.zeros_like(q)
    lse = np.full((b_n, hq, lq), -np.inf)
    for b in range(b_n):
        keep = dense_mask(lq, lk, kv_lens[b], causal, left, right)
        sb = np.where(keep[None], s[b], -np.inf)
        m = sb.max(axis=-1, keepdims=True)
        live = np.isfinite(m)                 # rows with at least one visible key
        p = np.where(keep[None], np.exp(sb - np.where(live, m, 0.0)), 0.0)
        l = p.sum(axis=-1, keepdims=True)
        o[b] = np.where(live, (p @ v[b]) / np.where(live, l, 1.0), 0.0)
        lse[b] = np.where(live[..., 0], (m + np.log(np.where(live, l, 1.0)))[..., 0], -np.inf)
    return o, lse


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    for name, default in [("batch", 1), ("q-heads", 4), ("kv-heads", 2), ("q-len", 7),
                          ("kv-len", 11), ("head-dim", 16), ("seed", 0)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--causal-top-left", action="store_true")
    ap.add_argument("--window", default="-1,-1")
    ap.add_argument("--kv-lens", default="")
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--layout", choices=["bhsd", "bshd"], default="bhsd")
    ap.add_argument("--expect-dtype", choices=["float32", "float64"], default="float64")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    shape_q = (a.batch, a.q_heads, a.q_len, a.head_dim)
    shape_kv = (a.batch, a.kv_heads, a.kv_len, a.head_dim)
    q = rng.uniform(-1, 1, shape_q).astype(np.float32)
    k = rng.uniform(-1, 1, shape_kv).astype(np.float32)
    v = rng.uniform(-1, 1, shape_kv).astype(np.float32)
    causal = "top-left" if a.causal_top_left else ("bottom-right" if a.causal else "none")
    left, right = (int(x) for x in a.window.split(","))
    kv_lens = [int(x) for x in a.kv_lens.split(",")] if a.kv_lens else [a.kv_len] * a.batch
    scale = a.scale if a.scale is not None else 1.0 / np.sqrt(a.head_dim)
    scale = float(np.float32(scale))          # the lab's scale is a float32
    o, lse = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                       scale, causal, left, right, kv_lens)
    to_layout = (lambda x: x) if a.layout == "bhsd" else (lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3)))
    os.makedirs(a.out, exist_ok=True)
    np.save(os.path.join(a.out, "q.npy"), to_layout(q))
    np.save(os.path.join(a.out, "k.npy"), to_layout(k))
    np.save(os.path.join(a.out, "v.npy"), to_layout(v))
    np.save(os.path.join(a.out, "o.npy"), to_layout(o).astype(a.expect_dtype))
    np.save(os.path.join(a.out, "lse.npy"), lse.astype(a.expect_dtype))


if __name__ == "__main__":
    main()
