#!/usr/bin/python3
"""A stand-in for scripts/peers/serve.py in the C++ sweep tests (test_sweep.cpp, SweepPeers):
the same protocol, with each kernel's behaviour chosen by $ATTN_FAKE_PEER, e.g.
"torch_sdpa=exact,ort_mha=wrong,ort_gqa=skip,jax_dpa=die":
  exact  O from numpy_attention (float64, the lab's rule), timed as a no-op
  wrong  that O plus 0.05 (the sweep must fail it, not time it)
  wrongdk  (a backward point) O and the gradients exact but dK plus 0.05
  sage   O from numpy_attention on Q, K rounded to int8 and V to u8 per (token, head), as
         OpenVINO's sage path rounds them (ov_peer.sage_rounded)
  ortint O from numpy_attention on K and V rounded as ONNX Runtime's quantized GQA cache holds them
         (ort_peer.int_cache: per kv head and channel; 8 bits for u8 / q8_0 points, else 4)
  skip   answers skipped with a reason
  die    exits without answering (the sweep must record the point failed and go on)
Kernels not named answer "exact". $ATTN_FAKE_PEER_UNAVAILABLE=1: hello answers unavailable."""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "peers"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from common import Problem, load_do, load_inputs  # noqa: E402
from numpy_attention import attention, attention_backward  # noqa: E402
from ort_peer import int_cache  # noqa: E402  (numpy only: onnxruntime is imported by setup)
from ov_peer import sage_rounded  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True)
    ap.add_argument("--threads", type=int, required=True)
    a = ap.parse_args()
    modes = dict(x.split("=") for x in os.environ.get("ATTN_FAKE_PEER", "").split(",") if x)
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "hello":
            if os.environ.get("ATTN_FAKE_PEER_UNAVAILABLE"):
                print(json.dumps({"status": "unavailable", "reason": f"fake {a.family}: not installed"}), flush=True)
            else:
                print(json.dumps({"status": "ok", "version": "fake 1.0", "kernels": []}), flush=True)
            continue
        mode = modes.get(req["kernel"], "exact")
        if mode == "die":
            sys.exit(3)
        if mode == "skip":
            print(json.dumps({"status": "skipped", "reason": "fake: not this shape", "version": "fake 1.0"}), flush=True)
            continue
        p = Problem(req["problem"])
        q, k, v = load_inputs(req["dir"], p)
        kv_lens = p.kv_lens or [p.kv_len] * p.batch
        pattern = (p.sinks, p.globals, p.doc_lens, p.dilation, p.bigbird)
        if mode == "ortint":
            bits = 8 if p.d.get("kv_dtype") in ("u8", "q8_0") else 4
            k, v = int_cache(k, bits)[2], int_cache(v, bits)[2]
        args = list(sage_rounded(q, k, v)) if mode == "sage" else [x.astype(np.float64) for x in (q, k, v)]
        if p.backward:  # a backward point: O and dQ, dK, dV from dO (the real servers' contract)
            out = attention_backward(*args, load_do(req["dir"], p).astype(np.float64), p.scale, p.causal, p.left,
                                     p.right, kv_lens, *pattern)
            if mode == "wrongdk":
                out[2][...] += 0.05
            for name, x in zip(("o", "dq", "dk", "dv"), out):
                np.save(os.path.join(req["dir"], name + ".npy"), x.astype(np.float32))
            o = out[0]
        else:
            o, _, _ = attention(*args, p.scale, p.causal, p.left, p.right, kv_lens, *pattern)
        if mode == "wrong":
            o = o + 0.05
        np.save(os.path.join(req["dir"], "o.npy"), o.astype(np.float32))
        print(json.dumps({"status": "ok", "times": [1e-3, 1.2e-3][:req["repetitions"]] + [1.1e-3] * max(0, req["repetitions"] - 2),
                          "iterations": 7, "how": f"fake {mode}; threads {a.threads}", "version": "fake 1.0"}), flush=True)


if __name__ == "__main__":
    main()
