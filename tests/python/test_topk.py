"""Query-aware sparse decode from Python (include/attnlab/kv_summary.hpp): attnlab.attention(...,
topk_tokens=N) over a cache written by attnlab.write_kv, which keeps the page summaries (new_kv_summary)
as rows arrive; a needle placed at any depth of a long synthetic context is still retrieved; a budget
covering every page is dense decode bit for bit; bad summaries are refused by name."""

import numpy as np
import pytest

import attnlab

B, HQ, HKV, D, N = 1, 4, 2, 64, 20000


def noise(seed):
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, (B, HQ, 1, D)).astype(np.float32)
    k = rng.uniform(-1, 1, (B, HKV, N, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, HKV, N, D)).astype(np.float32)
    return q, k, v


def stored_cache(k, v, kv_dtype, capacity):
    """K and V written as a decode loop writes them (a prompt, then a token at a time), the summaries kept."""
    width = attnlab.kv_row_bytes(kv_dtype, D)
    kc, vc = (np.zeros((B, HKV, capacity, width), np.uint8) for _ in "kv")
    summary = attnlab.new_kv_summary(B, HKV, capacity, D)
    n = k.shape[2]
    for lo, hi in [(0, n - 3)] + [(t, t + 1) for t in range(n - 3, n)]:
        attnlab.write_kv(kc, np.ascontiguousarray(k[:, :, lo:hi]), lo, kv_dtype=kv_dtype, summary=summary)
        attnlab.write_kv(vc, np.ascontiguousarray(v[:, :, lo:hi]), lo, kv_dtype=kv_dtype)
    return kc, vc, summary


@pytest.mark.parametrize("depth", [100, 7000, 15555, 19990])
def test_a_needle_at_any_depth_is_retrieved(depth):
    q, k, v = noise(3)
    # Query head 1's needle (kv head 0): a key along its query, its value planted, scaled to hold most of
    # the row's softmax mass under dense attention.
    k[0, 0, depth] = 6.0 * q[0, 1, 0]
    v[0, 0, depth] = 5.0
    kc, vc, summary = stored_cache(k, v, "u8", N + 100)
    kw = dict(kv_dtype="u8", kv_lens=[N], causal=True)
    sparse, info = attnlab.attention(q, kc, vc, topk_tokens=1024, topk_sinks=64, topk_recent=64, kv_summary=summary,
                                     return_info=True, **kw)
    assert info["name"] in ("decode", "decode_i8")
    dense = attnlab.attention(q, kc, vc, kernel=info["name"], **kw)
    row, want = sparse[0, 1, 0], dense[0, 1, 0]
    assert np.linalg.norm(row - want) < 0.05 * np.linalg.norm(want)
    assert np.all(row > 2.5)  # the needle's value dominates the row
    # The summaries kept by write_kv are the ones read from the cache per call: the same output.
    again = attnlab.attention(q, kc, vc, kernel=info["name"], topk_tokens=1024, topk_sinks=64, topk_recent=64, **kw)
    assert np.array_equal(again, sparse)


def test_the_summary_is_each_pages_min_and_max_as_stored():
    _, k, v = noise(4)
    kc, _, summary = stored_cache(k[:, :, :300], v[:, :, :300], "q4_0", 320)
    back = attnlab.read_kv(kc, kv_dtype="q4_0", length=300)
    assert summary.shape == (B, HKV, 1, 2, D, 16)  # 5 pages in a block of 16
    for page in range(5):
        rows = back[:, :, 64 * page:64 * (page + 1)]
        assert np.array_equal(summary[:, :, 0, 0, :, page], rows.min(axis=2))
        assert np.array_equal(summary[:, :, 0, 1, :, page], rows.max(axis=2))
    assert np.all(summary[:, :, 0, 0, :, 5:] == np.inf) and np.all(summary[:, :, 0, 1, :, 5:] == -np.inf)


def test_a_budget_covering_every_page_is_dense_decode():
    q, k, v = noise(5)
    kc, vc, summary = stored_cache(k, v, "u8", N)
    kw = dict(kernel="decode", kv_dtype="u8", causal=True)
    assert np.array_equal(attnlab.attention(q, kc, vc, topk_tokens=N, kv_summary=summary, **kw),
                          attnlab.attention(q, kc, vc, **kw))


def test_bad_summaries_are_refused_by_name():
    q, k, v = noise(6)
    kc, vc, summary = stored_cache(k[:, :, :200], v[:, :, :200], "u8", 256)
    kw = dict(kernel="decode", kv_dtype="u8", kv_lens=[200])
    with pytest.raises(ValueError, match="kv_summary: given without topk_tokens"):
        attnlab.attention(q, kc, vc, kv_summary=summary, **kw)
    with pytest.raises(ValueError, match=r"kv_summary: shape \(1, 2, 1, 2, 32, 16\)"):
        attnlab.attention(q, kc, vc, topk_tokens=64, kv_summary=np.zeros((1, 2, 1, 2, 32, 16), np.float32), **kw)
    long_k, long_v = (np.zeros((B, HKV, 2000, attnlab.kv_row_bytes("u8", D)), np.uint8) for _ in "kv")
    with pytest.raises(ValueError, match="summary: .* 16 pages of head_dim 64"):  # 2000 keys: 32 pages
        attnlab.attention(q, long_k, long_v, topk_tokens=64, kv_summary=summary, **kw)
    small = attnlab.new_kv_summary(B, HKV, 128, D)
    with pytest.raises(ValueError, match="summary: 16 pages of 64 rows; allowed: at least 17"):
        attnlab.write_kv(long_k, np.zeros((B, HKV, 1, D), np.float32), 1030, kv_dtype="u8", summary=small)
    with pytest.raises(ValueError, match="new_kv_summary: batch 0"):
        attnlab.new_kv_summary(0, 2, 64, 64)
