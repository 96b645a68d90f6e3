"""Loading a results folder: typed rows, machine, experiment, plan; the kernels' order and
targets; which rows are peers, prefill, decode; holding parameters fixed."""

import collections
import csv
import gzip
import importlib.util
import json
import os
import statistics

from . import schema
from .schema import LEGACY_SCHEMA, load_schema, use_schema


DECODE_MAX_Q = 16  # q_len at most this (and below kv_len) counts as decode


# What users run instead (attnlab sweep --peers; src/bench/peers/peers.hpp), in report order.
# The narrow-arithmetic kernels (int8 products) and each one's float32 twin: (its name, the twin's
# target when the narrow kernel's label is not a dispatch target - flash_int8_amx is built in the
# avx512_bf16 object, x86-64-v4 based - else None). The report's Arithmetic section pairs them;
# the README headline (scripts/docs.py) leaves them out of the ranking against the runtimes.
NARROW_TWINS = {"decode_i8": ("decode", None), "flash_int8": ("flash", None), "flash_int8_amx": ("flash", "avx512")}
# Peers whose products are int8 (OpenVINO's sage path): judged, like the lab's NARROW_TWINS, by a
# tolerance derived from their rounding, so never ranked against float kernels.
# The peers, their families, colours and which multiply in int8: the peers' catalogue
# (scripts/peers/catalogue.py, loaded by path: scripts/peers is not a package).
_spec = importlib.util.spec_from_file_location(
    "attn_peer_catalogue", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers", "catalogue.py"))
_catalogue = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_catalogue)
NARROW_PEERS = _catalogue.INT8_PEERS
PEERS = tuple(_catalogue.PEERS)
PEER_FAMILY = _catalogue.FAMILY_OF
PEER_COLORS = _catalogue.COLORS


def is_peer(kernel):
    return kernel in PEERS


def load_results(folder):
    """The folder's points (list of dicts with typed values), machine, experiment, plan."""
    path = os.path.join(folder, "results.csv")
    if not os.path.isfile(path):
        raise SystemExit(f"report: {path} not found; allowed: a folder written by attnlab sweep")
    use_schema(load_schema(folder))
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for key, value in raw.items():
                if key in schema.INT_COLS:
                    row[key] = int(value) if value not in ("", None) else None
                elif key in schema.FLOAT_COLS:
                    row[key] = float(value) if value not in ("", None) else None
                else:
                    row[key] = value
            # Folders written before 16-bit storage: float32 inputs, no separate error.
            if not row.get("dtype"):
                row["dtype"] = "f32"
            if row.get("err_o_rel_f32_inputs") is None:
                row["err_o_rel_f32_inputs"] = row.get("err_o_rel")
            # Folders written before sparse patterns: interval masks only.
            row.setdefault("pattern", "")
            # Folders written before d_v != d_qk and model labels.
            if row.get("head_dim_v") is None:
                row["head_dim_v"] = row["head_dim"]
            row.setdefault("model", "")
            if row.get("plan_bytes") is None:
                row["plan_bytes"] = 0
            rows.append(row)

    def read_json(name):
        p = os.path.join(folder, name)
        if not os.path.isfile(p):
            return {}
        with open(p) as f:
            return json.load(f)

    return rows, read_json("machine.json"), read_json("experiment.json"), read_json("sweep.json")


def kernel_order(rows, machine):
    """The kernels (labels) present in rows, in the registry's order, each one's targets
    narrowest first."""
    names = [k["name"] for k in machine.get("kernels", [])]
    targets = built_targets(machine)

    def key(r):
        name = r.get("kernel_name", r["kernel"])
        n = names.index(name) if name in names else len(names) + (PEERS.index(name) if name in PEERS else 0)
        t = targets.index(r.get("isa")) if r.get("isa") in targets else -1
        return (n, name, t)

    seen = []
    for r in sorted(rows, key=key):
        if r["kernel"] not in seen:
            seen.append(r["kernel"])
    return seen


def built_targets(machine):
    """The targets the build compiled its SIMD kernels for, narrowest first ([] when the
    machine.json predates them)."""
    return list(machine.get("isa", {}).get("targets_built", []))


def default_target(machine):
    """The target the SIMD kernels ran when none was named, and whose read bandwidth and
    FMA peak the kernels built once are measured against."""
    isa = machine.get("isa", {})
    return (machine.get("peaks", {}).get("simd_arch") or isa.get("default") or isa.get("simd_arch") or "?")


def ok_rows(rows):
    return [r for r in rows if r["status"] == "ok" and r.get("time_median_s")]


def is_prefill(r):
    return r["q_len"] == r["kv_len"]


def is_decode(r):
    return r["q_len"] <= DECODE_MAX_Q and r["q_len"] < r["kv_len"]


