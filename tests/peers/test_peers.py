"""The peer runners (scripts/peers/) against numpy_attention's float64 attention, on small
problems covering how each peer is driven: no mask, causal (both alignments), windows, GQA,
decode against a cache, kv_lens, d_v != d, bshd files, sparse patterns. A peer whose library is
not installed in this Python is skipped (scripts/lab peers-setup installs them); a case the
peer declares unsupported must say why (Skip), never return a wrong O."""
import importlib
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "peers"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from common import Problem, Skip, time_calls  # noqa: E402
from numpy_attention import attention, attention_backward  # noqa: E402
from ov_peer import sage_rounded  # noqa: E402  (numpy only: openvino is imported by setup)
from catalogue import CATALOGUE, FAMILY_MODULES, MODULE_OF as MODULES  # noqa: E402  (scripts/peers/catalogue.json)

# The peers that compute on the float32 values they are given (ov_sage rounds them to int8: its own test).
FLOAT_PEERS = sorted(p["name"] for p in CATALOGUE["peers"] if p["products"] == "float")


def peer(kernel):
    name = MODULES[kernel]
    try:
        mod = importlib.import_module(name)
        mod.setup(1)
    except (ImportError, Skip) as e:  # the library is not installed, or not for this CPU (zentorch)
        pytest.skip(f"{name}: {e}")
    return mod


def problem(**kw):
    """A request's problem as the lab writes it (problem_to_json: one key per axis, an off term
    absent), from the cases' terms: causal 0/1/2 (none, bottom-right, top-left), window_left and
    window_right (-1 unbounded), globals."""
    t = dict(batch=1, q_heads=4, kv_heads=2, q_len=9, kv_len=9, head_dim=16, head_dim_v=16, causal=0,
             window_left=-1, window_right=-1, layout="bhsd", dtype="f32", sinks=0, globals=[], doc_lens=[],
             dilation=1, kv_lens=[])
    t.update(kw)
    d = {k: v for k, v in t.items() if k not in ("causal", "window_left", "window_right", "globals")}
    d["causal"] = {0: False, 1: True, 2: "top_left"}[t["causal"]]
    if t["window_left"] >= 0 or t["window_right"] >= 0:
        d["window"] = [t["window_left"], t["window_right"]]
    for key, value in (("global", t["globals"]), ("doc_lens", t["doc_lens"]), ("kv_lens", t["kv_lens"])):
        if value:
            d[key] = value
        else:
            d.pop(key, None)
    d["scale"] = float(np.float32(1 / np.sqrt(d["head_dim"])))
    return Problem(d)


CASES = {
    "dense": {},
    "mha": dict(kv_heads=4),
    "causal": dict(causal=1),
    "causal_cross_bottom_right": dict(causal=1, q_len=5, kv_len=13),
    "causal_top_left": dict(causal=2, q_len=5, kv_len=13),
    "decode": dict(causal=1, q_len=1, kv_len=37, q_heads=8, kv_heads=2),
    "decode_mqa": dict(causal=1, q_len=1, kv_len=50, q_heads=4, kv_heads=1),
    "decode_batch_dv": dict(batch=2, q_len=1, kv_len=33, q_heads=6, kv_heads=3, head_dim_v=24),
    "chunk_window": dict(causal=1, q_len=4, kv_len=40, window_left=7, window_right=0),
    "window": dict(causal=1, q_len=33, kv_len=33, window_left=5, window_right=0),
    "window_both": dict(q_len=21, kv_len=21, window_left=3, window_right=2),
    "kv_lens": dict(batch=2, causal=1, q_len=5, kv_len=11, kv_lens=[11, 7]),
    "dv": dict(head_dim_v=24),
    "bshd": dict(layout="bshd", causal=1, q_len=6, kv_len=10),
    "sinks": dict(causal=1, q_len=40, kv_len=40, window_left=8, window_right=0, sinks=3),
    "documents": dict(causal=1, q_len=24, kv_len=24, doc_lens=[5, 11, 8]),
    "empty_rows": dict(causal=1, q_len=12, kv_len=12, batch=2, kv_lens=[12, 0]),
    # The sparse and windowed cases again past one 128-token block (torch_flex runs only these).
    "chunk_window_long": dict(causal=1, q_len=4, kv_len=160, window_left=7, window_right=0),
    "window_long": dict(causal=1, q_len=160, kv_len=160, window_left=20, window_right=0),
    "sinks_long": dict(causal=1, q_len=160, kv_len=160, window_left=8, window_right=0, sinks=3),
    "documents_long": dict(causal=1, q_len=160, kv_len=160, doc_lens=[40, 70, 50]),
}


