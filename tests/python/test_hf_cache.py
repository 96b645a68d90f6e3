"""attnlab.hf.LabCache (src/python/attnlab/hf.py): a transformers Cache whose K and V are the lab's
caches - float or quantized rows, contiguous or paged - written by attnlab.write_kv and read in place
by the kernels. On a small Llama-architecture model with random weights made here, against SDPA
over transformers' DynamicCache holding the very values the lab's cache stores. Skips without torch
or transformers."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import attnlab  # noqa: E402
import attnlab.hf  # noqa: E402
from transformers import AttentionInterface, DynamicCache  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402

PROMPT, STEPS = 24, 16


def model(cls=transformers.LlamaForCausalLM, config_cls=transformers.LlamaConfig, **extra):
    torch.manual_seed(0)
    config = config_cls(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **extra)
    return cls(config).eval()


def prompt(batch=1, n=PROMPT, seed=1):
    return torch.randint(0, 256, (batch, n), generator=torch.Generator().manual_seed(seed))


def stored(x, kv_dtype):
    """x as the lab's cache of kv_dtype stores it, read back: the values its kernels multiply."""
    if kv_dtype in ("f32", "bf16", "f16"):
        return x.to(attnlab.hf.FLOAT_CACHES[kv_dtype]).to(x.dtype)
    b, h, n, d = x.shape
    rows = torch.zeros(b, h, n, attnlab.kv_row_bytes(kv_dtype, d), dtype=torch.uint8)
    attnlab.write_kv(rows, x.float().contiguous(), 0, kv_dtype=kv_dtype)
    return attnlab.read_kv(rows, kv_dtype=kv_dtype, dim=d).to(x.dtype)


class Rounded(DynamicCache):
    """transformers' own cache holding the values a LabCache of kv_dtype holds."""

    def __init__(self, kv_dtype):
        super().__init__()
        self.kv_dtype = kv_dtype

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(stored(key_states, self.kv_dtype), stored(value_states, self.kv_dtype), layer_idx,
                              *args, **kwargs)


class Shadowed(attnlab.hf.LabCache):
    """A LabCache that also hands each step's K and V to `shadow` (a Rounded cache, built by
    concatenation: every row rounded on its own, where it belongs)."""

    def __init__(self, config, **kw):
        super().__init__(config, **kw)
        self.shadow = Rounded(kw.get("kv_dtype", "f32"))

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.shadow.update(key_states, value_states, layer_idx)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def checked(calls):
    """The attention function "attnlab_checked": attnlab.hf's, each call's output compared with SDPA
    on the same query (rounded to a float cache's dtype, as the lab multiplies it), the shadow's K/V
    and the same mask; appends (rows, keys, relative error) to calls."""

    def forward(module, query, key, value, mask, **kw):
        o, _ = attnlab.hf.attention_forward(module, query, key, value, mask, **kw)
        layer = key.layer
        shadow = layer.checked_against.layers[module.layer_idx]
        q = query.to(attnlab.hf.FLOAT_CACHES.get(layer.kv_dtype, torch.float32)).to(query.dtype)
        want, _ = sdpa_attention_forward(module, q, shadow.keys, shadow.values, mask, **kw)
        if mask is not None:  # rows that see no key (left padding): the lab gives 0, SDPA NaN
            want = torch.where(mask.any(-1).transpose(1, 2).unsqueeze(-1), want, torch.zeros_like(want))
        calls.append((query.shape[2], shadow.keys.shape[2], float(torch.max(torch.abs(o - want)) /
                                                                  torch.max(torch.abs(want)))))
        return o, None

    AttentionInterface.register("attnlab_checked", forward)
    AttentionMaskInterface.register("attnlab_checked", attnlab.hf._mask)
    return "attnlab_checked"


def generate(m, implementation, ids, cache, mask=None, steps=STEPS, **kw):
    m.set_attn_implementation(implementation)
    with torch.no_grad():
        out = m.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=steps, min_new_tokens=steps,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences, torch.stack(out.logits)


def close(got, want):
    return torch.max(torch.abs(got - want)) <= 1e-5 * torch.max(torch.abs(want))


