#!/usr/bin/env python3
"""The folders by role and the files each kind of addition takes (docs/architecture.md), checked.

  check_layout.py [--root ROOT] [--expect KIND:NAME ...]

Reports, and fails on:
  stray      a source directly in src/cpu/ or src/bench/ (a .cpp; src/bench/using.hpp is shared by
             its subfolders) or a test source directly in tests/ (each lives in the subfolder of
             its role)
  kernel     a src/cpu/kernels/NAME.cpp the ladder does not reach: not cpu::NAME() in
             src/cpu/dispatch/registry.cpp, not in CMakeLists.txt's ATTN_SIMD_KERNELS, not in
             src/cpu/dispatch/target_bf16.cpp's table
  cuda       a src/cuda/ID.cu defining ID_ops without its row X(ID, ...) in
             src/cuda/kernel_list.hpp or its #include in tests/kernels/cuda_emu_kernels.cpp
  peer       a peer of scripts/peers/catalogue.json without its line in docs/peers.md's table
With --expect, succeeds only when exactly the listed findings are reported (tests/checks/layout/:
a planted one of each).
"""
import argparse
import json
import pathlib
import re
import sys


def findings(root: pathlib.Path):
    out = []
    for folder, pattern in (("src/cpu", "*.cpp"), ("src/cpu", "*.hpp"), ("src/bench", "*.cpp"),
                            ("tests", "test_*.cpp")):
        for f in sorted((root / folder).glob(pattern)):
            out.append(("stray", f.relative_to(root).as_posix()))

    def text(rel):
        p = root / rel
        return p.read_text() if p.exists() else ""

    registry = text("src/cpu/dispatch/registry.cpp")
    bf16 = text("src/cpu/dispatch/target_bf16.cpp")
    m = re.search(r"set\(ATTN_SIMD_KERNELS ([^)]*)\)", text("CMakeLists.txt"))
    simd = set(m.group(1).split()) if m else set()
    for f in sorted((root / "src/cpu/kernels").glob("*.cpp")):
        name = f.stem
        reached = (name in simd or re.search(r"cpu::%s\(\)" % re.escape(name), registry)
                   or re.search(r"cpu::%s\(\)" % re.escape(name), bf16))
        if not reached:
            out.append(("kernel", name))

    rows = text("src/cuda/kernel_list.hpp")
    emu = text("tests/kernels/cuda_emu_kernels.cpp")
    for f in sorted((root / "src/cuda").glob("*.cu")):
        kid = f.stem
        if not re.search(r"KernelOps\s+%s_ops\b" % re.escape(kid), f.read_text()):
            continue  # not a kernel (the runtime, the self-test)
        if not re.search(r"X\(\s*%s\s*," % re.escape(kid), rows) or '#include "cuda/%s.cu"' % kid not in emu:
            out.append(("cuda", kid))

    catalogue = root / "scripts/peers/catalogue.json"
    if catalogue.exists():
        docs = text("docs/peers.md")
        for peer in json.loads(catalogue.read_text())["peers"]:
            if "| `%s` |" % peer["name"] not in docs:
                out.append(("peer", peer["name"]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[2]))
    ap.add_argument("--expect", action="append", default=[])
    args = ap.parse_args()
    got = findings(pathlib.Path(args.root))
    for kind, name in got:
        print("check_layout: %s: %s" % (kind, name))
    if args.expect:
        want = sorted(tuple(e.split(":", 1)) for e in args.expect)
        if sorted(got) != want:
            print("check_layout: expected %s" % want, file=sys.stderr)
            return 1
        print("check_layout: the planted findings, and only they, were reported")
        return 0
    if got:
        print("check_layout: %d finding(s): docs/architecture.md says where each file goes" % len(got))
        return 1
    print("check_layout: every source sits in the folder of its role; every kernel, CUDA kernel and peer is reached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
