"""attnlab.torch (src/python/attnlab/torch.py): the lab's forward and backward as a torch.autograd.Function,
against torch's own scaled_dot_product_attention and its autograd on the same tensors. Skips without torch."""

import pytest

torch = pytest.importorskip("torch")
import attnlab.torch as at  # noqa: E402


def tensors(b=2, hq=4, hkv=2, lq=37, lk=37, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda h, l: (torch.rand(b, h, l, d, generator=g) * 2 - 1).to(dtype).requires_grad_()
    return make(hq, lq), make(hkv, lk), make(hkv, lk)


def agrees_with_torch(o, q, k, v, **sdpa):
    """O and, through a random dO, dQ, dK, dV (float32) against torch's SDPA and autograd in float64."""
    rq, rk, rv = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, **sdpa)
    assert torch.max(torch.abs(o.double() - ref)) < 1e-5
    do = torch.rand_like(o)
    o.backward(do)
    ref.backward(do.double())
    for got, want in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.max(torch.abs(got.double() - want)) < 1e-5 * max(1.0, torch.max(torch.abs(want)).item())


@pytest.mark.parametrize("kernel", ["flash", "naive"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_forward_and_gradients_match_torch(kernel, is_causal, gqa):
    q, k, v = tensors(hkv=2 if gqa else 4, lk=37 if is_causal else 53)
    o = at.attention(q, k, v, is_causal=is_causal, enable_gqa=gqa, kernel=kernel, threads=2)
    agrees_with_torch(o, q, k, v, is_causal=is_causal, enable_gqa=gqa)


def test_a_training_step_through_a_loss():
    # o.sum() hands back a dO of stride 0 (copied to a contiguous one), bf16 inputs, a custom scale.
    q, k, v = tensors(dtype=torch.bfloat16)
    loss = at.attention(q, k, v, scale=0.2, enable_gqa=True).square().mean()
    loss.backward()
    assert all(x.grad is not None and x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad).all() for x in (q, k, v))


def test_what_it_does_not_take_is_an_error():
    q, k, v = tensors()
    with pytest.raises(ValueError, match="^attn_mask: torch.float32"):
        at.attention(q, k, v, attn_mask=torch.zeros(37, 37), enable_gqa=True)  # an additive mask
    with pytest.raises(ValueError, match="^dropout_p"):
        at.attention(q, k, v, dropout_p=0.1, enable_gqa=True)
    with pytest.raises(ValueError, match="^key: 2 heads for 4 query heads"):
        at.attention(q, k, v)
    with pytest.raises(ValueError, match="backward: blocked has no backward pass"):
        at.attention(q, k, v, enable_gqa=True, kernel="blocked").sum().backward()


def test_operators_pass_torch_library_opcheck():
    # The schema, the fake (meta) implementations against the real ones, the autograd registration
    # and AOT dispatch: what torch.compile relies on.
    q, k, v = tensors(lq=19, lk=23)
    for causal in ("none", "top_left", "bottom_right"):
        torch.library.opcheck(torch.ops.attnlab.attention.default, (q, k, v, None, causal, None, "flash", 2))
    mask = torch.rand(2, 1, 19, 23, generator=torch.Generator().manual_seed(3)) < 0.7
    torch.library.opcheck(torch.ops.attnlab.attention.default, (q, k, v, mask, "none", None, "flash", 2))
    o, lse = torch.ops.attnlab.attention(q, k, v, mask, "none", 0.3, "naive", 1)
    do = torch.rand_like(o)
    torch.library.opcheck(torch.ops.attnlab.attention_backward.default,
                          (do, q.detach(), k.detach(), v.detach(), o.detach(), lse, mask, "none", 0.3, "naive", 1))
    with pytest.raises(ValueError, match="causal: 'sideways'; allowed: none, top_left, bottom_right"):
        torch.ops.attnlab.attention(q, k, v, None, "sideways", None, "flash", 1)


@pytest.mark.parametrize("kernel", ["flash", "naive"])
def test_a_bool_mask_as_torch_takes_it(kernel):
    # torch's bool attn_mask (True = attend), forward and gradients; with is_causal (which torch's
    # SDPA refuses beside a mask) the intersection; a row that sees no key is O = 0 (torch gives NaN
    # there: the compared masks give every row a key).
    q, k, v = tensors(lq=21, lk=21)
    mask = torch.rand(2, 1, 21, 21, generator=torch.Generator().manual_seed(4)) < 0.5
    mask[..., 0] = True  # every row sees a key (torch's NaN rows would spoil the comparison)
    o = at.attention(q, k, v, attn_mask=mask, enable_gqa=True, kernel=kernel, threads=2)
    agrees_with_torch(o, q, k, v, attn_mask=mask, enable_gqa=True)
    both = at.attention(q, k, v, attn_mask=mask, is_causal=True, enable_gqa=True, kernel=kernel)
    tril = torch.ones(21, 21, dtype=torch.bool).tril()
    assert torch.equal(both, at.attention(q, k, v, attn_mask=mask & tril, enable_gqa=True, kernel=kernel))
    empty = torch.zeros(21, 21, dtype=torch.bool)
    assert torch.count_nonzero(at.attention(q, k, v, attn_mask=empty, enable_gqa=True)) == 0



class _Block(torch.nn.Module):
    """A model's attention as models write it: projections, heads split by a transposed view (not
    contiguous), the lab's attention, the heads merged back."""

    def __init__(self, d=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = torch.nn.Linear(d, d)
        self.kv = torch.nn.Linear(d, 2 * kv_heads * self.hd)
        self.o = torch.nn.Linear(d, d)

    def forward(self, x, attend):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        o = attend(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(o.transpose(1, 2).reshape(b, n, -1))


def test_torch_compile_keeps_the_op_in_one_graph():
    # fullgraph=True raises at the first graph break: the lab's forward and backward compile into
    # the model's graph, and agree with eager and with torch's SDPA in the same model.
    torch.manual_seed(0)
    block = _Block()
    x = torch.rand(2, 29, 64, requires_grad=True)
    lab = lambda *a, **kw: at.attention(*a, **kw, threads=2)
    compiled = torch.compile(lambda x: block(x, lab), fullgraph=True, backend="aot_eager")
    got = compiled(x)
    want = block(x, torch.nn.functional.scaled_dot_product_attention)
    assert torch.max(torch.abs(got - want)) < 1e-5
    got.sum().backward()
    g_lab = x.grad.clone()
    x.grad = None
    want.sum().backward()
    assert torch.max(torch.abs(g_lab - x.grad)) < 1e-4
    # The inductor backend (C++ code generated around the op) as well: the default of torch.compile.
    inductor = torch.compile(lambda x: block(x, lab), fullgraph=True)
    assert torch.max(torch.abs(inductor(x.detach()) - want.detach())) < 1e-5


@pytest.mark.parametrize("kernel", ["flash", "naive"])
def test_softcap_and_sink_logits_match_the_eager_formulas(kernel):
    # The models' eager code in float64 (Gemma 2: c tanh(s / c); gpt-oss: a sink column in the softmax,
    # dropped after it) against the lab's keywords beyond torch's, causal top-left as torch's.
    q, k, v = tensors(hq=4, hkv=4, lq=20, lk=20)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    o = at.attention(q, k, v, is_causal=True, kernel=kernel, softcap=3.0, sink_logits=sinks)
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = 3.0 * torch.tanh(s / 3.0)
    s = s.masked_fill(~torch.ones(20, 20, dtype=torch.bool).tril(), float("-inf"))
    s = torch.cat([s, sinks.double().reshape(1, -1, 1, 1).expand(2, -1, 20, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :-1]
    assert torch.max(torch.abs(o.double() - p @ v.double())) < 1e-5


@pytest.mark.parametrize("kernel", ["naive", "flash"])
def test_softcap_and_sink_logits_train(kernel):
    # The gradients of softcap's scores and of the sink logits themselves (gpt-oss trains them) against
    # torch's autograd of the eager formulas in float64.
    q, k, v = tensors(b=1, hq=4, hkv=2, lq=9, lk=9, d=16)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    o = at.attention(q, k, v, is_causal=True, enable_gqa=True, kernel=kernel, softcap=3.0, sink_logits=sinks)
    rq, rk, rv, rs = (x.detach().double().requires_grad_() for x in (q, k, v, sinks))
    kk, vv = rk.repeat_interleave(2, dim=1), rv.repeat_interleave(2, dim=1)
    s = 3.0 * torch.tanh((rq @ kk.transpose(-1, -2)) / 4.0 / 3.0)
    s = s.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    s = torch.cat([s, rs.reshape(1, -1, 1, 1).expand(1, -1, 9, 1)], dim=-1)
    ref = torch.softmax(s, dim=-1)[..., :-1] @ vv
    assert torch.max(torch.abs(o.double() - ref)) < 1e-5
    do = torch.rand_like(o)
    o.backward(do)
    ref.backward(do.double())
    for got, want in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad), (sinks.grad, rs.grad)):
        assert got.shape == want.shape
        assert torch.max(torch.abs(got.double() - want)) < 1e-5 * max(1.0, torch.max(torch.abs(want)).item())
