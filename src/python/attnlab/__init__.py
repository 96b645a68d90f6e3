"""attnlab: the lab's attention kernels on numpy arrays and torch / JAX tensors, read in place.

    import attnlab
    o = attnlab.attention(q, k, v, kernel="flash", causal=True)
    dq, dk, dv = attnlab.attention_backward(q, k, v, do, causal=True)
    import attnlab.torch   # with torch installed: attnlab.torch.attention, a torch.autograd.Function

The kernels live in the extension attnlab._core (src/python/module.cpp); docs/python.md.
"""
from ._core import *  # noqa: F401,F403  (attention, attention_backward, kernels, verify, peak, axes, InvalidInput)
from ._core import _views  # noqa: F401  (tests: the pointers the kernels read)
