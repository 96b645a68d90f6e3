"""JAX: jax.nn.dot_product_attention (jax_dpa), jitted, XLA's CPU implementation. Inputs are
(B, S, H, D) as JAX takes them; GQA natively (key heads divide query heads)."""
import os

from common import Skip, empty_rows, mask_choice

KERNELS = ("jax_dpa",)
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
    f = jax.jit(lambda a, b, c, m: jax.nn.dot_product_attention(a, b, c, mask=m, **kwargs))
    out = {}

    def fn():
        out["o"] = f(qj, kj, vj, mask).block_until_ready()

    import numpy as np
    return fn, lambda: np.asarray(out["o"]).transpose(0, 2, 1, 3), "; ".join(how)
