"""flash_int8's accuracy against float64 (max error relative to each row's largest |O|, and cosine
of O's rows), with smoothing on/off and P.V in integers on/off, on random inputs and on keys with a
shared channel offset (SageAttention's case); each configuration in its own process (the switches are
read from the environment). Run: PYTHONPATH=build/python /usr/bin/python3 scripts/int8_accuracy.py [N H D]
(default 2048 8 128: results/2026-12-06-int8_pv/accuracy.txt); tests/python/test_int8_accuracy.py runs it small."""
import os, subprocess, sys, tempfile
import numpy as np

DIR = tempfile.mkdtemp(prefix="int8_acc-")  # inputs and outputs between the runs

def ref(q, k, v, causal):
    out = np.empty(q.shape[:3] + (v.shape[3],))
    g = q.shape[1] // k.shape[1]
    for h in range(q.shape[1]):
        s = q[0, h].astype(np.float64) @ k[0, h // g].astype(np.float64).T / np.sqrt(q.shape[3])
        if causal:
            s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
        s -= s.max(1, keepdims=True)
        p = np.exp(s); p /= p.sum(1, keepdims=True)
        out[0, h] = p @ v[0, h // g].astype(np.float64)
    return out

def run(case, causal, smooth, pv):
    env = dict(os.environ, ATTN_I8_SMOOTH=smooth, ATTN_I8_PV=pv)
    code = f"""
import numpy as np, attnlab
d = np.load('{DIR}/{case}.npz')
o = attnlab.attention(d['q'], d['k'], d['v'], kernel='flash_int8', causal={causal}, threads=2)
np.save('{DIR}/o.npy', np.asarray(o))
"""
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return np.load(f'{DIR}/o.npy')

rng = np.random.default_rng(1)
n, H, D = (int(a) for a in sys.argv[1:4]) if len(sys.argv) == 4 else (2048, 8, 128)
rows = []
for case in ("random", "offset"):
    q = rng.standard_normal((1, H, n, D)).astype(np.float32)
    k = rng.standard_normal((1, H, n, D)).astype(np.float32)
    v = rng.standard_normal((1, H, n, D)).astype(np.float32)
    if case == "offset":
        k[..., 7] += 8.0   # one channel every key shares (a large mean)
    np.savez(f'{DIR}/{case}.npz', q=q, k=k, v=v)
    for causal in (False, True):
        want = ref(q, k, v, causal)
        scale = np.abs(want).max(-1)
        for smooth in ("1", "0"):
            for pv in ("1", "0"):
                o = run(case, causal, smooth, pv).astype(np.float64)
                err = (np.abs(o - want).max(-1) / scale).max()
                cos = ((o * want).sum(-1) / np.linalg.norm(o, axis=-1) / np.linalg.norm(want, axis=-1)).min()
                rows.append((case, causal, smooth, pv, err, cos))
                print(f"{case:7s} causal={causal!s:5s} smooth={smooth} int_pv={pv}: max rel err {err:.2e}, min cosine {cos:.7f}", flush=True)

import shutil  # noqa: E402
shutil.rmtree(DIR, ignore_errors=True)
