#!/usr/bin/env python3
"""The instruction-set floor holds every intrinsic and every instruction-set #if of the CPU kernels.

Scans the C++ sources under ROOT/src/cpu (comments and string literals stripped) for
  - intrinsics: x86 _mm*_ calls, __m128/__m256/__m512 types and masks, AMX _tile_ calls,
    NEON types and v*q_<type> calls, <immintrin.h> / <arm_neon.h>, vector instructions in asm;
  - instruction-set conditionals: #if/#elif/#ifdef/#ifndef on __AVX*, __SSE*, __F16C__, __FMA__,
    __AMX*, __aarch64__, __ARM_*, __x86_64__, __i386__, ATTN_TARGET_SCALAR, ATTN_HAVE_AMX*,
    ATTN_BF16_OBJECT;
and fails on one outside src/cpu/simd/isa/ (the floor), src/cpu/dispatch/isa.cpp (the dispatch: it asks the
CPU what it runs), and the files still listed in PENDING below - those that have not moved down
yet, each with its count; a pending file whose count changes fails too (a moved one leaves the
list, a new use does not hide in it). Usage:
  check_isa_floor.py [--root DIR] [--expect FILE:KIND ...]
--expect (the planted fixture, tests/checks/isa_floor/): exit 0 only if exactly these violations are
found (KIND: intrinsic or if), the check's own test that it can fail.
"""
import argparse
import pathlib
import re
import sys

FLOOR = "src/cpu/simd/isa/"
DISPATCH = {"src/cpu/dispatch/isa.cpp"}
# Files whose instruction-set code has not moved into the floor yet: path -> violations now.
# (Empty since the floor took the last of them: a file listed here with its count would be allowed that
# many lines while it moves down, and fails the check once the count changes.)
PENDING = {}

INTRINSIC = re.compile(
    r"\b_mm\d*_\w+\s*\(|\b__m(64|128|256|512)[a-z]*\b|\b__mmask\d+\b|\b_tile_\w+\s*\("
    r"|\b(u?int|float|bfloat|poly)(8|16|32|64)x\d+(x\d)?_t\b|\bv\w*q?_[sufp](8|16|32|64)\s*\("
    r"|#\s*include\s*<(immintrin|x86intrin|arm_neon|arm_sve)\.h>"
    r"|\basm\b[^;]*\"[^\"]*\b(vp\w+|v\w+p[sd]|tdp\w+|tile\w+|ldtilecfg|sdot)\b")
ISA_IF = re.compile(
    r"^\s*#\s*(if|elif|ifdef|ifndef)\b.*\b(__AVX\w*|__SSE\w*|__F16C__|__FMA__|__AMX\w*|__aarch64__|__ARM_\w+"
    r"|__x86_64__|__i386__|ATTN_TARGET_SCALAR|ATTN_HAVE_AMX\w*|ATTN_BF16_OBJECT)\b")


def strip(text):
    """Comments and string literals blanked (line structure kept); asm strings stay (checked)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            literal = text[i:j + 1]
            line_start = text.rfind("\n", 0, i) + 1
            keep = re.search(r"\basm\b|__asm__", text[line_start:i]) or text[line_start:i].lstrip().startswith("#")
            out.append(literal if keep else '""')
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def violations(root):
    found = {}
    for path in sorted((root / "src" / "cpu").rglob("*")):
        if path.suffix not in {".cpp", ".hpp", ".h", ".cc"} or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel.startswith(FLOOR) or rel in DISPATCH:
            continue
        for lineno, line in enumerate(strip(path.read_text(errors="replace")).split("\n"), 1):
            kind = "if" if ISA_IF.search(line) else "intrinsic" if INTRINSIC.search(line) else None
            if kind:
                found.setdefault(rel, []).append((lineno, kind, line.strip()))
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[2]))
    ap.add_argument("--expect", action="append", default=[], help="FILE:KIND the planted fixture must show")
    args = ap.parse_args()
    found = violations(pathlib.Path(args.root))
    if args.expect:
        got = sorted({f"{rel}:{kind}" for rel, hits in found.items() for _, kind, _ in hits})
        want = sorted(set(args.expect))
        if got != want:
            print(f"check_isa_floor: the fixture showed {got}, expected {want}", file=sys.stderr)
            return 1
        print(f"check_isa_floor: the planted violations are reported: {', '.join(want)}")
        return 0
    bad = 0
    for rel, hits in found.items():
        if rel in PENDING and len(hits) == PENDING[rel]:
            continue
        bad += 1
        why = (f"{len(hits)} instruction-set lines where PENDING says {PENDING[rel]}: move them into {FLOOR}"
               if rel in PENDING else f"instruction-set code outside the floor ({FLOOR})")
        print(f"{rel}: {why}", file=sys.stderr)
        for lineno, kind, text in hits:
            print(f"  {rel}:{lineno}: {kind}: {text[:110]}", file=sys.stderr)
    for rel, count in PENDING.items():
        if rel not in found and count:
            bad += 1
            print(f"{rel}: PENDING lists {count} lines, the file has none: take it off the list", file=sys.stderr)
    if bad:
        return 1
    pending = sum(PENDING.values())
    print(f"check_isa_floor: no instruction-set code outside {FLOOR} but the dispatch"
          + (f" and {len(PENDING)} pending files ({pending} lines)" if PENDING else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
