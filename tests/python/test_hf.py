"""attnlab.hf (src/python/attnlab/hf.py): the lab as a transformers attention backend, on a small
Llama-architecture model with random weights made here (no download), against the same model on
transformers' SDPA. Skips without torch or transformers."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import attnlab.hf  # noqa: E402


def model(heads=4, kv_heads=2, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                                      max_position_embeddings=512)
    return transformers.LlamaForCausalLM(config).eval()


def logits(m, ids, implementation):
    m.set_attn_implementation(implementation)
    with torch.no_grad():
        return m(ids).logits


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (4, 1)])
def test_logits_and_greedy_tokens_match_sdpa(heads, kv_heads):
    # Prefill through flash, then 64 greedy steps through decode against transformers' own cache:
    # the logits within float32's reach of SDPA's, and the same 64 tokens.
    attnlab.hf.register()
    m = model(heads, kv_heads)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    want, got = logits(m, ids, "sdpa"), logits(m, ids, "attnlab")
    assert torch.max(torch.abs(got - want)) <= 1e-5 * torch.max(torch.abs(want))
    runs = {}
    for implementation in ("sdpa", "attnlab"):
        m.set_attn_implementation(implementation)
        with torch.no_grad():
            runs[implementation] = m.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)
    assert runs["attnlab"].shape == (1, 24 + 64)
    assert torch.equal(runs["attnlab"], runs["sdpa"])


def test_kernel_by_rows():
    # Prefill (q_len = kv_len, or many new rows) by flash; a few new rows against a cache by decode.
    calls = []
    real = torch.ops.attnlab.attention

    class Spy:
        def __call__(self, *args):
            calls.append((args[0].shape[2], args[1].shape[2], args[5]))
            return real(*args)

    attnlab.hf.register()
    m = model()
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(2))
    m.set_attn_implementation("attnlab")
    old, attnlab.hf._attention_op = attnlab.hf._attention_op, Spy()
    try:
        with torch.no_grad():
            m.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    finally:
        attnlab.hf._attention_op = old
    # 2 layers: the prompt's 20 rows by flash, then one row against 21 and 22 keys by decode.
    assert calls == [(20, 20, "flash")] * 2 + [(1, 21, "decode")] * 2 + [(1, 22, "decode")] * 2


def test_other_masks_and_settings_are_refused():
    attnlab.hf.register()
    m = model()
    m.set_attn_implementation("attnlab")
    ids = torch.randint(0, 256, (2, 10))
    padding = torch.ones(2, 10, dtype=torch.long)
    padding[0, :3] = 0  # left padding in a batch: not the plain causal mask
    with pytest.raises(ValueError, match=r"attention_mask: a \(2, 1, 10, 10\) mask beyond the causal one"):
        with torch.no_grad():
            m(ids, attention_mask=padding)
    with torch.no_grad():  # an all-ones padding mask is the plain causal one: taken
        assert m(ids, attention_mask=torch.ones(2, 10, dtype=torch.long)).logits.shape == (2, 10, 256)
    m.train()
    m.config.attention_dropout = 0.1
    for layer in m.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(ValueError, match="dropout: 0.1; allowed: 0.0"):
        m(ids)