def modal(rows, key):
    """Most common value; ties go to the largest (the longest sequence, the most threads)."""
    counts = collections.Counter(r[key] for r in rows)
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0] if counts else None


def hold_fixed(rows, free):
    """Rows whose parameters outside `free` equal their most common value, and those values.
    The dimensions are fixed one after the other among the rows still kept, so the result is
    never empty (an experiment of several grids need not hold every combination)."""
    fixed = {}
    kept = rows
    for d in schema.DIMS:
        if d in free:
            continue
        # The forward when a folder holds several passes (experiments/training.json): the plots
        # are of the forward unless they say otherwise.
        fixed[d] = "forward" if d == "pass" and any(r[d] == "forward" for r in kept) else modal(kept, d)
        kept = [r for r in kept if r[d] == fixed[d]]
    return kept, fixed


def describe_fixed(fixed):
    parts = [f"{k} {v}" for k, v in fixed.items()
             if v not in (None, "") and not (k == "head_dim_v" and v == fixed.get("head_dim"))]
    return ", ".join(parts)


UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def id_of_name(name, schema=None):
    """A Google Benchmark name (attn/flash/b:1/hq:8/.../mask:none/t:2[/isa:avx2][/min_time:..]
    [/repeats:..]/real_time) as the point id (flash-b1-hq8-...-none-t2[-avx2]), segment by
    segment in the order the schema's "id" gives (schema.json, src/schema/point_schema.hpp;
    default: report.LEGACY_SCHEMA); None when it is not a point's name."""
    parts = name.split("/")
    if len(parts) < 3 or parts[0] != "attn":
        return None
    f = dict(p.split(":", 1) for p in parts[2:] if ":" in p)
    segments = (schema or LEGACY_SCHEMA)["id"]
    if not all(s["key"] in f for s in segments[:6]):  # batch .. head_dim are in every name
        return None
    return parts[1] + "".join(s["id_prefix"] + f[s["key"]] for s in segments if s["key"] in f)


_bench_cache = {}


def bench_times(folder):
    """Per point id, the repetitions' seconds per iteration from the folder's bench.json (a committed
    run's bench.json.gz: scripts/tidy_results.py compresses them)."""
    if folder not in _bench_cache:
        out = {}
        path = os.path.join(folder, "bench.json")
        doc = None
        if os.path.isfile(path):
            with open(path) as f:
                doc = json.load(f)
        elif os.path.isfile(path + ".gz"):
            with gzip.open(path + ".gz", "rt") as f:
                doc = json.load(f)
        if doc is not None:
            schema = load_schema(folder)
            for r in doc.get("benchmarks", []):
                i = id_of_name(r.get("run_name") or r.get("name", ""), schema)
                if i and r.get("run_type") == "iteration" and not r.get("error_occurred") and r.get("real_time"):
                    out.setdefault(i, []).append(r["real_time"] * UNIT_S.get(r.get("time_unit", "ns"), 1e-9))
        _bench_cache[folder] = out
    return _bench_cache[folder]


def repetition_times(folder, point_id):
    """The point's per-repetition seconds: points/<id>.json, else the folder's bench.json (committed
    runs keep no points/); None when neither has them."""
    path = os.path.join(folder, "points", point_id + ".json")
    if os.path.isfile(path):
        with open(path) as f:
            doc = json.load(f)
        times = [t for t in doc.get("record", {}).get("times_s", []) if isinstance(t, (int, float))]
        if times:
            return times
    return bench_times(folder).get(point_id)


def pass_times(folder, row):
    """The point's repetition seconds grouped by the sweep's pass (Experiment::rounds: every
    pass times each point `repetitions` times, appended in pass order), or None when the folder
    does not keep them or they do not split evenly (a resumed or cut-short point)."""
    times = repetition_times(folder, row["id"])
    rounds = row.get("rounds") or 1
    if not times or len(times) % rounds:
        return None
    n = len(times) // rounds
    return [times[k * n:(k + 1) * n] for k in range(rounds)]


def pass_ratios(folder, lab, peer):
    """The lab's speed-up over the peer in each pass of the sweep alone (median of the peer's
    repetitions in that pass / median of the lab's): the two points ran minutes apart inside a
    pass, the passes up to an hour apart, so the spread across passes is the host's drift. None
    without per-pass times or with one pass."""
    if not folder:
        return None
    a, b = pass_times(folder, lab), pass_times(folder, peer)
    if not a or not b or len(a) != len(b) or len(a) < 2:
        return None
    return [statistics.median(tb) / statistics.median(ta) for ta, tb in zip(a, b)]


def pass_ratio_text(xs):
    """pass_ratios as the tables quote them: median [min, max], or "-" without them."""
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f}x [{min(xs):.2f}, {max(xs):.2f}]"
