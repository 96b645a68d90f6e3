"""AMD's ZenDNN plugin for PyTorch, zentorch: its fused SDPA operator torch.ops.zentorch.zentorch_sdpa
(zentorch_sdpa) on float32 points, and on bf16 points with bf16 tensors (its own bf16 arithmetic,
judged by the bf16-products policy as ov_sdpa's). A family and venv of its own (.venv-zentorch,
`scripts/lab peers-setup zentorch`): zentorch 2.14 is built for torch 2.14, the torch family pins
2.15. zentorch targets AMD CPUs (ZenDNN): elsewhere the family is unavailable, naming the CPU."""
from catalogue import peers_of
from common import Skip, mask_choice

KERNELS = peers_of("zentorch")
BACKWARD = False  # an inference operator
torch = None


def _cpu_vendor():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def setup(threads):
    global torch
    import torch as _torch
    import zentorch  # noqa: F401  registers torch.ops.zentorch
    vendor = _cpu_vendor()
    if vendor != "AuthenticAMD":
        raise Skip(f"zentorch runs on AMD CPUs (ZenDNN); this CPU's vendor is {vendor}")
    torch = _torch
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    return f"zentorch {zentorch.__version__} (torch {torch.__version__})"


def prepare(kernel, p, q, k, v):
    if p.dtype not in ("f32", "bf16"):
        raise Skip(f"dtype {p.dtype}: zentorch_sdpa runs here on float32 and bf16 points (allowed: f32, bf16)")
    if p.head_dim_v != p.head_dim:
        raise Skip(f"d_v {p.head_dim_v} != d {p.head_dim}: zentorch_sdpa takes Q, K and V of one head size")
    kind, _ = mask_choice(p)
    if kind == "mask":
        raise Skip("zentorch_sdpa runs no mask and top-left causal here (is_causal); windows, bottom-right causal "
                   "with q_len != kv_len, kv_lens and sparse patterns need a dense attn_mask it is not timed with")
    how = ["no mask" if kind == "none" else "is_causal"]
    dtype = torch.bfloat16 if p.dtype == "bf16" else torch.float32
    # (B, H, S, D) contiguous tensors, made outside the timed calls (bshd files arrive as views).
    qt, kt, vt = (torch.from_numpy(x).to(dtype).contiguous() for x in (q, k, v))
    if p.gqa:  # the operator takes one head count: K and V repeated to q_heads, outside the timed calls
        g = p.q_heads // p.kv_heads
        kt, vt = kt.repeat_interleave(g, dim=1).contiguous(), vt.repeat_interleave(g, dim=1).contiguous()
        how.append(f"GQA by K/V repeated {g}x (outside the timed call)")
    if dtype == torch.bfloat16:
        how.append("bf16 tensors")
    op = torch.ops.zentorch.zentorch_sdpa  # -> (O, its LSE)
    out = {}

    def fn():
        with torch.inference_mode():
            out["o"] = op(qt, kt, vt, dropout_p=0.0, is_causal=kind == "causal", attn_mask=None, scale=p.scale)[0]

    return fn, lambda: out["o"].float().numpy(), "; ".join(how)