def test_float32_cache_is_sdpa():
    # A float32 cache, contiguous and paged: 64 greedy tokens as SDPA's over DynamicCache, each step's
    # logits within float32's reach.
    attnlab.hf.register()
    m, ids = model(), prompt()
    want_tokens, want_logits = generate(m, "sdpa", ids, DynamicCache(), steps=64)
    for block in (0, 16):
        cache = attnlab.hf.LabCache(m.config, kv_dtype="f32", block=block)
        tokens, got = generate(m, "attnlab", ids, cache, steps=64)
        assert torch.equal(tokens, want_tokens)
        assert close(got, want_logits)
        assert cache.get_seq_length() == PROMPT + 63  # (the last token is not fed back)


def run_checked(m, ids, mask=None, steps=STEPS, **kw):
    # The float32 path (decode_kernel "decode"): these checks hold each call to float32's reach on the
    # stored values; the default, auto, takes an integer cache's steps with decode_i8's int8 products,
    # held to their own tolerance by the C++ suites (test_decode_kernel checks that auto picks it).
    kw.setdefault("decode_kernel", "decode")
    calls = []
    cache = Shadowed(m.config, **kw)
    for layer in cache.layers:
        layer.checked_against = cache.shadow
    tokens, _ = generate(m, checked(calls), ids, cache, mask, steps=steps)
    return calls


@pytest.mark.parametrize("block", [0, 16])
@pytest.mark.parametrize("kv_dtype", ["f32", "bf16", "f16", "q8_0", "q4_0", "u8", "u4", "fp8_e4m3", "fp8_e5m2"])
def test_attention_sees_the_stored_values(kv_dtype, block):
    # Every attention call of a generation (the prompt's, then 16 steps') against SDPA on the same
    # query over transformers' DynamicCache holding the same rounded rows (write_kv's rule on each
    # step's rows alone, concatenated, read back by read_kv): within float32's reach. What the lab
    # adds - each step's rows stored at their place (through the block table when paged), read there
    # in place with kv_lens - is all that differs.
    attnlab.hf.register()
    calls = run_checked(model(), prompt(), kv_dtype=kv_dtype, block=block)
    assert [c[:2] for c in calls] == [(PROMPT, PROMPT)] * 2 + [(1, PROMPT + i) for i in range(1, STEPS) for _ in "ab"]
    assert max(c[2] for c in calls) <= 1e-5, calls


