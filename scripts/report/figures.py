"""Drawing helpers every plot family shares: the Plots collector, ticks, the fitted exponent,
number formats."""

import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from .load import PEER_COLORS, is_peer


def int_ticks(ax, values, axis="x"):
    """Plain integer tick labels at the data values (log2 axes otherwise show 2^k)."""
    values = sorted(set(values))
    if len(values) > 12:
        values = values[:: math.ceil(len(values) / 12)]
    if axis == "x":
        ax.set_xticks(values)
        ax.set_xticklabels([str(v) for v in values])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    else:
        ax.set_yticks(values)
        ax.set_yticklabels([str(v) for v in values])


def log_y_labels(ax):
    """Log y axis labelled at 1, 2, 5 x 10^k in plain numbers (decades alone leave most plots unlabelled)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def fit_exponent(ns, ts):
    """Least-squares slope of log t vs log n over the large-n points: the upper half of the
    distinct sizes, at least 3 when there are 3. None with fewer than 2 points."""
    pts = sorted(zip(ns, ts))
    if len(pts) < 2:
        return None, []
    k = min(len(pts), max(3, math.ceil(len(pts) / 2)))
    use = pts[-k:]
    x = np.log([p[0] for p in use])
    y = np.log([p[1] for p in use])
    slope = float(np.polyfit(x, y, 1)[0])
    return slope, [p[0] for p in use]


def fmt_bytes(b):
    if b is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def fmt(v, spec=".3g", none="-"):
    return none if v is None else format(v, spec)


class Plots:
    """Collects figures and their captions."""

    def __init__(self, out, kernels):
        self.out = out
        self.items = []  # (title, file, caption)
        # Peers (torch, ONNX Runtime, JAX) stand apart: their own colors (not tab10's), dashed
        # lines, their own markers, hatched bars.
        lab = [k for k in kernels if not is_peer(k)]
        peers = [k for k in kernels if is_peer(k)]
        cmap = plt.get_cmap("tab10")
        self.color = {k: cmap(i % 10) for i, k in enumerate(lab)}
        self.color.update({k: PEER_COLORS[k] for k in peers})
        self.marker = {k: "osD^v<>ph*"[i % 10] for i, k in enumerate(lab)}
        self.marker.update({k: "XP*dH"[i % 5] for i, k in enumerate(peers)})

    def style(self, k):
        """Line-plot style of a kernel: color and marker; peers dashed with larger markers."""
        if is_peer(k):
            return {"color": self.color[k], "marker": self.marker[k], "linestyle": "--", "markersize": 8}
        return {"color": self.color[k], "marker": self.marker[k]}

    def bar_style(self, k):
        return {"color": self.color[k], "hatch": "//", "edgecolor": "white"} if is_peer(k) else {"color": self.color[k]}

    def save(self, fig, name, title, caption, extra=None):
        """`extra`: markdown lines placed after the caption (a table belonging to the plot)."""
        fig.tight_layout()
        fig.savefig(os.path.join(self.out, name), dpi=110)
        plt.close(fig)
        self.items.append((title, name, caption, extra or []))


def series_by_kernel(rows, kernels, x, y):
    out = {}
    for k in kernels:
        pts = sorted((r[x], y(r)) for r in rows if r["kernel"] == k and y(r) is not None)
        if pts:
            out[k] = pts
    return out
