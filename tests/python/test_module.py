"""The Python module (src/python/module.cpp) against a float64 numpy implementation written here,
its error paths, and that it reads numpy arrays, DLPack objects, torch tensors and JAX arrays in
place. Run by ctest (Python.module) with PYTHONPATH=build/python under Debian's python3 (numpy
1.24), and by `scripts/lab pip-test` in a venv where `pip install .` put the module beside numpy 2
(and torch / JAX when that venv has them: their tests skip otherwise)."""

import numpy as np
import pytest

import attnlab


def reference(q, k, v, causal=False, window=None, kv_lens=None, scale=None):
    """float64 attention, bhsd; causal bottom-right; window (left, right), -1 unbounded."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    o = np.zeros((b, hq, lq, v.shape[3]))
    lse = np.full((b, hq, lq), -np.inf)
    for bi in range(b):
        n = lk if kv_lens is None else kv_lens[bi]
        i = np.arange(lq)[:, None]
        j = np.arange(lk)[None, :]
        off = n - lq
        keep = np.ones((lq, lk), dtype=bool) & (j < n)
        if causal:
            keep &= j <= i + off
        if window is not None:
            left, right = window
            if left >= 0:
                keep &= j >= i + off - left
            if right >= 0:
                keep &= j <= i + off + right
        sb = np.where(keep, s[bi], -np.inf)
        m = sb.max(axis=-1, keepdims=True)
        live = np.isfinite(m)
        p = np.where(keep, np.exp(sb - np.where(live, m, 0)), 0)
        l = p.sum(axis=-1, keepdims=True)
        o[bi] = np.where(live, (p @ v[bi]) / np.where(live, l, 1), 0)
        lse[bi] = np.where(live[..., 0], (m + np.log(np.where(live, l, 1)))[..., 0], -np.inf)
    return o, lse


def reference_backward(q, k, v, do, causal=False, window=None, kv_lens=None, scale=None):
    """float64 dq, dk, dv of reference() for the gradient do (backward.hpp's formulas), bhsd."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    o, lse = reference(q, k, v, causal, window, kv_lens, scale)
    s = scale * np.einsum("bhid,bhjd->bhij", q, kr)
    live = np.isfinite(lse)[..., None]
    p = np.where(live, np.exp(s - np.where(live, lse[..., None], 0)), 0)
    for bi in range(b):  # the mask, as reference() builds it
        n = lk if kv_lens is None else kv_lens[bi]
        i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
        keep = np.ones((lq, lk), dtype=bool) & (j < n)
        if causal:
            keep &= j <= i + n - lq
        if window is not None:
            if window[0] >= 0:
                keep &= j >= i + n - lq - window[0]
            if window[1] >= 0:
                keep &= j <= i + n - lq + window[1]
        p[bi] = np.where(keep, p[bi], 0)
    dvr = np.einsum("bhij,bhid->bhjd", p, do)
    dp = np.einsum("bhid,bhjd->bhij", do, vr)
    ds = p * (dp - np.sum(do * o, axis=-1, keepdims=True))
    dq = scale * np.einsum("bhij,bhjd->bhid", ds, kr)
    dkr = scale * np.einsum("bhij,bhid->bhjd", ds, q)
    fold = lambda x: x.reshape(b, hkv, g, lk, x.shape[-1]).sum(axis=2)  # a group's heads into its kv head
    return dq, fold(dkr), fold(dvr)


def inputs(b=2, hq=6, hkv=2, lq=33, lk=70, d=40, dv=None, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, (b, hq, lq, d)).astype(dtype)
    k = rng.uniform(-1, 1, (b, hkv, lk, d)).astype(dtype)
    v = rng.uniform(-1, 1, (b, hkv, lk, dv or d)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("kernel", ["naive", "blocked", "flash", "simd", "threaded"])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_numpy(kernel, causal):
    q, k, v = inputs()
    o, lse = attnlab.attention(q, k, v, kernel=kernel, causal=causal, return_lse=True, threads=2)
    ro, rl = reference(q, k, v, causal=causal)
    assert o.dtype == np.float32 and o.shape == ro.shape
    assert np.max(np.abs(o - ro)) < 1e-5
    assert np.max(np.abs(lse - rl)) < 1e-5


def test_masks_windows_kv_lens_scale_and_head_dim_v():
    q, k, v = inputs(dv=24)  # d_v != d_qk (MLA)
    kw = dict(causal=True, window=(9, 0), kv_lens=[70, 0], scale=0.3)
    for kernel in ["naive", "flash"]:
        o, lse = attnlab.attention(q, k, v, kernel=kernel, return_lse=True, **kw)
        ro, rl = reference(q, k, v, **kw)
        assert o.shape == (2, 6, 33, 24)
        assert np.max(np.abs(o - ro)) < 1e-5
        assert np.array_equal(np.isinf(lse), np.isinf(rl))  # kv_lens 0: fully masked rows, -inf
        assert np.all(o[1] == 0)


def test_decode_top_left_and_bshd():
    q, k, v = inputs(lq=1, lk=600)
    o = attnlab.attention(q, k, v, kernel="decode", causal=True)
    assert np.max(np.abs(o - reference(q, k, v, causal=True)[0])) < 1e-5
    q, k, v = inputs(lq=40, lk=30)
    ro = reference(q, k, v, causal=True, window=None)[0]  # bottom-right: rows above see nothing
    o = attnlab.attention(q, k, v, causal="bottom_right")
    assert np.max(np.abs(o - ro)) < 1e-5
    tl = attnlab.attention(q, k, v, causal="top_left")
    assert not np.allclose(tl, o)  # top-left differs from bottom-right when q_len != kv_len
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    ob = attnlab.attention(t(q), t(k), t(v), causal=True, layout="bshd")
    assert np.max(np.abs(t(ob) - o)) == 0 or np.max(np.abs(t(ob) - o)) < 1e-6


def test_sixteen_bit_inputs_are_read_in_place():
    q, k, v = inputs(dtype=np.float16)
    o = attnlab.attention(q, k, v, kernel="flash")
    assert np.max(np.abs(o - reference(q, k, v)[0])) < 1e-5  # f16 widened exactly: the same values
    bits = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncation to bf16
    qb, kb, vb = (bits(x) for x in inputs())
    widen = lambda x: (x.astype(np.uint32) << 16).view(np.float32)
    o = attnlab.attention(qb, kb, vb, dtype="bf16", kernel="flash")  # (auto: bf16 products where the CPU has them)
    assert np.max(np.abs(o - reference(widen(qb), widen(kb), widen(vb))[0])) < 1e-5


def test_auto_kernel_reports_what_ran():
    """kernel "auto" (the default) runs the table's choice (`attnlab list`) and return_info says which:
    decode for a few rows against a cache, flash for prefill, flash_int8 only when arithmetic="int8"
    allows it; a named kernel runs as named, and arithmetic with it is refused."""
    q, k, v = inputs(b=1, hq=8, hkv=2, lq=1, lk=300, d=64)
    o, info = attnlab.attention(q, k, v, causal=True, return_info=True)
    assert info["name"] == "decode" and info["kernel"].startswith("decode["), info
    assert "any other cache" in info["rule"], info
    assert np.abs(o - reference(q, k, v, causal=True)[0]).max() < 1e-5
    o2, lse, info2 = attnlab.attention(q, k, v, causal=True, return_lse=True, return_info=True)
    assert info2 == info and np.array_equal(o, o2) and lse.shape == (1, 8, 1)
    q, k, v = inputs(b=1, hq=4, hkv=4, lq=128, lk=128, d=64)
    assert attnlab.attention(q, k, v, return_info=True)[1]["name"] == "flash"
    int8 = attnlab.attention(q, k, v, arithmetic="int8", return_info=True)[1]
    assert int8["name"] in ("flash_int8", "flash_int8_amx"), int8  # (flash_int8 runs on every target)
    assert attnlab.attention(q, k, v, kernel="naive", return_info=True)[1] == dict(
        kernel="naive", name="naive", isa="baseline", rule="named", passed_over="")
    with pytest.raises(ValueError, match="arithmetic: 'int8' with kernel 'naive'; allowed: with kernel 'auto' only"):
        attnlab.attention(q, k, v, kernel="naive", arithmetic="int8")
    with pytest.raises(ValueError, match="arithmetic: 'fp8'; allowed: native"):
        attnlab.attention(q, k, v, arithmetic="fp8")


def test_no_copies_for_contiguous_inputs():
    for dtype in (np.float32, np.float16):
        q, k, v = inputs(dtype=dtype, dv=16)
        views = attnlab._views(q, k, v)
        assert views["q"] == q.ctypes.data and views["k"] == k.ctypes.data and views["v"] == v.ctypes.data
        assert "head_dim_v=16" in views["problem"]


def test_attention_backward_matches_numpy():
    q, k, v = inputs(dv=24)
    do = np.random.default_rng(1).uniform(-1, 1, (2, 6, 33, 24)).astype(np.float32)
    for kw in [dict(), dict(causal=True, window=(9, 0), kv_lens=[70, 17], scale=0.3)]:
        dq, dk, dv = attnlab.attention_backward(q, k, v, do, **kw)  # flash, O and LSE from its own forward
        rq, rk, rv = reference_backward(q, k, v, do, **kw)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        for got, want in ((dq, rq), (dk, rk), (dv, rv)):
            assert np.max(np.abs(got - want)) < 1e-5 * max(1.0, np.max(np.abs(want)))
        o, lse = attnlab.attention(q, k, v, kernel="flash", return_lse=True, **kw)
        given = attnlab.attention_backward(q, k, v, do, o=o, lse=lse, **kw)
        assert all(np.array_equal(x, y) for x, y in zip(given, (dq, dk, dv)))
        naive = attnlab.attention_backward(q, k, v, do, kernel="naive", **kw)
        for got, want in zip(naive, (rq, rk, rv)):
            assert np.max(np.abs(got - want)) < 1e-5 * max(1.0, np.max(np.abs(want)))
    fq, fk, fv = attnlab.attention_backward(q, k, v, do, kernel="flash", causal=True)
    rq, rk, rv = reference_backward(q, k, v, do, causal=True)
    for got, want in ((fq, rq), (fk, rk), (fv, rv)):
        assert np.max(np.abs(got - want)) < 1e-5 * max(1.0, np.max(np.abs(want)))
    with pytest.raises(ValueError, match="backward: blocked has no backward pass; allowed: naive, flash"):
        attnlab.attention_backward(q, k, v, do, kernel="blocked")
    with pytest.raises(ValueError, match="^do: shape"):
        attnlab.attention_backward(q, k, v, do[:, :, :5].copy())
    with pytest.raises(ValueError, match="^o, lse: give both"):
        attnlab.attention_backward(q, k, v, do, o=do)


class DlpackOnly:
    """An array known only by the DLPack protocol (as torch and JAX hand theirs out)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_objects_and_read_only_arrays_are_read_in_place():
    q, k, v = inputs(dv=16)
    views = attnlab._views(DlpackOnly(q), DlpackOnly(k), DlpackOnly(v))
    assert views["q"] == q.ctypes.data and views["k"] == k.ctypes.data and views["v"] == v.ctypes.data
    o = attnlab.attention(DlpackOnly(q), DlpackOnly(k), DlpackOnly(v), causal=True)
    assert isinstance(o, np.ndarray) and np.max(np.abs(o - reference(q, k, v, causal=True)[0])) < 1e-5
    with pytest.raises(ValueError, match="^k: not C-contiguous"):
        attnlab.attention(DlpackOnly(q), DlpackOnly(k[:, :, ::2]), DlpackOnly(v[:, :, ::2]))
    for x in (q, k, v):
        x.flags.writeable = False  # read-only: numpy's __dlpack__ refuses these, the buffer protocol not
    assert attnlab._views(q, k, v)["q"] == q.ctypes.data
    assert np.array_equal(attnlab.attention(q, k, v, causal=True), o)


def test_torch_tensors_in_and_out_without_copies():
    torch = pytest.importorskip("torch")
    q, k, v = inputs()
    tq, tk, tv = (torch.from_numpy(x.copy()) for x in (q, k, v))
    views = attnlab._views(tq, tk, tv)
    assert (views["q"], views["k"], views["v"]) == (tq.data_ptr(), tk.data_ptr(), tv.data_ptr())
    o, lse = attnlab.attention(tq, tk, tv, causal=True, return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32 and isinstance(lse, torch.Tensor)
    ro, rl = reference(q, k, v, causal=True)
    assert np.max(np.abs(o.numpy() - ro)) < 1e-5 and np.max(np.abs(lse.numpy() - rl)) < 1e-5
    # bfloat16 tensors directly (not uint16 bits), and the seq-major layout through a contiguous copy
    bq, bk, bv = (x.to(torch.bfloat16) for x in (tq, tk, tv))
    assert attnlab._views(bq, bk, bv)["q"] == bq.data_ptr()
    ob = attnlab.attention(bq, bk, bv, kernel="flash")  # (auto: bf16 products where the CPU has them)
    widened = [x.float().numpy() for x in (bq, bk, bv)]
    assert np.max(np.abs(ob.numpy() - reference(*widened)[0])) < 1e-5
    t = lambda x: x.transpose(1, 2).contiguous()
    os_ = attnlab.attention(t(tq), t(tk), t(tv), causal=True, layout="bshd")
    assert np.max(np.abs(os_.transpose(1, 2).numpy() - ro)) < 1e-5
    with pytest.raises(ValueError, match="^q: not C-contiguous"):
        attnlab.attention(tq.transpose(1, 2), tk, tv)
    with pytest.raises(TypeError, match="^q: .*requires grad"):
        attnlab.attention(tq.clone().requires_grad_(), tk, tv)
    with pytest.raises(TypeError, match="^v: .* is not read in place"):
        attnlab.attention(tq, tk, tv.double())
    # The backward against torch's own autograd through its SDPA (GQA by repeating K/V heads).
    rq, rk, rv = (x.clone().double().requires_grad_() for x in (tq, tk, tv))
    g = rq.shape[1] // rk.shape[1]
    ref = torch.nn.functional.scaled_dot_product_attention(
        rq, rk.repeat_interleave(g, dim=1), rv.repeat_interleave(g, dim=1), is_causal=False)
    do = torch.rand_like(ref, dtype=torch.float32)
    ref.backward(do.double())
    dq, dk, dv = attnlab.attention_backward(tq, tk, tv, do)
    assert all(isinstance(x, torch.Tensor) for x in (dq, dk, dv))
    for got, want in ((dq, rq.grad), (dk, rk.grad), (dv, rv.grad)):
        assert torch.max(torch.abs(got.double() - want)) < 1e-5 * max(1.0, torch.max(torch.abs(want)).item())


def test_jax_arrays_in_and_out_without_copies():
    jnp = pytest.importorskip("jax.numpy")
    q, k, v = inputs()
    jq, jk, jv = (jnp.asarray(x) for x in (q, k, v))
    views = attnlab._views(jq, jk, jv)
    assert views["q"] == jq.unsafe_buffer_pointer() and views["v"] == jv.unsafe_buffer_pointer()
    o = attnlab.attention(jq, jk, jv, causal=True)
    assert type(o).__module__.split(".")[0] in ("jax", "jaxlib")
    assert np.max(np.abs(np.asarray(o) - reference(q, k, v, causal=True)[0])) < 1e-5


def test_errors_name_the_argument():
    q, k, v = inputs()
    with pytest.raises(TypeError, match="^q: builtins.list is neither an array with the buffer protocol"):
        attnlab.attention(q.tolist(), k, v)
    with pytest.raises(TypeError, match="^k: dtype float64"):
        attnlab.attention(q, k.astype(np.float64), v)
    with pytest.raises(ValueError, match="^v: not C-contiguous"):
        attnlab.attention(q, k, v.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2))
    with pytest.raises(ValueError, match="^q: shape \\(6, 33, 40\\) has 3 dimensions"):
        attnlab.attention(q[0], k, v)
    # The CLI's rule and text for .npy files (size_from_arrays, attnlab/problem.hpp).
    with pytest.raises(ValueError, match="^v: shape .* differs from K's .*; allowed: V has K's shape but for its last"):
        attnlab.attention(q, k, v[:, :, :-1].copy())
    with pytest.raises(ValueError, match="^causal: 'diagonal'"):
        attnlab.attention(q, k, v, causal="diagonal")
    with pytest.raises(ValueError, match="kv_heads"):
        attnlab.attention(q, k[:, :1].repeat(4, axis=1), v[:, :1].repeat(4, axis=1))  # 4 does not divide 6
    with pytest.raises(ValueError, match="unknown kernel|allowed"):
        attnlab.attention(q, k, v, kernel="fastest")
    with pytest.raises(ValueError, match="head_dim_v != head_dim"):
        attnlab.attention(*inputs(dv=8), kernel="simd")  # simd keeps one head_dim: says who runs it
    with pytest.raises(ValueError, match="^threads: -1 is not allowed; allowed: 1 to 1024, or 0 for all cores"):
        attnlab.attention(q, k, v, threads=-1)  # (0 and None: all cores, the lab's one thread rule)
    with pytest.raises(TypeError, match="dtype=\"bf16\""):
        attnlab.attention(np.zeros(q.shape, np.uint16), k, v)  # bf16 bits need dtype="bf16"


def test_kernels_verify_and_peak():
    ks = attnlab.kernels()
    names = {x["name"] for x in ks}
    assert {"naive", "blocked", "simd", "threaded", "flash", "decode"} <= names
    flash = [x for x in ks if x["name"] == "flash" and x["default"]]
    assert len(flash) == 1 and flash[0]["available"]
    q, k, v = inputs(lq=5, lk=50)
    rows = attnlab.verify(q, k, v, kernels=["naive", "flash", "decode"], causal=True)
    assert [r["verdict"] for r in rows] == ["PASS", "PASS", "PASS"]
    assert all(r["o_rel"] <= r["tol_o_rel"] for r in rows)
    skipped = attnlab.verify(*inputs(), kernels="decode")  # q_len 33 > 16
    assert skipped[0]["verdict"] == "SKIP" and "q_len" in skipped[0]["reason"]
    p = attnlab.peak(threads=1, seconds=0.02)
    assert p["fma_flops"] > 1e9 and p["read_bytes"] > 1e8


def test_every_setting_axis_is_a_keyword():
    """The point schema's setting, mask and score axes are keywords of attention and verify, with
    the experiment key's grammar (src/schema/point_schema.cpp); others are refused, naming the
    allowed ones."""
    q, k, v = inputs(lq=5, lk=9)
    settings = [a for a in attnlab.axes() if a["kind"] in ("setting", "mask", "score")
                and a["key"] not in ("causal", "window", "kv_lens")]  # parameters of their own
    assert {"layout", "dtype", "sinks", "global", "doc_lens", "dilation", "bigbird", "mask_file"} <= {
        a["key"] for a in settings}
    assert {"layout", "dtype"} <= {a["key"] for a in settings}
    assert {"softcap", "alibi", "sink_logits"} <= {a["key"] for a in settings}
    assert {a["kind"] for a in attnlab.axes()} == {"size", "setting", "mask", "score", "run", "sweep"}
    # The sweep's pass axis is not a keyword: attention_backward computes the backward.
    assert [a["key"] for a in attnlab.axes() if a["kind"] == "sweep"] == ["pass"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'pass'; allowed: kernel, causal"):
        attnlab.attention(q, k, v, kernel="naive", **{"pass": "backward"})
    for a in settings:
        if a["key"] in ("layout", "dtype"):  # their own keywords: they say how to read the arrays
            continue
        o = attnlab.attention(q, k, v, kernel="naive", **{a["key"]: a["default"]})
        assert o.shape == (2, 6, 5, 40)
        assert attnlab.verify(q, k, v, kernels="naive", rows=4, **{a["key"]: a["default"]})[0]["verdict"] == "PASS"
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'; allowed: kernel, causal"):
        attnlab.attention(q, k, v, colour=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'q_len'"):
        attnlab.attention(q, k, v, q_len=5)  # a size: read off the arrays


def test_sparse_pattern_keywords():
    """A sparse pattern term is a keyword (an axis of the schema): flash and naive agree on it, it
    changes O, and a bad value names the key and what it allows."""
    q, k, v = inputs(lq=64, lk=64)
    terms = {"window": (8, 0), "sinks": 3, "global": [5, 40], "dilation": 2}
    o = attnlab.attention(q, k, v, kernel="flash", **terms)
    n = attnlab.attention(q, k, v, kernel="naive", **terms)
    assert np.abs(o - n).max() < 1e-5
    assert np.abs(o - attnlab.attention(q, k, v, kernel="flash", window=(8, 0))).max() > 1e-3
    r = attnlab.verify(q, k, v, kernels=["naive", "flash"], rows=8, window=(8, 8), bigbird=[16, 1, 3])
    assert [x["verdict"] for x in r] == ["PASS", "PASS"]
    with pytest.raises(attnlab.InvalidInput, match="'sinks': bad value -1; allowed: .*each >= 0"):
        attnlab.attention(q, k, v, window=(8, 0), sinks=-1)


def test_score_modification_keywords():
    """softcap, alibi and sink_logits are keywords (score axes of the schema): flash, decode and naive
    agree on them and pass the reference, each changes O, a sink logit alone is a fully masked
    row's LSE, and a bad value names the key."""
    q, k, v = inputs(b=1, hq=4, hkv=2, lq=3, lk=200, d=32)
    mods = {"softcap": 2.5, "alibi": True, "sink_logits": [0.5, -1.0, 2.0, 0.0]}
    n = attnlab.attention(q, k, v, kernel="naive", causal=True, **mods)
    for kernel in ("flash", "decode"):
        assert np.abs(attnlab.attention(q, k, v, kernel=kernel, causal=True, **mods) - n).max() < 1e-5
    r = attnlab.verify(q, k, v, kernels=["naive", "flash", "decode"], rows=12, causal=True, **mods)
    assert [x["verdict"] for x in r] == ["PASS"] * 3
    plain = attnlab.attention(q, k, v, kernel="naive", causal=True)
    for key, value in mods.items():
        assert np.abs(attnlab.attention(q, k, v, kernel="naive", causal=True, **{key: value}) - plain).max() > 1e-3
    o, lse = attnlab.attention(q, k, v, kernel="flash", kv_lens=[0], sink_logits=1.5, return_lse=True)
    assert np.all(o == 0) and np.allclose(lse, 1.5)
    with pytest.raises(attnlab.InvalidInput, match="sink_logits: 2 values given; allowed: one per query head"):
        attnlab.attention(q, k, v, kernel="naive", sink_logits=[1.0, 2.0])
    with pytest.raises(attnlab.InvalidInput, match="'softcap': bad value -1"):
        attnlab.attention(q, k, v, kernel="naive", softcap=-1)


def test_quantized_cache_keyword():
    """kv_dtype writes float K and V into a quantized cache: decode, flash and naive read it alike and
    pass the reference on it; the O moves by the quantization."""
    q, k, v = inputs(b=1, hq=8, hkv=2, lq=1, lk=300, d=64)
    f = attnlab.attention(q, k, v, kernel="decode")
    for t in ("q8_0", "q4_0", "u8", "u4", "fp8_e4m3", "fp8_e5m2"):
        d = attnlab.attention(q, k, v, kernel="decode", kv_dtype=t)
        n = attnlab.attention(q, k, v, kernel="naive", kv_dtype=t)
        assert np.abs(d - n).max() < 1e-5, t
        assert np.abs(d - f).max() > 1e-6, t
        fl = attnlab.attention(q, k, v, kernel="flash", kv_dtype=t)
        assert np.abs(fl - n).max() < 1e-5, t
        assert all(r["verdict"] == "PASS"
                   for r in attnlab.verify(q, k, v, kernels=["naive", "flash", "decode"], kv_dtype=t))
    with pytest.raises(ValueError, match="head_dim: 40 is not a multiple of 32"):
        attnlab.attention(*inputs(), kernel="decode", kv_dtype="q8_0")
    with pytest.raises(ValueError, match="'kv_dtype': bad value"):
        attnlab.attention(q, k, v, kernel="decode", kv_dtype="q3_k")


def q8_0_rows(x):
    """ggml's quantize_row_q8_0_ref in numpy: per 32 values an f16 scale d = amax / 127 and the int8
    round(x / d) - the bytes a llama.cpp cache holds; x (..., d) float32 -> (..., d / 32 * 34) uint8."""
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    qs = np.round(blocks * inv[:, None]).astype(np.int8)
    rows = np.concatenate([d.astype(np.float16)[:, None].view(np.uint8), qs.view(np.uint8)], axis=1)
    return np.ascontiguousarray(rows.reshape(*x.shape[:-1], -1))


def test_raw_quantized_cache_arrays():
    """A cache written elsewhere, given as stored: uint8 k and v of q8_0 rows (ggml's bytes) are read in
    place - O bitwise the one of the same cache written from float k and v - paged too; uint8 without
    kv_dtype, rows of the wrong size, and a float v beside a uint8 k are refused naming the argument."""
    q, k, v = inputs(b=1, hq=8, hkv=2, lq=2, lk=300, d=64)
    kq, vq = q8_0_rows(k), q8_0_rows(v)
    assert kq.dtype == np.uint8 and kq.shape == (1, 2, 300, 68)
    for kernel in ("decode", "flash", "naive"):
        a = attnlab.attention(q, k, v, kernel=kernel, causal=True, kv_dtype="q8_0")
        b = attnlab.attention(q, kq, vq, kernel=kernel, causal=True, kv_dtype="q8_0")
        assert np.array_equal(a, b), kernel
        if kernel != "naive":  # the kernels that read a paged cache in place
            c = attnlab.attention(q, kq, vq, kernel=kernel, causal=True, kv_dtype="q8_0", kv_block=16)
            assert np.array_equal(a, c), kernel
    assert all(r["verdict"] == "PASS" for r in attnlab.verify(q, kq, vq, kernels=["naive", "decode"], kv_dtype="q8_0"))
    with pytest.raises(ValueError, match="k: uint8 data is a quantized cache's rows"):
        attnlab.attention(q, kq, vq, kernel="decode")
    with pytest.raises(ValueError, match="k: rows of 68 bytes; allowed: 72 \\(a u8 row of head_dim 64"):
        attnlab.attention(q, kq, vq, kernel="decode", kv_dtype="u8")
    with pytest.raises(TypeError, match="v: float data beside a uint8 cache"):
        attnlab.attention(q, kq, v, kernel="decode", kv_dtype="q8_0")


def to_pool(x, lens, block, rng):
    """A contiguous (batch, heads, seq, d) cache as a paged one: a pool (blocks, heads, block, d) whose
    blocks are scattered by a random permutation, and the int32 block table (batch, entries), -1 past
    a sequence's length."""
    b, h, s, d = x.shape
    entries = -(-s // block)
    need = [-(-n // block) for n in lens]
    ids = rng.permutation(sum(need) + 3)  # 3 spare blocks no sequence uses
    pool = np.zeros((len(ids), h, block, d), x.dtype)
    table = np.full((b, entries), -1, np.int32)
    at = 0
    for i in range(b):
        for e in range(need[i]):
            table[i, e] = ids[at]
            rows = x[i, :, e * block:(e + 1) * block]
            pool[ids[at], :, :rows.shape[1]] = rows
            at += 1
    return pool, table


def test_block_table_reads_a_pool_in_place():
    """k and v as a paged cache's pool with a block table (vLLM's layout): decode and flash read it in
    place and give the contiguous cache's bits, float32 and a raw q8_0 pool, mixed kv_lens; bad tables
    are refused naming the entry."""
    rng = np.random.default_rng(5)
    q, k, v = inputs(b=2, hq=8, hkv=2, lq=3, lk=300, d=64)
    lens = [300, 77]
    for kernel in ("decode", "flash"):
        for kk, vv, kw in ((k, v, {}), (q8_0_rows(k), q8_0_rows(v), {"kv_dtype": "q8_0"})):
            want = attnlab.attention(q, kk, vv, kernel=kernel, causal=True, kv_lens=lens, **kw)
            for block in (16, 64):
                kp, table = to_pool(kk, lens, block, rng)
                vp, _ = to_pool(vv, lens, block, np.random.default_rng(0))
                vp = np.zeros_like(vp)  # V's pool in the same scattered blocks as K's
                for i in range(2):
                    for e in range(-(-lens[i] // block)):
                        rows = vv[i, :, e * block:(e + 1) * block]
                        vp[table[i, e], :, :rows.shape[1]] = rows
                got = attnlab.attention(q, kp, vp, kernel=kernel, causal=True, kv_lens=lens, block_table=table, **kw)
                assert np.array_equal(want, got), (kernel, kw, block)
    kp, table = to_pool(k, lens, 16, rng)
    vp = kp.copy()
    assert attnlab.verify(q, kp, vp, kernels=["naive", "decode"], kv_lens=lens, block_table=table)[0]["verdict"] == "PASS"
    bad = table.copy()
    bad[1, 2] = kp.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[1\]\[2\]: block id .* is outside the pool"):
        attnlab.attention(q, kp, vp, kernel="decode", kv_lens=lens, block_table=bad)
    bad = table.copy()
    bad[1, 0] = table[0, 3]
    with pytest.raises(ValueError, match=r"block_table\[1\]\[0\]: block .* is also block_table\[0\]\[3\]"):
        attnlab.attention(q, kp, vp, kernel="decode", kv_lens=lens, block_table=bad)
    with pytest.raises(ValueError, match="block_table: shape .*allowed: a C-contiguous int32 array"):
        attnlab.attention(q, kp, vp, kernel="decode", kv_lens=lens, block_table=table.astype(np.int64))
    with pytest.raises(ValueError, match="kv_block: 64 beside a pool of 16-token blocks"):
        attnlab.attention(q, kp, vp, kernel="decode", kv_lens=lens, block_table=table, kv_block=64)


def test_paged_cache_keyword():
    """kv_block copies K and V into a paged cache's scattered blocks: decode and flash read the blocks
    in place and give the contiguous cache's bits; a mixed-length batch too; kv_shared is refused."""
    q, k, v = inputs(b=2, hq=8, hkv=2, lq=3, lk=300, d=64)
    for kernel in ("decode", "flash"):
        for t in ("dtype", "q4_0"):
            a = attnlab.attention(q, k, v, kernel=kernel, causal=True, kv_lens=[300, 77], kv_dtype=t)
            for block in (16, 64, 256):
                b = attnlab.attention(q, k, v, kernel=kernel, causal=True, kv_lens=[300, 77], kv_dtype=t,
                                      kv_block=block)
                assert np.array_equal(a, b), (kernel, t, block)
    assert all(r["verdict"] == "PASS"
               for r in attnlab.verify(q, k, v, kernels=["naive", "flash", "decode"], kv_block=32))
    with pytest.raises(ValueError, match="kv_block: 24 is not allowed"):
        attnlab.attention(q, k, v, kv_block=24)
    with pytest.raises(ValueError, match="kv_shared: the arrays give V as its own tensor"):
        attnlab.attention(q, k, v, kv_shared=True)


def test_mask_keyword(tmp_path):
    """mask= (a bool or uint8 array, nonzero = attend) is the problem's mask: flash and naive agree
    on it with a float64 reference, a row that sees nothing is 0, and a bad array names the key."""
    q, k, v = inputs(lq=9, lk=13)
    rng = np.random.default_rng(7)
    m = rng.random((2, 1, 9, 13)) < 0.6
    m[1, 0, 4, :] = False
    f = attnlab.attention(q, k, v, kernel="flash", mask=m)
    n = attnlab.attention(q, k, v, kernel="naive", mask=m.astype(np.uint8))
    assert np.abs(f - n).max() < 1e-5
    assert not f[1, :, 4].any()
    with pytest.raises(ValueError, match="mask: shape \\(9, 12\\), format '\\?'"):
        attnlab.attention(q, k, v, mask=np.ones((9, 13), bool)[:, :12])
    np.save(tmp_path / "m.npy", m)
    assert np.array_equal(attnlab.attention(q, k, v, kernel="flash", mask_file=str(tmp_path / "m.npy")), f)
    with pytest.raises(ValueError, match="mask: given beside mask_file"):
        attnlab.attention(q, k, v, mask=m, mask_file=str(tmp_path / "m.npy"))


def test_write_kv_appends_where_attention_reads():
    """write_kv stores rows at their positions - a prompt, then one token at a time - in a contiguous
    cache and, through a block table, in a pool: the bytes ggml's q8_0 writer gives for the whole K
    (numpy's, written here), nothing else touched; read_kv reads them back as the layout says (f16
    scale times int8 codes); attention reads the growing cache in place with kv_lens, bitwise as the
    cache written whole. A float16 cache holds the rounded values. Bad calls are refused by name."""
    rng = np.random.default_rng(9)
    q, k, v = inputs(b=2, hq=4, hkv=2, lq=1, lk=50, d=64)
    kc, vc = (np.zeros((2, 2, 64, attnlab.kv_row_bytes("q8_0", 64)), np.uint8) for _ in "kv")
    for lo, hi in [(0, 40)] + [(t, t + 1) for t in range(40, 50)]:
        attnlab.write_kv(kc, np.ascontiguousarray(k[:, :, lo:hi]), lo, kv_dtype="q8_0")
        attnlab.write_kv(vc, np.ascontiguousarray(v[:, :, lo:hi]), lo, kv_dtype="q8_0")
    assert np.array_equal(kc[:, :, :50], q8_0_rows(k)) and not kc[:, :, 50:].any()
    blocks = kc[:, :, :50].reshape(2, 2, 50, 2, 34)
    scales = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    codes = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
    assert np.array_equal(attnlab.read_kv(kc, kv_dtype="q8_0", length=50), (scales * codes).reshape(2, 2, 50, 64))
    want = attnlab.attention(q, q8_0_rows(k), q8_0_rows(v), kernel="decode", causal=True, kv_dtype="q8_0")
    got = attnlab.attention(q, kc, vc, kernel="decode", causal=True, kv_dtype="q8_0", kv_lens=[50, 50])
    assert np.array_equal(want, got)

    pool, table = to_pool(q8_0_rows(k), [50, 50], 16, rng)
    fresh = np.zeros_like(pool)
    attnlab.write_kv(fresh, np.ascontiguousarray(k[:, :, :20]), 0, kv_dtype="q8_0", block_table=table)
    attnlab.write_kv(fresh, np.ascontiguousarray(k[:, :, 20:]), 20, kv_dtype="q8_0", block_table=table)
    assert np.array_equal(fresh, pool)
    assert np.array_equal(attnlab.read_kv(fresh, kv_dtype="q8_0", length=50, block_table=table),
                          attnlab.read_kv(kc, kv_dtype="q8_0", length=50))

    half = np.zeros((2, 2, 64, 64), np.float16)
    attnlab.write_kv(half, k, 7)
    assert np.array_equal(half[:, :, 7:57], k.astype(np.float16)) and not half[:, :, :7].any()
    assert np.array_equal(attnlab.read_kv(half, length=57)[:, :, 7:], k.astype(np.float16).astype(np.float32))

    with pytest.raises(ValueError, match=r"start: rows \[30, 80\) written; allowed: within \[0, 64\)"):
        attnlab.write_kv(kc, k, 30, kv_dtype="q8_0")
    with pytest.raises(TypeError, match="rows: f16 data; allowed: float32"):
        attnlab.write_kv(half, k.astype(np.float16), 0)
    with pytest.raises(TypeError, match="cache: uint8 rows without kv_dtype"):
        attnlab.write_kv(kc, k, 0)
    with pytest.raises(ValueError, match=r"cache: rows of 68 bytes; allowed: 72 \(a u8 row of 64 values"):
        attnlab.write_kv(kc, k, 0, kv_dtype="u8")
    with pytest.raises(ValueError, match="rows: 2 sequences x 2 kv heads; allowed: the cache's 2 x 4"):
        attnlab.write_kv(np.zeros((2, 4, 64, 64), np.float32), k, 0)
    bad = table.copy()
    bad[1, 3] = -1
    with pytest.raises(ValueError, match=r"block_table\[1\]\[3\]: -1; allowed: a block of the pool"):
        attnlab.write_kv(fresh, k, 0, kv_dtype="q8_0", block_table=bad)
    frozen = np.zeros((2, 2, 64, 64), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="cache: read-only memory"):
        attnlab.write_kv(frozen, k, 0)
    with pytest.raises(ValueError, match="rows of 40 bytes are a row of 63 or 64 values; allowed: dim="):
        attnlab.read_kv(np.zeros((1, 1, 4, 40), np.uint8), kv_dtype="u4")
    with pytest.raises(ValueError, match="dim: 50; allowed: a multiple of 32 for q8_0"):
        attnlab.kv_row_bytes("q8_0", 50)
