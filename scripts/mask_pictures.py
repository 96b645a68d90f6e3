#!/usr/bin/env python3
"""Pictures of the lab's attention patterns: which (query, key) pairs are visible.

One PNG per pattern (rows = queries, columns = keys, black = visible), titled with the
`attnlab` flags that make it, and patterns.png with all of them in a 2 x 4 grid. The masks
come from pattern_mask() of scripts/numpy_attention.py (numpy, independent of the C++ code).

  /usr/bin/python3 scripts/mask_pictures.py results/sparse-patterns
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_attention import pattern_mask  # noqa: E402

N = 64  # q_len = kv_len

# (file stem, short name, attnlab flags, pattern_mask keyword arguments)
PATTERNS = [
    ("dense", "dense", "(no mask flags)", dict(causal="none", left=-1, right=-1)),
    ("causal", "causal", "--causal", dict(causal="bottom-right", left=-1, right=-1)),
    ("window", "sliding window", "--window 8,0 --causal", dict(causal="bottom-right", left=8, right=0)),
    ("sinks", "sinks + window (StreamingLLM)", "--sinks 4 --window 8,0 --causal",
     dict(causal="bottom-right", left=8, right=0, sinks=4)),
    ("longformer", "Longformer", "--window 6,6 --global 0,32,63",
     dict(causal="none", left=6, right=6, globals_=(0, 32, 63))),
    ("bigbird", "BigBird", "--bigbird 8,2,1 --window 8,8 --global 0",
     dict(causal="none", left=8, right=8, globals_=(0,), bigbird=(8, 2, 1))),
    ("documents", "packed documents", "--doc-lens 20,28,16 --causal",
     dict(causal="bottom-right", left=-1, right=-1, doc_lens=(20, 28, 16))),
    ("dilated", "dilated window", "--window 24,0 --causal --dilation 3",
     dict(causal="bottom-right", left=24, right=0, dilation=3)),
]


def mask_of(kw):
    return pattern_mask(N, N, N, **kw)


def draw(ax, keep, name, flags):
    ax.imshow(keep, cmap="gray_r", vmin=0, vmax=1, interpolation="nearest")
    density = keep.mean()
    ax.set_title(f"{name}\n{flags}\n{keep.sum()} pairs ({100 * density:.0f}%)", fontsize=8)
    ax.set_xlabel("key j", fontsize=7)
    ax.set_ylabel("query i", fontsize=7)
    ax.tick_params(labelsize=6)
    ticks = list(range(0, N + 1, 16))
    ax.set_xticks([t - 0.5 for t in ticks], [str(t) for t in ticks])
    ax.set_yticks([t - 0.5 for t in ticks], [str(t) for t in ticks])


def save_atomic(fig, path):
    """Write to a temporary name in the same folder, then rename over `path`."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp.png")
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    masks = [(stem, name, flags, mask_of(kw)) for stem, name, flags, kw in PATTERNS]
    written = []
    for stem, name, flags, keep in masks:
        fig, ax = plt.subplots(figsize=(3.2, 3.6))
        draw(ax, keep, name, flags)
        path = os.path.join(a.outdir, stem + ".png")
        save_atomic(fig, path)
        written.append(path)
    fig, axes = plt.subplots(2, 4, figsize=(13, 7.6))
    for ax, (stem, name, flags, keep) in zip(axes.flat, masks):
        draw(ax, keep, name, flags)
    fig.suptitle(f"attnlab patterns at q_len = kv_len = {N} (black = query row i sees key j)", fontsize=11)
    fig.tight_layout()
    path = os.path.join(a.outdir, "patterns.png")
    save_atomic(fig, path)
    written.append(path)
    for p in written:
        print(p)


if __name__ == "__main__":
    main()
