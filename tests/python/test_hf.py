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


def test_kernel_by_rows(monkeypatch):
    # The backend asks for kernel "auto": the prompt's rows (q_len = kv_len) run flash, each new row
    # against the cache decode (the lab's table, `attnlab list`).
    calls = []
    real = attnlab.torch._core.attention

    def spy(*args, **kw):
        o, lse, info = real(*args, return_info=True, **kw)
        calls.append((args[0].shape[2], args[1].shape[2], kw["kernel"], info["name"]))
        return o, lse

    attnlab.hf.register()
    m = model()
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(2))
    m.set_attn_implementation("attnlab")
    monkeypatch.setattr(attnlab.torch._core, "attention", spy)
    with torch.no_grad():
        m.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    # 2 layers: the prompt's 20 rows by flash, then one row against 21 and 22 keys by decode.
    assert calls == ([(20, 20, "auto", "flash")] * 2 + [(1, 21, "auto", "decode")] * 2 +
                     [(1, 22, "auto", "decode")] * 2)


def generate(m, implementation, ids, mask=None, steps=32):
    m.set_attn_implementation(implementation)
    with torch.no_grad():
        return m.generate(ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)


def test_padding_in_a_batch():
    # Left padding (transformers' generation convention): the mask arrives as a bool tensor and is the
    # lab's problem mask; the real positions' logits as SDPA's, and the same greedy tokens per row.
    attnlab.hf.register()
    m = model()
    ids = torch.randint(0, 256, (3, 17), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[0, :5] = 0
    mask[2, :11] = 0
    outs = {}
    for implementation in ("sdpa", "attnlab"):
        m.set_attn_implementation(implementation)
        with torch.no_grad():
            outs[implementation] = m(ids, attention_mask=mask).logits
    real = mask.bool()
    want, got = outs["sdpa"][real], outs["attnlab"][real]
    assert torch.max(torch.abs(got - want)) <= 1e-5 * torch.max(torch.abs(want))
    assert torch.equal(generate(m, "attnlab", ids, mask), generate(m, "sdpa", ids, mask))


def test_sliding_window():
    # A Mistral-architecture model with an 8-token sliding window: the window arrives in the mask.
    attnlab.hf.register()
    torch.manual_seed(0)
    config = transformers.MistralConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                                        max_position_embeddings=512)
    m = transformers.MistralForCausalLM(config).eval()
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(6))
    want, got = logits(m, ids, "sdpa"), logits(m, ids, "attnlab")
    assert torch.max(torch.abs(got - want)) <= 1e-5 * torch.max(torch.abs(want))
    # (the window matters: without it the logits move)
    config_full = transformers.MistralConfig(**{**config.to_dict(), "sliding_window": None})
    full = transformers.MistralForCausalLM(config_full).eval()
    full.load_state_dict(m.state_dict())
    assert torch.max(torch.abs(logits(full, ids, "attnlab") - got)) > 1e-3
    assert torch.equal(generate(m, "attnlab", ids), generate(m, "sdpa", ids))


def test_what_it_does_not_take_is_refused():
    attnlab.hf.register()
    m = model()
    m.set_attn_implementation("attnlab")
    ids = torch.randint(0, 256, (2, 10))
    m.train()
    for layer in m.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(ValueError, match="dropout: 0.1; allowed: 0.0"):
        m(ids)
    q = torch.rand(1, 4, 5, 32)
    with pytest.raises(ValueError, match="attention_mask: torch.float32; allowed: a bool mask"):
        attnlab.hf.attention_forward(m.model.layers[0].self_attn, q, q, q, torch.zeros(1, 1, 5, 5))


def test_the_model_compiles_whole():
    # torch.compile(fullgraph=True) raises at the first graph break: the model's forward with every
    # attention layer on the lab's operator is one graph (the mask builder makes its mask tensor
    # while compiling), and gives SDPA's logits.
    attnlab.hf.register()
    m = model()
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(8))
    want = logits(m, ids, "sdpa")
    m.set_attn_implementation("attnlab")
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(ids).logits
    assert torch.max(torch.abs(got - want)) <= 1e-5 * torch.max(torch.abs(want))


def gemma2(seed=0):
    """Gemma 2's attention: logit soft-capping (a small cap, so it bites) and sliding-window layers
    alternating with full ones (the window through the mask builder)."""
    torch.manual_seed(seed)
    config = transformers.Gemma2Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
                                       attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                                       query_pre_attn_scalar=32, max_position_embeddings=512,
                                       layer_types=["sliding_attention", "full_attention"])
    return transformers.Gemma2ForCausalLM(config).eval()


def gpt_oss(seed=0):
    """gpt-oss's attention: a learned sink logit per head (s_aux; drawn wide here, so it bites) and
    alternating sliding-window layers."""
    torch.manual_seed(seed)
    config = transformers.GptOssConfig(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                       num_experts_per_tok=2, sliding_window=8, max_position_embeddings=512,
                                       layer_types=["sliding_attention", "full_attention"])
    m = transformers.GptOssForCausalLM(config).eval()
    for layer in m.model.layers:
        torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    return m


@pytest.mark.parametrize("family", [gemma2, gpt_oss])
def test_score_modification_models_match_eager(family, monkeypatch):
    # The families whose attention transformers routes through the interface with a score modification:
    # logits within float32's reach of the eager implementation (the reference those models keep), the
    # same 32 greedy tokens through transformers' cache and through LabCache, and the modification
    # reaches the lab (softcap / sink_logits in every call).
    attnlab.hf.register()
    m = family()
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    want, got = logits(m, ids, "eager"), logits(m, ids, "attnlab")
    assert torch.max(torch.abs(got - want)) <= 1e-5 * torch.max(torch.abs(want))
    tokens = generate(m, "eager", ids)
    key = "softcap" if family is gemma2 else "sink_logits"
    seen = []
    real = attnlab.torch._core.attention

    def spy(*args, **kw):
        seen.append(key in kw)
        return real(*args, **kw)

    monkeypatch.setattr(attnlab.torch._core, "attention", spy)
    assert torch.equal(generate(m, "attnlab", ids), tokens)
    m.set_attn_implementation("attnlab")
    with torch.no_grad():
        cached = m.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                            cache=attnlab.hf.LabCache(m.config))
    assert torch.equal(cached, tokens)
    assert seen and all(seen)
