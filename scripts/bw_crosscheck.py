#!/usr/bin/env python3
"""The lab's read-bandwidth figure against an independent tool, in paired rounds.

Each round runs, one right after the other on the same threads: `attnlab peak` (its read loop:
src/cpu/dispatch/target.cpp's stream_sum, the loop the sweep's per-point probe runs) and likwid-bench's
`load_avx512` (else `load_avx`) kernel over a buffer of the same size (Debian's likwid package:
scripts/setup.sh does not install it; `apt-get install likwid`). Writes FOLDER/crosscheck.md (the
table: per round both figures and their ratio; the median ratio) and crosscheck.json.

Usage: scripts/bw_crosscheck.py [--rounds N] [--threads T] [--mib MIB] [--attnlab build/attnlab] FOLDER
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile


def lab_read_gbs(attnlab, threads, mib):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "peak.json")
        subprocess.run([attnlab, "peak", "--threads", str(threads), "--repeats", "1", "--buffer-mib", str(mib),
                        "--seconds", "0.2", "--json", path], check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            peaks = json.load(f)
    default = peaks["simd_arch"]
    for t in peaks.get("targets", []):
        if t["isa"] == default:
            for r in t["rows"]:
                if r["threads"] == threads:
                    return r["read_bytes"] / 1e9
    for r in peaks["rows"]:
        if r["threads"] == threads:
            return r["read_bytes"] / 1e9
    raise SystemExit(f"bw_crosscheck: attnlab peak wrote no {threads}-thread row")


def likwid_kernel():
    flags = open("/proc/cpuinfo").read()
    return "load_avx512" if " avx512f" in flags else "load_avx"


def likwid_gbs(kernel, threads, mib):
    out = subprocess.run(["likwid-bench", "-t", kernel, "-w", f"S0:{mib}MB:{threads}"], check=True,
                         capture_output=True, text=True).stdout
    m = re.search(r"^MByte/s:\s*([0-9.]+)", out, re.M)
    if not m:
        raise SystemExit("bw_crosscheck: no 'MByte/s:' line in likwid-bench's output:\n" + out)
    return float(m.group(1)) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--attnlab", default=os.path.join(os.path.dirname(__file__), "..", "build", "attnlab"))
    a = ap.parse_args()
    if a.rounds < 1 or a.threads < 1 or a.mib < 64:
        raise SystemExit("bw_crosscheck: --rounds and --threads must be >= 1, --mib >= 64")
    if not shutil.which("likwid-bench"):
        raise SystemExit("bw_crosscheck: likwid-bench not found (apt-get install likwid)")
    kernel = likwid_kernel()
    rounds = []
    for i in range(a.rounds):
        lab = lab_read_gbs(a.attnlab, a.threads, a.mib)
        lk = likwid_gbs(kernel, a.threads, a.mib)
        rounds.append({"round": i + 1, "attnlab_gbs": lab, "likwid_gbs": lk, "ratio": lab / lk})
        print(f"round {i + 1}: attnlab peak read {lab:.1f} GB/s, likwid-bench {kernel} {lk:.1f} GB/s, "
              f"ratio {lab / lk:.2f}", file=sys.stderr)
    ratio = statistics.median(r["ratio"] for r in rounds)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    md = ["# The read-bandwidth figure against likwid-bench", "",
          f"CPU: {cpu}; {a.threads} threads; buffer {a.mib} MiB; {a.rounds} paired rounds (each: `attnlab "
          f"peak` then `likwid-bench -t {kernel} -w S0:{a.mib}MB:{a.threads}`). `attnlab peak`'s read loop is "
          "the one the sweep runs beside each memory-bound point (ReadProbe).", "",
          "| round | attnlab peak read GB/s | likwid-bench GB/s | ratio |", "|---|---|---|---|"]
    md += [f"| {r['round']} | {r['attnlab_gbs']:.1f} | {r['likwid_gbs']:.1f} | {r['ratio']:.2f} |" for r in rounds]
    md += ["", f"Median ratio attnlab / likwid: **{ratio:.2f}**. Regenerate: `scripts/bw_crosscheck.py "
           f"--rounds {a.rounds} --threads {a.threads} --mib {a.mib} <folder>`.", ""]
    os.makedirs(a.folder, exist_ok=True)
    for name, text in (("crosscheck.md", "\n".join(md)),
                       ("crosscheck.json", json.dumps({"cpu": cpu, "threads": a.threads, "mib": a.mib,
                                                        "likwid_kernel": kernel, "rounds": rounds,
                                                        "median_ratio": ratio}, indent=1) + "\n")):
        tmp = os.path.join(a.folder, "." + name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(a.folder, name))
    print(os.path.join(a.folder, "crosscheck.md"))


if __name__ == "__main__":
    main()
