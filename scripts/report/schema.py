"""The point schema a results folder was written with (schema.json, else LEGACY_SCHEMA), and
the columns it types. DIMS, SHAPE_KEYS, INT_COLS and FLOAT_COLS follow the folder loaded last
(use_schema); read them as schema.DIMS, never copy them."""

import json
import os


# A point's fields come from the folder's schema.json (src/schema/point_schema.hpp: the one
# table the sweep writes ids, names, counters and results.csv from). Folders written before
# schema.json held these fields, frozen here as they were:
LEGACY_SCHEMA = {
    "schema": "attnlab-point-1",
    "fields": [{"name": n, "type": t, "shape": sh} for n, t, sh in (
        ("batch", "int", True), ("q_heads", "int", True), ("kv_heads", "int", True), ("gqa_group", "int", False),
        ("q_len", "int", True), ("kv_len", "int", True), ("head_dim", "int", True), ("head_dim_v", "int", True),
        ("mask", "text", True), ("causal", "int", False), ("window_left", "int", False),
        ("window_right", "int", False), ("pattern", "text", False), ("density", "real", False),
        ("layout", "text", True), ("dtype", "text", True), ("threads", "int", True), ("model", "text", True))],
    "id": [{"key": k, "id_prefix": i, "name_prefix": f"/{k}:"} for k, i in (
        ("b", "-b"), ("hq", "-hq"), ("hkv", "-hkv"), ("sq", "-sq"), ("sk", "-sk"), ("d", "-d"), ("dv", "v"),
        ("mask", "-"), ("layout", "-"), ("dtype", "-"), ("t", "-t"), ("isa", "-"), ("model", "-"))],
}


# The measurement's columns (not point fields).
MEASURED_INT_COLS = {"visible_pairs", "extra_bytes", "plan_bytes", "memory_bytes", "repetitions", "rounds",
                     "iterations", "verify_rows", "probes"}


MEASURED_FLOAT_COLS = {"flops", "bytes", "kv_bytes", "kv_bytes_per_token", "time_median_s", "time_min_s",
                       "time_max_s", "time_mean_s", "time_stddev_s", "time_cv", "gflops", "gbytes_per_s",
                       "peak_gflops", "peak_fraction", "read_bw_gbs", "bw_fraction", "err_o_rel", "tol_o_rel",
                       "err_lse", "tol_lse", "seconds_spent", "err_o_rel_f32_inputs", "probe_read_gbs_min",
                       "probe_read_gbs_median", "probe_read_gbs_max", "bw_fraction_probe_median",
                       "bw_fraction_probe_best", "err_dq", "err_dk", "err_dv", "tol_dq", "tol_dk", "tol_dv",
                       "roofline_s", "roofline_fraction", "recall_min", "recall_mean", "err_o_rel_dense"}


def load_schema(folder):
    """The folder's schema.json, else LEGACY_SCHEMA."""
    path = os.path.join(folder, "schema.json")
    if not os.path.isfile(path):
        return LEGACY_SCHEMA
    with open(path) as f:
        schema = json.load(f)
    if not str(schema.get("schema", "")).startswith("attnlab-point-") or "fields" not in schema:
        raise SystemExit(f"report: {path} is not a point schema (written by attnlab sweep)")
    return schema


def use_schema(schema):
    """Sets DIMS (the shape fields plots slice on and hold fixed), SHAPE_KEYS (the same, for
    grouping rows of one shape) and the typed columns from a schema."""
    global DIMS, SHAPE_KEYS, INT_COLS, FLOAT_COLS, DEFAULTS
    fields = schema["fields"]
    # A shape field's value at its default (ids leave it out there): reports name the field
    # only where a point differs from it (tables.shape_text), so a new axis shows up unasked.
    DEFAULTS = {f["name"]: f["default"] for f in fields if f.get("shape") and "default" in f}
    DIMS = [f["name"] for f in fields if f.get("shape")]
    SHAPE_KEYS = tuple(DIMS)
    INT_COLS = MEASURED_INT_COLS | {f["name"] for f in fields if f.get("type") == "int"}
    FLOAT_COLS = MEASURED_FLOAT_COLS | {f["name"] for f in fields if f.get("type") == "real"}


use_schema(LEGACY_SCHEMA)