def inputs(p, seed=0):
    rng = np.random.default_rng(seed)
    dv = p.head_dim_v
    q = rng.uniform(-1, 1, (p.batch, p.q_heads, p.q_len, p.head_dim)).astype(np.float32)
    k = rng.uniform(-1, 1, (p.batch, p.kv_heads, p.kv_len, p.head_dim)).astype(np.float32)
    v = rng.uniform(-1, 1, (p.batch, p.kv_heads, p.kv_len, dv)).astype(np.float32)
    return q, k, v


def run_peer(mod, kernel, p, case):
    """The peer's O for p on inputs(p) (bshd as load_inputs hands it), and how it ran."""
    q, k, v = inputs(p)
    if p.layout == "bshd":  # the files are (B, S, H, D); load_inputs hands the peers (B, H, S, D) views
        q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (q, k, v))
    try:
        fn, collect, how = mod.prepare(kernel, p, q, k, v)
    except Skip as e:
        assert str(e), "a skip must say why"
        pytest.skip(f"{kernel} declares {case} unsupported: {e}")
    fn()
    return np.asarray(collect(), dtype=np.float64), how


def check_against_numpy(o, p, how, what):
    """The comparison every peer must pass: O against numpy_attention's float64 on p."""
    q, k, v = inputs(p)
    kv_lens = p.kv_lens or [p.kv_len] * p.batch
    want, _, _ = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), p.scale, p.causal,
                           p.left, p.right, kv_lens, p.sinks, p.globals, p.doc_lens, p.dilation, p.bigbird,
                           softcap=p.softcap, alibi=p.alibi, sink_logits=p.sink_logits)
    assert o.shape == want.shape, how
    assert np.isfinite(o).all(), how
    np.testing.assert_allclose(o, want, atol=2e-5, rtol=0, err_msg=f"{what}: {how}")


def test_catalogue_is_the_one_list():
    """Every peer of the catalogue (scripts/peers/catalogue.json) belongs to a family with a runner
    module that imports without its library (the library loads in setup()) and serves it; names are
    unique, every family, colour and kind of products is set."""
    names = [p["name"] for p in CATALOGUE["peers"]]
    assert len(names) == len(set(names)), names
    for p in CATALOGUE["peers"]:
        assert p["family"] in FAMILY_MODULES, p
        assert p["color"] and p["products"] in ("float", "int8"), p
        assert p["name"] in importlib.import_module(MODULES[p["name"]]).KERNELS, p


