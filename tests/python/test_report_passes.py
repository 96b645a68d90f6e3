"""The per-pass speed-up (scripts/report/load.py: pass_ratios; the report's peer table and
scripts/docs.py's headline both call it): a sweep with rounds times each point `repetitions`
times per pass, appended pass by pass in points/<id>.json; the lab point and its peer are
compared pass by pass, so a host that slows between passes moves both."""

import json
import os
import sys

import pytest

pytest.importorskip("matplotlib")  # the report package draws its plots with it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from report.load import pass_ratios, pass_times  # noqa: E402


def write_point(folder, point_id, times):
    os.makedirs(os.path.join(folder, "points"), exist_ok=True)
    with open(os.path.join(folder, "points", point_id + ".json"), "w") as f:
        json.dump({"record": {"times_s": times}}, f)


def test_ratios_pass_by_pass(tmp_path):
    folder = str(tmp_path)
    # Pass 1 on a slow host (both 2x slower), pass 2 on a calm one; the peer 1.5x the lab's time
    # in pass 1 and level in pass 2 - the overall medians would mix the passes.
    write_point(folder, "lab", [2.0, 2.2, 2.1, 1.0, 1.1, 1.05])
    write_point(folder, "peer", [3.0, 3.3, 3.15, 1.0, 1.1, 1.05])
    lab, peer = {"id": "lab", "rounds": 2}, {"id": "peer", "rounds": 2}
    assert pass_times(folder, lab) == [[2.0, 2.2, 2.1], [1.0, 1.1, 1.05]]
    assert pass_ratios(folder, lab, peer) == pytest.approx([1.5, 1.0])


def test_no_ratios_without_passes_or_times(tmp_path):
    folder = str(tmp_path)
    write_point(folder, "lab", [1.0, 1.1, 1.2, 1.3, 1.4])  # 5 repetitions do not split into 2 passes
    write_point(folder, "peer", [1.0, 1.1, 1.2, 1.3])
    assert pass_times(folder, {"id": "lab", "rounds": 2}) is None
    assert pass_ratios(folder, {"id": "lab", "rounds": 2}, {"id": "peer", "rounds": 2}) is None
    assert pass_ratios(folder, {"id": "peer", "rounds": 1}, {"id": "peer", "rounds": 1}) is None  # one pass
    assert pass_ratios(folder, {"id": "gone", "rounds": 2}, {"id": "peer", "rounds": 2}) is None  # no times
    assert pass_ratios(None, {"id": "lab", "rounds": 2}, {"id": "peer", "rounds": 2}) is None


def test_arithmetic_section_pairs_a_narrow_kernel_with_its_float32_twin(tmp_path):
    # decode_i8 beside decode on one point and target (the report's Arithmetic section); a decode
    # point without a narrow twin, and a decode_i8 point of another target, make no row.
    from report import schema
    from report.tables import arithmetic_section
    folder = str(tmp_path)
    write_point(folder, "f", [4.0, 4.4, 2.0, 2.2])
    write_point(folder, "n", [2.0, 2.2, 2.0, 2.2])
    shape = {k: None for k in schema.DIMS}
    shape.update(batch=1, q_heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, kv_dtype="u8")
    common = dict(shape, isa="avx512", rounds=2, err_o_rel=1e-8, tol_o_rel=7e-5, bw_fraction_probe_median=0.5)
    f = dict(common, id="f", kernel="decode", time_median_s=0.004)
    n = dict(common, id="n", kernel="decode_i8", time_median_s=0.002, err_o_rel=2e-5)
    other = dict(n, id="o", isa="avx2")
    lone = dict(common, id="l", kernel="decode", kv_dtype="q8_0", time_median_s=0.003)
    md = arithmetic_section([f, n, other, lone], [f, n, other, lone], folder)
    rows = [line for line in md if line.startswith("| b1")]
    assert len(rows) == 1, md
    assert "| u8 | avx512 | 4 | 2 | 2.00x | 1.50x [1.00, 2.00] |" in rows[0]
    assert "2.0e-05 | 7.0e-05 |" in rows[0]
    assert arithmetic_section([f, lone], [f, lone], folder) == []
    # A kernel run on several targets is labelled kernel[isa] (label_targets): paired by its own name.
    fl, nl = dict(f, kernel="decode[avx512]", kernel_name="decode"), dict(n, kernel="decode_i8[avx512]",
                                                                          kernel_name="decode_i8")
    assert len([line for line in arithmetic_section([fl, nl], [fl, nl], folder) if line.startswith("| b1")]) == 1
    # flash_int8 pairs with flash (prefill: its % of the FMA peak beside flash's); never with decode.
    pre = dict(shape, q_len=4096, kv_len=4096, kv_dtype="dtype", dtype="f32")
    ff = dict(common, **pre, id="f", kernel="flash", time_median_s=0.004, peak_fraction=0.6)
    fi = dict(common, **pre, id="n", kernel="flash_int8", time_median_s=0.002, peak_fraction=1.2)
    dec = dict(ff, kernel="decode")
    rows = [line for line in arithmetic_section([ff, fi, dec], [ff, fi, dec], folder) if line.startswith("| b1")]
    assert len(rows) == 1 and "| 60 / 120 |" in rows[0], rows
    assert [line for line in arithmetic_section([dec, fi], [dec, fi], folder) if line.startswith("| b1")] == []
    # flash_int8_amx (isa amx_int8) pairs with flash on avx512.
    fa = dict(fi, kernel="flash_int8_amx", isa="amx_int8")
    rows = [line for line in arithmetic_section([ff, fa], [ff, fa], folder) if line.startswith("| b1")]
    assert len(rows) == 1 and "| amx_int8 |" in rows[0], rows
