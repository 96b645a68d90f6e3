"""scripts/docs.py quotes % of peak by the report's rule (scripts/report/peaks.py): against the
larger of the peaks measured before and after a sweep's points, never the first alone - the
README headline once read 116% of the FMA peak for a run whose first measurement fell in a
contended minute."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import docs  # noqa: E402


def peaks(fma, read):
    return {"schema": "attnlab-peak-2", "simd_arch": "avx2",
            "targets": [{"isa": "avx2", "rows": [{"threads": 2, "fma_flops": fma, "read_bytes": read}]}]}


def machine(before, after=None):
    m = {"isa": {"default": "avx2", "targets_built": ["scalar", "avx2"]}, "peaks": peaks(*before)}
    if after:
        m["peaks_after"] = peaks(*after)
    return m


ROW = {"kernel": "flash", "isa": "avx2", "threads": "2", "flops": "1e11", "bytes": "1e9", "time_median_s": "1.0"}


@pytest.mark.parametrize("before, after, fma, read", [
    ((100e9, 10e9), (200e9, 20e9), 200e9, 20e9),  # the after-run is the better estimate
    ((200e9, 20e9), (100e9, 10e9), 200e9, 20e9),
    ((150e9, 30e9), (180e9, 12e9), 180e9, 30e9),  # each figure its own larger one
    ((100e9, 10e9), None, 100e9, 10e9),           # a run from before peaks_after
])
def test_peaks_are_the_larger_of_before_and_after(before, after, fma, read):
    m = machine(before, after)
    assert docs.peak_row(m, 2) == {"fma_flops": fma, "read_bytes": read}
    assert docs.fraction_of_peak(ROW, m, decode=False) == pytest.approx(1e11 / fma)
    assert docs.fraction_of_peak(ROW, m, decode=True) == pytest.approx(1e9 / read)


def test_unmeasured_thread_count_takes_the_largest_row():
    m = machine((100e9, 10e9), (120e9, 11e9))
    assert docs.peak_row(m, 8) == {"fma_flops": 120e9, "read_bytes": 11e9}
    assert docs.peak_row({}, 2) == {}


def test_headline_ranks_float_kernels_against_the_runtimes_not_int8_ones(monkeypatch):
    # flash_int8_amx is faster than flash and than the peer, but multiplies in int8 (a wider
    # tolerance than the runtime's float path): the headline sets flash against the peer.
    # Rows as the report's loader types them (docs.load reads folders through it).
    shape = {"batch": 1, "q_heads": 8, "kv_heads": 8, "head_dim": 128, "head_dim_v": 128, "q_len": 4096,
             "kv_len": 4096, "mask": "none", "dtype": "f32", "threads": 2, "status": "ok", "rounds": 1,
             "flops": 1e11, "bytes": 1e9}
    rows = [dict(shape, kernel="flash", isa="avx2", time_median_s=0.3, id="a"),
            dict(shape, kernel="flash_int8_amx", isa="amx_int8", time_median_s=0.07, id="b"),
            dict(shape, kernel="ov_sdpa", isa="peer", time_median_s=0.28, id="c")]
    dims = ["batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "head_dim_v", "mask", "dtype", "threads"]
    monkeypatch.setattr(docs, "committed_folders", lambda: ["run"])
    monkeypatch.setattr(docs, "load", lambda folder: (dict(machine((100e9, 10e9)), date="2026-12-04"), rows, dims))
    monkeypatch.setattr(docs, "lead_per_pass", lambda *a: "-")
    text = docs.headline()
    assert "| flash | 300 ms" in text and "flash_int8_amx" not in text, text
    assert docs.is_narrow({"kernel": "decode_i8"}) and not docs.is_narrow({"kernel": "decode"})


def test_decode_is_the_reports_rule():
    # q_len 4 against kv_len 8 is decode for the report (q_len <= 16, q_len < kv_len); docs.py once
    # asked for kv_len > 16 too, so the two sorted that point into different tables.
    assert docs.is_decode({"q_len": 4, "kv_len": 8})
    assert not docs.is_decode({"q_len": 8, "kv_len": 8}) and not docs.is_decode({"q_len": 17, "kv_len": 4096})


def test_forward_table_is_not_taken_from_a_newer_training_sweep(monkeypatch):
    # A training sweep's forward rows stand beside the peers picked for the backward (PyTorch's
    # autograd): its newer date must not replace the forward table of a sweep against every runtime.
    shape = {"batch": 1, "q_heads": 8, "kv_heads": 8, "head_dim": 128, "head_dim_v": 128, "q_len": 4096,
             "kv_len": 4096, "mask": "none", "dtype": "f32", "threads": 2, "status": "ok", "rounds": 1,
             "flops": 1e11, "bytes": 1e9}
    prefill = [dict(shape, kernel="flash", isa="avx2", time_median_s=0.3, id="a"),
               dict(shape, kernel="ov_sdpa", isa="peer", time_median_s=0.28, id="b")]
    training = [dict(shape, kernel="flash", isa="avx2", time_median_s=0.31, id="c", **{"pass": "forward"}),
                dict(shape, kernel="torch_sdpa", isa="peer", time_median_s=0.4, id="d", **{"pass": "forward"}),
                dict(shape, kernel="flash", isa="avx2", time_median_s=0.8, id="e", **{"pass": "backward"}),
                dict(shape, kernel="torch_sdpa", isa="peer", time_median_s=0.9, id="f", **{"pass": "backward"})]
    dims = ["batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "head_dim_v", "mask", "dtype", "threads",
            "pass"]
    folders = {"prefill": ("2026-12-04", prefill), "training": ("2026-12-05", training)}
    monkeypatch.setattr(docs, "committed_folders", lambda: list(folders))
    monkeypatch.setattr(docs, "load", lambda f: (dict(machine((100e9, 10e9)), date=folders[f][0]), folders[f][1], dims))
    monkeypatch.setattr(docs, "lead_per_pass", lambda *a: "-")
    forward, backward = docs.headline().split("**Against the runtimes' backward pass")
    assert "results/prefill" in forward and "ov_sdpa" in forward and "torch_sdpa" not in forward, forward
    assert "results/training" in backward and "| flash | 800 ms" in backward, backward


def test_headline_ranks_each_class_of_arithmetic_against_its_own_peers(monkeypatch):
    """Per shape a row per class of arithmetic both sides ran in (issue 63 item 5): int8 products
    (flash_int8) beside the sage path, never beside a float peer, and a faster narrow kernel is not
    left out; f32 beside the float peers."""
    monkeypatch.setattr(docs, "lead_per_pass", lambda folder, best, peer: "-")
    base = {"threads": "2", "q_heads": "8", "kv_heads": "8", "head_dim": "128", "q_len": 4096,
            "kv_len": 4096, "flops": "1e11", "bytes": "1e9", "status": "ok", "dtype": "f32"}
    rows = [dict(base, kernel="flash", isa="avx2", time_median_s="0.30"),
            dict(base, kernel="flash_int8", isa="avx2", time_median_s="0.20"),
            dict(base, kernel="ov_sdpa", isa="peer", time_median_s="0.33"),
            dict(base, kernel="ov_sage", isa="peer", time_median_s="0.25")]
    assert [docs.arithmetic_class(r) for r in rows] == ["f32", "int8 products", "f32", "int8 products"]
    assert docs.arithmetic_class(dict(base, kernel="flash_bf16", isa="avx512_bf16")) == "bf16 products"
    assert docs.arithmetic_class(dict(base, kernel="ov_sdpa", isa="peer", dtype="bf16")) == "bf16 products"
    assert docs.arithmetic_class(dict(base, kernel="zentorch_sdpa", isa="peer", dtype="bf16")) == "bf16 products"
    assert docs.arithmetic_class(dict(base, kernel="zentorch_sdpa", isa="peer")) == "f32"
    table = docs.headline_table("x", machine((100e9, 10e9)), rows, ["q_heads", "head_dim", "q_len", "kv_len",
                                                                   "threads"])
    body = [line for line in table if line.startswith("| 8/8")]
    assert len(body) == 2, table
    assert "| f32 | flash |" in body[0] and "| ov_sdpa |" in body[0] and "1.10x" in body[0], body[0]
    assert "| int8 products | flash_int8 |" in body[1] and "| ov_sage |" in body[1] and "1.25x" in body[1], body[1]


def test_headline_int8_beside_the_best_bf16_peer_when_no_int8_peer_ran(monkeypatch):
    """Without an int8 peer (ov_sage needs AMX-INT8 / AVX-VNNI-INT8), the int8 kernel's row stands
    beside the best bf16-products peer of the same shape's bf16 point, marked (bf16) and explained;
    float32 still beside the float32 peers, and a bf16 peer of another shape is never taken."""
    monkeypatch.setattr(docs, "lead_per_pass", lambda folder, best, peer: "-")
    base = {"threads": "2", "q_heads": "8", "kv_heads": "8", "head_dim": "128", "q_len": 4096,
            "kv_len": 4096, "flops": "1e11", "bytes": "1e9", "status": "ok", "dtype": "f32"}
    rows = [dict(base, kernel="flash", isa="avx512", time_median_s="0.30"),
            dict(base, kernel="flash_int8", isa="avx512", time_median_s="0.12", roofline_fraction="0.47",
                 roofline_bound="compute"),
            dict(base, kernel="ov_sdpa", isa="peer", time_median_s="0.33"),
            dict(base, kernel="flash_bf16", isa="avx512_bf16", dtype="bf16", time_median_s="0.17"),
            dict(base, kernel="ov_sdpa", isa="peer", dtype="bf16", time_median_s="0.18"),
            dict(base, kernel="zentorch_sdpa", isa="peer", dtype="bf16", time_median_s="0.19"),
            dict(base, kernel="ov_sdpa", isa="peer", dtype="bf16", head_dim="64", time_median_s="0.01")]
    table = docs.headline_table("x", machine((100e9, 10e9)), rows,
                                ["q_heads", "head_dim", "q_len", "kv_len", "dtype", "threads"])
    int8 = [line for line in table if "| int8 products |" in line]
    assert len(int8) == 1 and "| ov_sdpa (bf16) |" in int8[0] and "1.50x" in int8[0], table
    assert "| 47% (compute) |" in int8[0], int8[0]  # its roofline figure; a run without one shows "-"
    assert any("| f32 | flash |" in line and "| - |" in line for line in table), table
    assert any("no int8 peer ran" in line for line in table), table
    assert any("| f32 | flash |" in line and "| ov_sdpa |" in line for line in table), table


def test_a_long_headline_table_keeps_the_longest_context_and_says_where_the_rest_is(monkeypatch):
    """The README is the front door: past MAX_HEADLINE_ROWS rows (several shape families, two classes
    of arithmetic each) a table keeps the run's longest context and points at the folder's report for
    the rows it left out; a short table keeps every row."""
    monkeypatch.setattr(docs, "lead_per_pass", lambda folder, best, peer: "-")
    base = {"threads": "2", "head_dim": "128", "q_len": 1, "flops": "1e9", "bytes": "1e9", "status": "ok",
            "dtype": "f32"}
    rows = []
    for kv_heads in ("2", "8", "32"):
        for kv_len in (32768, 131072) if kv_heads == "8" else (32768,):
            for cache in ("q8_0", "q4_0", "u8", "u4"):
                shape = dict(base, q_heads="32", kv_heads=kv_heads, kv_len=kv_len, kv_dtype=cache)
                rows += [dict(shape, kernel="decode", isa="avx512", time_median_s="0.004"),
                         dict(shape, kernel="decode_i8", isa="avx512", time_median_s="0.003"),
                         dict(shape, kernel="ort_gqa", isa="peer", time_median_s="0.012")]
    dims = ["q_heads", "kv_heads", "head_dim", "q_len", "kv_len", "kv_dtype", "threads"]
    table = docs.headline_table("x", machine((100e9, 10e9)), rows, dims)
    body = [line for line in table if line.startswith("| 32/")]
    assert len(body) == 8 and all("kv 131072" in line for line in body), table  # 4 caches x 2 classes
    assert any("(24 more rows at shorter lengths: [results/x/report.md]" in line for line in table), table
    short = docs.headline_table("x", machine((100e9, 10e9)), [r for r in rows if r["kv_heads"] == "32"], dims)
    assert len([line for line in short if line.startswith("| 32/")]) == 8, short
    assert not any("more rows at shorter lengths" in line for line in short), short