@pytest.mark.parametrize("kernel", FLOAT_PEERS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_peer_matches_numpy(kernel, case):
    mod = peer(kernel)
    p = problem(**CASES[case])
    o, how = run_peer(mod, kernel, p, case)
    check_against_numpy(o, p, how, f"{kernel} {case}")


# The score modifications (docs/operation.md) where a peer takes them (its runner's SCORE_MODS;
# serve.py skips a point with a term the peer does not take).
SCORE_CASES = {
    "softcap": dict(causal=1, q_len=160, kv_len=160, softcap=2.5),
    "alibi_cross_bottom_right": dict(causal=1, q_len=5, kv_len=160, alibi=True),
    "alibi_top_left": dict(causal=2, q_len=20, kv_len=160, alibi=True),
    "alibi_window": dict(causal=1, q_len=160, kv_len=160, window_left=20, window_right=0, alibi=True),
    "sink_logits": dict(causal=1, q_len=20, kv_len=160, sink_logits=[0.5, -1.0, 2.0, 0.0]),
    "sink_logits_empty_rows": dict(batch=2, causal=1, q_len=12, kv_len=12, kv_lens=[12, 0],
                                   sink_logits=[0.5, -1.0, 2.0, 0.0]),
    "softcap_alibi": dict(causal=1, q_len=160, kv_len=160, softcap=2.5, alibi=True),
}


def takes(mod, kernel, p, case):
    missing = p.score_mods - getattr(mod, "SCORE_MODS", {}).get(kernel, set())
    if missing:
        pytest.skip(f"{kernel} does not take {sorted(missing)} ({case}; serve.py skips such points)")


@pytest.mark.parametrize("kernel", FLOAT_PEERS)
@pytest.mark.parametrize("case", sorted(SCORE_CASES))
def test_peer_score_modifications_match_numpy(kernel, case):
    mod = peer(kernel)
    p = problem(**SCORE_CASES[case])
    takes(mod, kernel, p, case)
    o, how = run_peer(mod, kernel, p, case)
    check_against_numpy(o, p, how, f"{kernel} {case}")
    # ... and the check sees a peer that dropped a term: the same O against the problem without it.
    for term in p.score_mods:
        plain = problem(**{key: value for key, value in SCORE_CASES[case].items() if key != term})
        with pytest.raises(AssertionError):
            check_against_numpy(o, plain, how, f"{kernel} {case} without {term}")


@pytest.mark.parametrize("kernel", FLOAT_PEERS)
def test_planted_window_off_by_one_is_caught(kernel):
    """The comparison above can fail: the peer run on a window one key wider than the problem
    it is checked against (what an off-by-one in a peer's mask would do) disagrees."""
    mod = peer(kernel)
    p = problem(**CASES["window_long"])
    wider = problem(**dict(CASES["window_long"], window_left=CASES["window_long"]["window_left"] + 1))
    o, how = run_peer(mod, kernel, wider, "window_long")
    check_against_numpy(o, wider, how, f"{kernel} on the wider window itself")  # the peer is right...
    with pytest.raises(AssertionError):
        check_against_numpy(o, p, how, f"{kernel} wider window")  # ...and the check sees the difference


def test_ov_decode_cache_off_by_one_is_caught():
    """ov_decode's cache split (the first kv_len - 1 keys in the state, the last one the call's) can
    fail the comparison: the peer run on a cache without its oldest key disagrees."""
    mod = peer("ov_decode")
    p = problem(**CASES["decode"])
    short = problem(**dict(CASES["decode"], kv_len=CASES["decode"]["kv_len"] - 1))
    q, k, v = inputs(p)
    try:
        fn, collect, how = mod.prepare("ov_decode", short, q, k[:, :, 1:], v[:, :, 1:])
    except Skip as e:
        pytest.skip(f"ov_decode: {e}")
    fn()
    o = np.asarray(collect(), dtype=np.float64)
    with pytest.raises(AssertionError):
        check_against_numpy(o, p, how, "ov_decode without the oldest key")
    o, how = run_peer(mod, "ov_decode", p, "decode")
    check_against_numpy(o, p, how, "ov_decode")  # the same peer on the whole cache agrees


@pytest.mark.parametrize("kv_dtype", ["u8", "q8_0", "u4", "q4_0"])
@pytest.mark.parametrize("case", ["decode", "chunk_window", "decode_mqa"])
def test_ort_gqa_integer_cache_matches_attention_on_its_values(case, kv_dtype):
    """ort_gqa on an integer cache point keeps ONNX Runtime's own int8 / int4 cache (PER_CHANNEL): its
    O agrees with float64 attention on the values int_cache's codes stand for (the new rows rounded by
    the op itself, as int_cache rounds them) and differs from attention on the unrounded values by
    about what that rounding costs - the check fails on a swapped nibble order or a wrong scale."""
    mod = peer("ort_gqa")
    p = problem(**dict(CASES[case], head_dim=32, head_dim_v=32, kv_dtype=kv_dtype))
    q, k, v = inputs(p)
    try:
        fn, collect, how = mod.prepare("ort_gqa", p, q, k, v)
    except Skip as e:
        pytest.skip(f"ort_gqa: {e}")
    fn()
    o = np.asarray(collect(), dtype=np.float64)
    bits = mod.INT_CACHES[kv_dtype]
    assert f"int{bits} cache" in how, how
    kq, vq = mod.int_cache(k, bits)[2], mod.int_cache(v, bits)[2]

    def att(k, v):
        return attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), p.scale, p.causal,
                         p.left, p.right, [p.kv_len] * p.batch)[0]
    np.testing.assert_allclose(o, att(kq, vq), atol=2e-5, rtol=0, err_msg=how)
    assert np.abs(o - att(k, v)).max() > 1e-4, "the int cache's rounding must show"
    for swapped in (kq[..., ::-1], ):  # (a wrong value order is caught)
        assert np.abs(o - att(swapped, vq)).max() > 1e-3


