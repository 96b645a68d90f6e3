"""JAX: jax.nn.dot_product_attention (jax_dpa), jitted, XLA's CPU implementation. Inputs are
(B, S, H, D) as JAX takes them; GQA natively (key heads divide query heads)."""
import os

from catalogue import peers_of
from common import Skip, empty_rows, mask_choice

KERNELS = peers_of("jax")  # the catalogue's rows of this family (catalogue.json)
BACKWARD = True  # by jax.vjp
jax = jnp = None


def setup(threads):
    global jax, jnp
    # XLA sizes its CPU thread pool from the cores the process may use (serve.py pins it to
    # `threads` cores); one thread: no Eigen thread pool at all.
    if threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax as _jax
    import jax.numpy as _jnp
    jax, jnp = _jax, _jnp
    jax.config.update("jax_platforms", "cpu")
    return f"jax {jax.__version__}"


def prepare(kernel, p, q, k, v):
    if p.head_dim_v != p.head_dim:
        raise Skip("jax.nn.dot_product_attention takes one head size for Q, K and V (d_v != d)")
    qj, kj, vj = (jnp.asarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))  # -> (B, S, H, D)
    kwargs = {"scale": p.scale, "implementation": "xla"}
    how = ["GQA native" if p.gqa else "MHA"]
    mask = None
    kind, keep = mask_choice(p)
    if kind == "none":
        how.append("no mask")
    elif kind == "causal":
        kwargs["is_causal"] = True
        how.append("is_causal")
    else:
        if empty_rows(keep):
            raise Skip(f"{empty_rows(keep)} rows see no key: jax's masked softmax averages V there "
                       "(the lab: O = 0)")
        mask = jnp.asarray(keep)
        how.append("boolean mask (B,1,Sq,Skv)")
    import numpy as np
    if p.backward:
        return _backward(p, qj, kj, vj, mask, kwargs, how)
    f = jax.jit(lambda a, b, c, m: jax.nn.dot_product_attention(a, b, c, mask=m, **kwargs))
    out = {}

    def fn():
        out["o"] = f(qj, kj, vj, mask).block_until_ready()

    return fn, lambda: np.asarray(out["o"]).transpose(0, 2, 1, 3), "; ".join(how)


def _backward(p, qj, kj, vj, mask, kwargs, how):
    """jax.vjp of the attention: backward alone jits the vjp function applied to dO, its
    residuals (the forward's) passed in as arguments, forward_backward jits both."""
    import numpy as np

    def attn(a, b, c):
        return jax.nn.dot_product_attention(a, b, c, mask=mask, **kwargs)

    do = jnp.asarray(p.d_o.transpose(0, 2, 1, 3))
    out = {}
    if p.pass_ == "backward":
        o, vjp_fn = jax.vjp(attn, qj, kj, vj)
        apply = jax.jit(lambda fn, d: fn(d))
        out["o"] = o

        def fn():
            out["g"] = jax.block_until_ready(apply(vjp_fn, do))
        how.append("jax.vjp's function jitted, the forward's residuals as arguments (outside the timed calls)")
    else:
        both = jax.jit(lambda a, b, c, d: (lambda r: (r[0], r[1](d)))(jax.vjp(attn, a, b, c)))

        def fn():
            out["o"], out["g"] = jax.block_until_ready(both(qj, kj, vj, do))
        how.append("forward + vjp jitted together")

    def collect():
        dq, dk, dv = (np.asarray(g).transpose(0, 2, 1, 3) for g in out["g"])
        return {"o": np.asarray(out["o"]).transpose(0, 2, 1, 3), "dq": dq, "dk": dk, "dv": dv}

    return fn, collect, "; ".join(how)