@pytest.mark.parametrize("block", [0, 16])
def test_q8_0_rows_in_place(block):
    # The first layer's keys (the embeddings' projection: the same in any cache) decoded here from the
    # stored bytes by ggml's block_q8_0 layout (an f16 scale, 32 int8 codes): each token's row at its
    # position - through the block table when paged - within half a code step of DynamicCache's key.
    attnlab.hf.register()
    m, ids = model(), prompt(batch=2)
    dyn, lab = DynamicCache(), attnlab.hf.LabCache(m.config, kv_dtype="q8_0", block=block)
    generate(m, "sdpa", ids, dyn, steps=3)
    generate(m, "attnlab", ids, lab, steps=3)
    want = dyn.layers[0].keys.numpy()  # (2, 2, 26, 32)
    layer = lab.layers[0]
    assert layer.keys.dtype == torch.uint8 and layer.keys.shape[-1] == 34  # 34 bytes per 32 values
    raw = layer.keys.numpy()
    got = np.zeros_like(want)
    bound = np.zeros_like(want)
    for b in range(want.shape[0]):
        for h in range(want.shape[1]):
            for j in range(want.shape[2]):
                row = raw[layer.table[b, j // block], h, j % block] if block else raw[b, h, j]
                scale = row[:2].view(np.float16).astype(np.float32)[0]
                got[b, h, j] = scale * row[2:34].view(np.int8).astype(np.float32)
                # half a code step, plus up to 127 codes times the f16 rounding of the scale they
                # were rounded against (ggml's rule: q = round(x / d), d stored as f16)
                bound[b, h, j] = scale * (0.5 + 127 / 2048)
    assert np.all(np.abs(got - want) <= bound)
    table = layer.table if block else None
    assert np.array_equal(attnlab.read_kv(layer.keys, kv_dtype="q8_0", length=want.shape[2], block_table=table), got)


@pytest.mark.parametrize("block", [0, 16])
def test_padding_in_a_batch(block):
    # Left padding: the mask (True = attend) widened to the cache's keys is the problem's mask - a
    # contiguous cache's capacity past them hidden. Every call as SDPA's over the same stored values.
    attnlab.hf.register()
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[0, :5] = 0
    mask[2, :11] = 0
    calls = run_checked(model(), prompt(batch=3, n=17, seed=5), mask, kv_dtype="q8_0", block=block)
    assert len(calls) == 2 * STEPS and max(c[2] for c in calls) <= 1e-5, calls


def test_sliding_window():
    # A Mistral-architecture model with an 8-token window: the window arrives in the mask.
    attnlab.hf.register()
    m = model(transformers.MistralForCausalLM, transformers.MistralConfig, sliding_window=8)
    ids = prompt(n=30, seed=6)
    want_tokens, want_logits = generate(m, "sdpa", ids, DynamicCache(), steps=32)
    tokens, got = generate(m, "attnlab", ids, attnlab.hf.LabCache(m.config, kv_dtype="f32", block=16), steps=32)
    assert torch.equal(tokens, want_tokens)
    assert close(got, want_logits)


def test_growth_and_preallocation():
    # Without max_cache_len a contiguous cache doubles (256 tokens first: 300 crosses it), a paged one
    # takes blocks as tokens arrive; with it, the storage is made once and never moves. All three give
    # the same tokens.
    attnlab.hf.register()
    m, ids = model(), prompt(n=250, seed=3)
    runs, caches = {}, {}
    for name, kw in {"grows": {}, "paged": {"block": 32}, "fixed": {"max_cache_len": 320}}.items():
        caches[name] = attnlab.hf.LabCache(m.config, kv_dtype="q4_0", **kw)
        runs[name], _ = generate(m, "attnlab", ids, caches[name], steps=50)
    assert torch.equal(runs["grows"], runs["paged"]) and torch.equal(runs["grows"], runs["fixed"])
    assert caches["grows"].layers[0].keys.shape[2] == 512
    assert caches["paged"].layers[0].table.shape == (1, 10)  # 299 tokens in 32-token blocks
    fixed = attnlab.hf.LabCache(m.config, kv_dtype="q4_0", max_cache_len=320)
    with torch.no_grad():
        m(ids, cache=fixed)
        where = fixed.layers[0].keys.data_ptr()
        m(ids[:, :5], cache=fixed)
    assert fixed.layers[0].keys.shape[2] == 320 and fixed.layers[0].keys.data_ptr() == where
    with pytest.raises(ValueError, match="max_cache_len: 320; the cache needs 330 tokens"), torch.no_grad():
        m(ids[:, :75], cache=fixed)


def test_sparse_decode(monkeypatch):
    # topk_tokens: each decode step's call asks for the sparse decode with the layer's summaries, which
    # write_kv keeps as the cache grows (contiguous doubling, paged blocks): each page's min and max of
    # K as stored. A budget covering every key is the dense cache's tokens and logits bit for bit; the
    # prompt (prefill) reads every key.
    attnlab.hf.register()
    m, ids = model(), prompt(n=250, seed=4)
    calls = []
    real = attnlab.hf._core.attention

    def spy(*args, **kw):
        calls.append((args[0].shape[2], kw.get("topk_tokens")))
        return real(*args, **kw)

    monkeypatch.setattr(attnlab.hf._core, "attention", spy)
    dense_tokens, dense_logits = generate(m, "attnlab", ids, attnlab.hf.LabCache(m.config, kv_dtype="u8"), steps=6)
    for kw in ({}, {"block": 32}):
        calls.clear()
        cache = attnlab.hf.LabCache(m.config, kv_dtype="u8", topk_tokens=4096, **kw)
        tokens, logits = generate(m, "attnlab", ids, cache, steps=6)
        assert torch.equal(tokens, dense_tokens) and torch.equal(logits, dense_logits), kw
        assert calls == [(250, None)] * 2 + [(1, 4096)] * 10, calls  # (the last token is never attended)
        sparse = attnlab.hf.LabCache(m.config, kv_dtype="u8", topk_tokens=128, topk_sinks=4, topk_recent=64, **kw)
        generate(m, "attnlab", ids, sparse, steps=40)
        layer = sparse.layers[1]
        keys = attnlab.read_kv(layer.keys, kv_dtype="u8", length=layer.length, block_table=layer.table if kw else None,
                               dim=layer.dim)
        assert layer.summary.shape[2] == 1  # 289 keys: 5 pages, one block
        for page in range(5):
            rows = keys[:, :, 64 * page:64 * (page + 1)].numpy()
            assert np.array_equal(layer.summary[:, :, 0, 0, :, page], rows.min(axis=2))
            assert np.array_equal(layer.summary[:, :, 0, 1, :, page], rows.max(axis=2))
    with pytest.raises(ValueError, match="topk_sinks, topk_recent: set without topk_tokens"):
        attnlab.hf.LabCache(m.config, topk_recent=64)


def test_beam_search():
    # reorder_cache: each beam takes its parent's rows (paged: copied into its own blocks).
    attnlab.hf.register()
    m, ids = model(), prompt()
    want, _ = generate(m, "sdpa", ids, DynamicCache(), num_beams=3)
    for block in (0, 16):
        got, _ = generate(m, "attnlab", ids, attnlab.hf.LabCache(m.config, kv_dtype="f32", block=block), num_beams=3)
        assert torch.equal(got, want)


def test_decode_kernel(monkeypatch):
    # decode_kernel="decode_i8" (integer K.Q and P.V) takes the steps of an integer cache; the prompt
    # goes to auto (flash). The default, "auto", picks decode_i8 for an integer cache's steps where the
    # CPU runs vpdpbusd (as attnlab.attention's return_info says), and each layer names what ran.
    attnlab.hf.register()
    m, ids = model(), prompt()
    kernels = []
    real = attnlab.hf._core.attention

    def spy(*args, **kw):
        kernels.append(kw["kernel"])
        return real(*args, **kw)

    monkeypatch.setattr(attnlab.hf._core, "attention", spy)
    tokens, _ = generate(m, "attnlab", ids, attnlab.hf.LabCache(m.config, kv_dtype="u8", decode_kernel="decode_i8"),
                         steps=3)
    assert kernels == ["auto"] * 2 + ["decode_i8"] * 4
    kernels.clear()
    generate(m, "attnlab", ids, attnlab.hf.LabCache(m.config, kv_dtype="fp8_e4m3", decode_kernel="decode_i8"), steps=2)
    assert kernels == ["auto"] * 2 + ["decode"] * 2  # (fp8 has no integer codes)
    kernels.clear()
    cache = attnlab.hf.LabCache(m.config, kv_dtype="u8")
    auto_tokens, _ = generate(m, "attnlab", ids, cache, steps=3)
    assert kernels == ["auto"] * 6
    q = np.zeros((1, 4, 1, 64), np.float32)
    kv = np.zeros((1, 2, 40, 64), np.float32)
    _, info = attnlab.attention(q, kv, kv, kv_dtype="u8", return_info=True)
    assert info["name"] in ("decode_i8", "decode")
    assert all(layer.last_kernel == info["kernel"] for layer in cache.layers), [l.last_kernel for l in cache.layers]


def test_refusals():
    with pytest.raises(ValueError, match="kv_dtype: 'q3'; allowed: f32, bf16, f16, q8_0"):
        attnlab.hf.LabCache(kv_dtype="q3")
    for block in (12, 8, 512):
        with pytest.raises(ValueError, match=f"block: {block}; allowed: 0 .contiguous. or a power of two 16..256"):
            attnlab.hf.LabCache(block=block)
    with pytest.raises(ValueError, match="decode_kernel: 'flash'; allowed: auto .*, decode, decode_i8"):
        attnlab.hf.LabCache(decode_kernel="flash")
    m = model()
    config = transformers.LlamaConfig(**{**m.config.to_dict(), "num_attention_heads": 8, "num_key_value_heads": 2,
                                                        "head_dim": 16})
    m8 = transformers.LlamaForCausalLM(config).eval()  # head_dim 16: no whole 32-value q8_0 block
    m8.set_attn_implementation("attnlab")
    attnlab.hf.register()
    with torch.no_grad(), pytest.raises(ValueError, match="dim: 16; allowed: a multiple of 32 for q8_0"):
        m8(prompt(), cache=attnlab.hf.LabCache(config, kv_dtype="q8_0"))
