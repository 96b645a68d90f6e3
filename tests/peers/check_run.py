#!/usr/bin/python3
"""Checks a results folder swept with peers (scripts/lab peers-test):

    /usr/bin/python3 tests/peers/check_run.py RESULTS_DIR KERNEL...

For each peer KERNEL: at least one row ok, verified (PASS) and timed, with the peer's version
and how it was driven; none failed; every skipped row says why. bench.json holds the timed peer
points (Google Benchmark's shape, so its compare.py reads them) and report.md shows the peers
beside the kernels. Exits 1 naming what is wrong."""
import csv
import json
import os
import sys


def main():
    folder, kernels = sys.argv[1], sys.argv[2:]
    rows = list(csv.DictReader(open(os.path.join(folder, "results.csv"))))
    bench = json.load(open(os.path.join(folder, "bench.json")))
    report = open(os.path.join(folder, "report.md")).read()
    problems = []
    names = {b["run_name"] for b in bench["benchmarks"]}
    for k in kernels:
        mine = [r for r in rows if r["kernel"] == k]
        ok = [r for r in mine if r["status"] == "ok"]
        if not ok:
            problems.append(f"{k}: no row ok ({len(mine)} rows: "
                            + "; ".join(f"{r['status']}: {r['reason']}" for r in mine[:3]) + ")")
        for r in mine:
            if r["isa"] != "peer":
                problems.append(f"{r['id']}: isa {r['isa']!r}, want 'peer'")
            if r["status"] == "failed":
                problems.append(f"{r['id']}: failed: {r['reason']}")
            if r["status"] == "skipped" and not r["reason"]:
                problems.append(f"{r['id']}: skipped without a reason")
        for r in ok:
            if r["verdict"] != "PASS" or not r["time_median_s"] or float(r["gflops"]) <= 0:
                problems.append(f"{r['id']}: ok but verdict {r['verdict']!r}, time {r['time_median_s']!r}")
            if not r["version"] or not r["how"]:
                problems.append(f"{r['id']}: version {r['version']!r} / how {r['how']!r} missing")
            if not any(n.startswith(f"attn/{k}/") for n in names):
                problems.append(f"{k}: no benchmark in bench.json")
        if f"| {k} (peer) |" not in report:
            problems.append(f"{k}: not in report.md's summary")
    if "## Peers: the lab's best against what users run" not in report or "lab speed-up" not in report:
        problems.append("report.md lacks the peers section with the best-lab-vs-best-peer table")
    if problems:
        print("check_run: " + "\n  ".join(["FAILED"] + problems), file=sys.stderr)
        return 1
    print(f"check_run: {', '.join(kernels)}: rows ok, verified, timed; report has them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