SAGE_CASES = {"causal": CASES["causal"], "batch_gqa": dict(batch=2, causal=1, q_len=40, kv_len=40),
              "mha_d128": dict(causal=1, q_len=70, kv_len=70, q_heads=2, kv_heads=2, head_dim=128, head_dim_v=128)}


def sage_check(o, p, q, k, v, how):
    """O within 4x what the sage roundings move float64 attention, plus bf16's 2^-8 for P.V."""
    def att(q, k, v):
        return attention(*(x.astype(np.float64) for x in (q, k, v)), p.scale, p.causal, p.left, p.right,
                         [p.kv_len] * p.batch)[0]
    want = att(q, k, v)
    cost = np.abs(att(*sage_rounded(q, k, v)) - want).max()
    np.testing.assert_allclose(o, want, atol=4 * cost + 2 ** -8 * np.abs(v).max(), rtol=0, err_msg=how)


@pytest.mark.parametrize("case", sorted(SAGE_CASES))
def test_ov_sage_matches_attention_on_its_rounded_inputs(case):
    """ov_sage (OpenVINO's PagedAttention with ENABLE_SAGE_ATTN: int8 Q.K^T, u8 V cache) on prefill
    points: one prompt per batch entry, GQA, past one 32-token cache block, d 128."""
    mod = peer("ov_sage")
    p = problem(**SAGE_CASES[case])
    o, how = run_peer(mod, "ov_sage", p, case)
    assert "ENABLE_SAGE_ATTN" in how, how
    sage_check(o, p, *inputs(p), how)


def test_ov_sage_swapped_prompts_are_caught():
    """The check above can fail: the peer handed the batch's two prompts' K/V swapped disagrees."""
    mod = peer("ov_sage")
    p = problem(**SAGE_CASES["batch_gqa"])
    q, k, v = inputs(p)
    try:
        fn, collect, how = mod.prepare("ov_sage", p, q, k[::-1].copy(), v[::-1].copy())
    except Skip as e:
        pytest.skip(f"ov_sage: {e}")
    fn()
    o = np.asarray(collect(), dtype=np.float64)
    with pytest.raises(AssertionError):
        sage_check(o, p, q, k, v, how)
    sage_check(o, p, q, k[::-1], v[::-1], how)  # ...and agrees with the inputs it was given


@pytest.mark.parametrize("case", ["dense", "decode", "window", "kv_lens"])
def test_ov_sage_skips_what_it_does_not_run(case):
    """Non-causal, decode, windowed and kv_lens points: a Skip that says why, never an O."""
    mod = peer("ov_sage")
    p = problem(**CASES[case])
    with pytest.raises(Skip, match="prefill points"):
        mod.prepare("ov_sage", p, *inputs(p))


