#!/usr/bin/env python3
"""A peer server for `attnlab sweep --peers`: one process per peer family and thread count,
started by the sweep with the peers' Python (.venv-peers, scripts/lab peers-setup), speaking
JSON lines on stdin/stdout:

  {"cmd": "hello"}
    -> {"status": "ok", "version": "onnxruntime 1.32.0", "kernels": [...]}
     | {"status": "unavailable", "reason": "..."}           (the library cannot be imported)
  {"cmd": "run", "kernel": K, "dir": D, "problem": {...}, "repetitions": R, "min_time_s": T,
   "time_cap_s": C}
    -> {"status": "ok", "times": [s per call, one per repetition], "iterations": n, "how": "...",
        "extra_bytes": peak RSS growth over the loaded inputs (null where /proc refuses the reset)}
       with O written to D/o.npy, float32 (B, Hq, Sq, Dv), and for a backward point D/dq.npy,
       D/dk.npy, D/dv.npy, float32 (B, H, S, D) as Q, K, V
     | {"status": "skipped" | "failed", "reason": "..."}

D holds q.npy, k.npy, v.npy (float32, the problem's layout), and do.npy for a backward point
(problem "pass": backward - the peer's forward runs outside the timed calls, which compute
dQ, dK, dV from it - or forward_backward, both timed). A family module's prepare() returns
(fn, collect, how); collect() gives O, or for a backward point a dict of o, dq, dk, dv. A family
without a backward (module BACKWARD false) skips backward points. The sweep verifies O against its
float64 reference and writes the row; this process only runs the peer. It is pinned to the
first `threads` cores it may use (XLA sizes its pool from them) and each peer is told the
thread count as well. Library chatter goes to stderr; stdout carries only the protocol.
"""
import argparse
import importlib
import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from catalogue import FAMILY_MODULES as FAMILIES  # noqa: E402  (catalogue.json: family -> runner module)
from common import Problem, Skip, load_do, load_inputs, time_calls  # noqa: E402


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def reset_peak():
    """Resets the process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--threads", type=int, required=True)
    a = ap.parse_args()
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # native libraries printing to fd 1
    sys.stdout = sys.stderr
    cpus = sorted(os.sched_getaffinity(0))
    if 0 < a.threads < len(cpus):
        os.sched_setaffinity(0, cpus[:a.threads])

    def reply(obj):
        proto.write(json.dumps(obj) + "\n")

    mod, version, unavailable = None, "", ""
    try:
        mod = importlib.import_module(FAMILIES[a.family])
        version = mod.setup(a.threads)
    except Exception as e:  # ImportError, or a library that fails to load
        unavailable = f"{a.family} is not usable in {sys.prefix}: {type(e).__name__}: {e}"[:400]
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("cmd") == "hello":
            reply({"status": "unavailable", "reason": unavailable} if unavailable else
                  {"status": "ok", "version": version, "kernels": list(mod.KERNELS)})
            continue
        if unavailable:
            reply({"status": "skipped", "reason": unavailable})
            continue
        try:
            p = Problem(req["problem"])
            if p.backward and not getattr(mod, "BACKWARD", False):
                raise Skip(f"{req['kernel']} has no backward pass (an inference runtime)")
            # The score modifications a runner takes (its SCORE_MODS); a point with another is skipped.
            takes = getattr(mod, "SCORE_MODS", {}).get(req["kernel"], set())
            if p.score_mods - takes:
                raise Skip(f"{req['kernel']} does not take {', '.join(sorted(p.score_mods - takes))} (it takes: "
                           f"{', '.join(sorted(takes)) or 'no score modification'})")
            if p.score_mods and p.backward:
                raise Skip("score modifications' gradients are checked on the lab's own kernels (naive, flash) only")
            q, k, v = load_inputs(req["dir"], p)
            if p.backward:
                p.d_o = load_do(req["dir"], p)
            # The peer's memory beyond its inputs: peak RSS during preparation and the calls
            # (score matrices, masks, repeated K/V, the output) above the RSS once the inputs
            # are loaded.
            measured = reset_peak()
            base = _status_kib("VmRSS")
            fn, collect, how = mod.prepare(req["kernel"], p, q, k, v)
            times, n = time_calls(fn, req["repetitions"], req["min_time_s"], req["time_cap_s"])
            extra = max(0, _status_kib("VmHWM") - base) * 1024 if measured and base is not None else None
            out = collect()
            for name, arr in (out.items() if isinstance(out, dict) else [("o", out)]):
                np.save(os.path.join(req["dir"], name + ".npy"), np.ascontiguousarray(arr, dtype=np.float32))
            del fn, collect
            reply({"status": "ok", "times": times, "iterations": n, "how": how, "version": version,
                   "extra_bytes": extra})
        except Skip as e:
            reply({"status": "skipped", "reason": str(e), "version": version})
        except MemoryError:
            reply({"status": "skipped", "reason": "memory: allocation failed in the peer", "version": version})
        except Exception as e:
            traceback.print_exc()
            reply({"status": "failed", "reason": f"{type(e).__name__}: {e}"[:400], "version": version})


if __name__ == "__main__":
    main()