def bf16_values(x):
    """float32 x rounded to the nearest bf16 (ties to even), as float32."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def test_ov_sdpa_bf16_point_runs_its_bf16_hint():
    """A bf16 point (values exact in bf16): ov_sdpa compiles with the bf16 precision hint (its
    bf16 mode where the CPU has it), says which precision the compiled model runs, and agrees
    within what bf16 products allow (P rounded to bf16: ~2^-9 relative)."""
    mod = peer("ov_sdpa")
    p = problem(**dict(CASES["causal"], dtype="bf16"))
    q, k, v = (bf16_values(x) for x in inputs(p))
    fn, collect, how = mod.prepare("ov_sdpa", p, q, k, v)
    fn()
    o = np.asarray(collect(), dtype=np.float64)
    assert "bf16 precision hint" in how, how
    want, _, _ = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), p.scale, p.causal,
                           p.left, p.right, [p.kv_len] * p.batch)
    np.testing.assert_allclose(o, want, atol=1e-2, rtol=0, err_msg=how)


BACKWARD_CASES = ("dense", "mha", "causal", "causal_cross_bottom_right", "kv_lens", "bshd", "window")


@pytest.mark.parametrize("kernel", ["torch_sdpa", "jax_dpa"])
@pytest.mark.parametrize("case", BACKWARD_CASES)
@pytest.mark.parametrize("pass_", ["backward", "forward_backward"])
def test_peer_backward_matches_numpy(kernel, case, pass_):
    """A backward point: the peer's O and dQ, dK, dV from dO against numpy's float64 gradients
    (numpy_attention.attention_backward); a dK off by a GQA group would fail the comparison."""
    mod = peer(kernel)
    p = problem(**dict(CASES[case], **{"pass": pass_}))
    q, k, v = inputs(p)
    p.d_o = np.random.default_rng(7).uniform(-1, 1, (p.batch, p.q_heads, p.q_len, p.head_dim_v)).astype(np.float32)
    try:
        fn, collect, how = mod.prepare(kernel, p, q, k, v)
    except Skip as e:
        pytest.skip(f"{kernel} declares {case} unsupported: {e}")
    fn()
    fn()  # twice: a retained graph must give the same gradients again
    got = collect()
    kv_lens = p.kv_lens or [p.kv_len] * p.batch
    want = attention_backward(*(x.astype(np.float64) for x in (q, k, v, p.d_o)), p.scale, p.causal, p.left, p.right,
                              kv_lens)
    for name, w in zip(("o", "dq", "dk", "dv"), want):
        assert got[name].shape == w.shape, (name, how)
        np.testing.assert_allclose(got[name], w, atol=5e-5, rtol=0, err_msg=f"{kernel} {case} {name}: {how}")


def test_numpy_backward_is_the_gradient():
    """numpy_attention.attention_backward against central differences of attention's O . dO."""
    p = problem(**CASES["kv_lens"])
    q, k, v = (x.astype(np.float64) for x in inputs(p))
    do = np.random.default_rng(3).uniform(-1, 1, (p.batch, p.q_heads, p.q_len, p.head_dim_v))
    kv_lens = p.kv_lens

    def loss(q, k, v):
        return float((attention(q, k, v, p.scale, p.causal, p.left, p.right, kv_lens)[0] * do).sum())

    _, dq, dk, dv = attention_backward(q, k, v, do, p.scale, p.causal, p.left, p.right, kv_lens)
    for x, g in ((q, dq), (k, dk), (v, dv)):
        for idx in [(0, 0, 0, 0), (1, 1, 2, 3), (0, 1, 4, 15), (1, 0, 3, 7)]:
            old = x[idx]
            x[idx] = old + 1e-6
            up = loss(q, k, v)
            x[idx] = old - 1e-6
            down = loss(q, k, v)
            x[idx] = old
            assert abs((up - down) / 2e-6 - g[idx]) < 1e-6, (idx, g[idx])


def test_time_calls_counts_and_caps():
    calls = []
    times, n = time_calls(lambda: calls.append(1), repetitions=3, min_time_s=0.001, time_cap_s=10)
    assert len(times) == 3 and n >= 1 and len(calls) == 2 + 3 * n
    import time
    with pytest.raises(Skip, match="time cap"):
        time_calls(lambda: time.sleep(0.05), repetitions=3, min_time_s=0.001, time_cap_s=0.1)
