#!/usr/bin/env python3
"""No target-specific instruction outside its objects (issue 9).

The SIMD kernels are compiled once per instruction-set target, each copy in namespace
attnlab::<target> (src/cpu/dispatch/target.hpp); everything else is built for the x86-64 baseline and
must run on any x86-64 CPU. The usual way that breaks is silent: an inline function of a shared
header (a Problem method, std::vector<float>, a TBB template) is instantiated in an avx512
object and in a baseline object, the linker keeps one copy (the first it sees), and baseline
code now calls AVX-512 code: SIGILL on an AVX2 CPU, and only on the paths that reach it.

This script disassembles a linked binary (objdump -d -C, demangled), splits it into functions
and checks each instruction against the class of its function:

  avx512    the name mentions attnlab::avx512::    anything (x86-64-v4; avx512_bf16 adds
            or attnlab::avx512_bf16::              AVX512_BF16)
  avx2      the name mentions attnlab::avx2:: or   x86-64-v3: VEX (AVX, AVX2, FMA, F16C, BMI1/2),
            attnlab::native:: (not avx512)         LZCNT, MOVBE; no EVEX, zmm or opmask
  baseline  everything else (attnlab::scalar::,    x86-64-v1: no VEX, no EVEX, no x86-64-v2
            naive, blocked, I/O, std::, TBB, ...)  (SSE3/SSSE3/SSE4.x, POPCNT, CX16, ...)
                                                   nor v3 legacy-encoded ones (LZCNT, MOVBE;
                                                   tzcnt is `rep bsf`: allowed, see V3_LEGACY)

"Mentions" is a substring test on the demangled name, so lambdas of a target's functions and
templates instantiated with them (tbb::detail::d1::start_for<..., attnlab::avx2::...{lambda}>)
belong to that target.

VEX and EVEX are read from the encoding, not from the mnemonic: after the legacy and REX
prefixes, a VEX instruction starts with c4/c5 and an EVEX one with 62 (all three are invalid as
opcodes in 64-bit mode, so nothing else starts that way). That covers every AVX family and the
VEX-encoded BMI instructions (andn, bextr, blsi, blsr, bzhi, pdep, pext, rorx, sarx, shlx,
shrx) without a list; the registers (ymm, zmm, xmm16-31, k0-7), EVEX operand decorations
({%k1}, {z}, {1to16}, {sae}) and v-prefixed mnemonics are checked too, as a second opinion.
The legacy-encoded extensions are matched by mnemonic (V2_MNEMONICS, V3_LEGACY).

Usage: check_isa_symbols.py BINARY [--objdump PATH] [--expect-leak NAME ...] [--expect-clean NAME ...]
Exit: 0 no offending function (or not an x86-64 binary: nothing to check), 1 offending
functions (each printed with its first offending instruction), 2 usage / objdump errors.
With --expect-leak / --expect-clean (the negative test, tests/checks/isa_leak/): 0 when the
offending functions are exactly those named by --expect-leak and every --expect-clean function
was found and is clean, 1 otherwise.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

# Functions that may use instructions above their class, each with the reason. Only code that
# checks the CPU itself before using them (run-time dispatch of its own) belongs here; attnlab
# code never does: a leak there is fixed in the code (tests/checks/check_isa_symbols.py's header).
# Patterns are regular expressions searched in the demangled function name.
# Empty today: the dispatched build with CUDA (cudart_static linked in), TBB's and Google
# Benchmark's inline code, CLI11, nlohmann_json and GoogleTest all pass as baseline code
# (glibc's own ifunc variants live in libc.so, not in our binaries).
ALLOWLIST = [
    # (pattern, reason)
]

TARGET_CLASSES = ("baseline", "avx2", "avx512")

FUNC_RE = re.compile(r"^([0-9a-f]+) <(.*)>:$")
# "  addr:\tbytes \tmnemonic operands": objdump -d --insn-width=15 keeps each instruction on
# one line (the longest x86 instruction is 15 bytes).
INSN_RE = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f ]+)\t(.*)$")
# Opcode after the legacy prefixes (segment, operand/address size, lock, rep) and REX.
_PREFIXES = r"(?:(?:26|2e|36|3e|64|65|66|67|f0|f2|f3|4[0-9a-f]) )*"
VEX_RE = re.compile(_PREFIXES + r"c[45] ")
EVEX_RE = re.compile(_PREFIXES + r"62 ")
# Instruction prefixes objdump writes before the mnemonic.
PREFIX_WORDS = {"rep", "repz", "repnz", "repe", "repne", "lock", "notrack", "bnd", "data16",
                "addr32", "cs", "ds", "ss", "es", "fs", "gs", "xacquire", "xrelease",
                "{vex}", "{vex3}", "{evex}"}
ZMM_RE = re.compile(r"%zmm\d|%[xy]mm(?:1[6-9]|2\d|3[01])\b|%k[0-7]\b|\{%k[0-7]\}|\{z\}|\{1to\d+\}|sae\}")
YMM_RE = re.compile(r"%ymm\d")
# Opmask instructions (AVX-512; no other x86 mnemonic starts with k).
KMASK_RE = re.compile(r"^k(?:add|and|andn|mov|not|or|ortest|shiftl|shiftr|test|unpck|xnor|xor)[bwdq]{1,2}$")
# x86-64-v3 instructions that are not VEX-encoded (the BMI ones are VEX: caught by encoding).
# Not tzcnt: its encoding (f3 0f bc) is `rep bsf`, which a CPU without BMI1 runs as bsf (the
# same result for a non-zero input); GCC emits it for __builtin_ctz in baseline code on
# purpose, and objdump prints it as tzcnt. lzcnt (f3 0f bd) would run as bsr there: a
# different result, so it is never emitted without -mlzcnt and is a leak.
V3_LEGACY = re.compile(r"^(?:lzcnt|movbe)[wlq]?$")
V3_VEX_GPR = re.compile(r"^(?:andn|bextr|blsi|blsmsk|blsr|bzhi|pdep|pext|rorx|sarx|shlx|shrx|mulx)[lq]?$")
# x86-64-v2 over v1: SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT, CMPXCHG16B, LAHF/SAHF in 64-bit mode.
V2_MNEMONICS = re.compile(
    r"^(?:"
    r"addsubp[sd]|haddp[sd]|hsubp[sd]|lddqu|movddup|movshdup|movsldup|fisttp[sl]?l?|monitor|mwait"  # SSE3
    r"|pabs[bwd]|palignr|phadd(?:w|d|sw)|phsub(?:w|d|sw)|pmaddubsw|pmulhrsw|pshufb|psign[bwd]"  # SSSE3
    r"|blendp[sd]|blendvp[sd]|dpp[sd]|extractps|insertps|movntdqa|mpsadbw|packusdw|pblendvb"  # SSE4.1
    r"|pblendw|pcmpeqq|pextr[bdq]|phminposuw|pinsr[bdq]|pmaxs[bd]|pmaxu[dw]|pmins[bd]|pminu[dw]"
    r"|pmovsx(?:bw|bd|bq|wd|wq|dq)|pmovzx(?:bw|bd|bq|wd|wq|dq)|pmuldq|pmulld|ptest|round[ps][sd]"
    r"|pcmpestr[im]|pcmpistr[im]|pcmpgtq|crc32[bwlq]?"  # SSE4.2
    r"|popcnt[wlq]?|cmpxchg16b|lahf|sahf"
    r")$")


def elf_machine(path):
    """(is_elf, e_machine) from the ELF header."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return False, None
    order = "little" if head[5] == 1 else "big"
    return True, int.from_bytes(head[18:20], order)


def classify(name):
    # attnlab::avx512_bf16:: is the flash_bf16 object (x86-64-v4 + AVX512_BF16): its code runs
    # only after the registry checked the CPU for both, like the avx512 target's.
    if "attnlab::avx512::" in name or "attnlab::avx512_bf16::" in name:
        return "avx512"
    if "attnlab::avx2::" in name or "attnlab::native::" in name:
        return "avx2"
    return "baseline"


def offense(cls, raw, text):
    """Why `text` (mnemonic and operands, raw bytes `raw`) is not allowed in class `cls`, or None."""
    if cls == "avx512":
        return None
    words = text.split()
    while words and (words[0] in PREFIX_WORDS or words[0].startswith("rex")):
        words.pop(0)
    if not words:
        return None
    mnemonic = words[0]
    # Operands without objdump's comments ("# 1b1fb8 <symbol>") and symbol references
    # ("<name+0x1c>"): symbol names may contain anything.
    ops = " ".join(words[1:])
    for cut in (" <", "#"):
        at = ops.find(cut)
        if at >= 0:
            ops = ops[:at]
    if EVEX_RE.match(raw):
        return "EVEX-encoded (AVX-512)"
    if ZMM_RE.search(ops):
        return "AVX-512 register or operand decoration"
    if KMASK_RE.match(mnemonic):
        return "AVX-512 opmask instruction"
    if cls == "avx2":
        return None
    if VEX_RE.match(raw):
        return "VEX-encoded (AVX/AVX2/FMA/F16C/BMI: x86-64-v3)"
    if YMM_RE.search(ops):
        return "ymm register (AVX)"
    if mnemonic.startswith("v") and not mnemonic.startswith(("verr", "verw")):
        return "v-prefixed (AVX) mnemonic"
    if V3_LEGACY.match(mnemonic) or V3_VEX_GPR.match(mnemonic):
        return "x86-64-v3 instruction (BMI/LZCNT/MOVBE)"
    if V2_MNEMONICS.match(mnemonic):
        return "x86-64-v2 instruction (SSE3/SSSE3/SSE4/POPCNT/CX16), above the x86-64 baseline"
    return None


class Function:
    __slots__ = ("name", "addr", "cls", "insns", "first", "count", "allowed")

    def __init__(self, addr, name, allowed):
        self.addr = addr
        self.name = name
        self.cls = classify(name)
        self.insns = 0
        self.first = None  # (address, instruction text, reason) of the first offending one
        self.count = 0     # offending instructions
        self.allowed = allowed  # index into ALLOWLIST, or None


def scan(binary, objdump):
    allow = [(re.compile(p), reason) for p, reason in ALLOWLIST]
    cmd = [objdump, "-d", "-C", "--insn-width=15", binary]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", bufsize=1 << 20)
    functions = []
    fn = None
    for line in proc.stdout:
        if not line.startswith(" "):
            m = FUNC_RE.match(line)
            if m:
                name = m.group(2)
                idx = next((i for i, (p, _) in enumerate(allow) if p.search(name)), None)
                fn = Function(m.group(1), name, idx)
                functions.append(fn)
            continue
        if fn is None:
            continue
        m = INSN_RE.match(line)
        if not m:
            continue
        fn.insns += 1
        if fn.cls == "avx512" or fn.allowed is not None:
            continue
        why = offense(fn.cls, m.group(2), m.group(3))
        if why:
            fn.count += 1
            if fn.first is None:
                fn.first = (m.group(1), " ".join(m.group(3).split()), why)
    err = proc.stderr.read()
    if proc.wait() != 0:
        sys.exit(f"check_isa_symbols: '{' '.join(cmd)}' failed (exit {proc.returncode}): {err.strip()}")
    return functions


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--objdump", default=os.environ.get("OBJDUMP", "objdump"))
    ap.add_argument("--expect-leak", action="append", default=[], metavar="NAME",
                    help="negative test: a function (substring of its demangled name) that must be reported")
    ap.add_argument("--expect-clean", action="append", default=[], metavar="NAME",
                    help="negative test: a function that must be present and pass")
    args = ap.parse_args()

    if not os.path.isfile(args.binary):
        print(f"check_isa_symbols: {args.binary}: no such file", file=sys.stderr)
        return 2
    is_elf, machine = elf_machine(args.binary)
    if not is_elf:
        print(f"check_isa_symbols: {args.binary} is not an ELF file", file=sys.stderr)
        return 2
    if machine != 62:  # EM_X86_64
        print(f"check_isa_symbols: {args.binary} is not an x86-64 binary (ELF e_machine {machine}); "
              "the per-target instruction check is x86-64 only: nothing to check")
        return 0
    if shutil.which(args.objdump) is None:
        print(f"check_isa_symbols: '{args.objdump}' not found (binutils; set OBJDUMP or --objdump)",
              file=sys.stderr)
        return 2

    start = time.monotonic()
    functions = scan(args.binary, args.objdump)
    secs = time.monotonic() - start
    if not functions:
        print(f"check_isa_symbols: no functions in {args.binary} (stripped?): cannot check", file=sys.stderr)
        return 2

    bad = [f for f in functions if f.first is not None]
    for f in bad:
        addr, insn, why = f.first
        print(f"LEAK [{f.cls}] {f.name}\n    first of {f.count} offending: {addr}: {insn}  ({why})")

    print(f"check_isa_symbols: {args.binary}: {len(functions)} functions, "
          f"{sum(f.insns for f in functions)} instructions, {secs:.1f} s")
    for cls in TARGET_CLASSES:
        group = [f for f in functions if f.cls == cls and f.allowed is None]
        print(f"  {cls:9s} {len(group):6d} functions checked, {sum(f.insns for f in group):8d} instructions, "
              f"{sum(1 for f in group if f.first):4d} offending")
    for i, (pattern, reason) in enumerate(ALLOWLIST):
        n = sum(1 for f in functions if f.allowed == i)
        print(f"  allowlist {n:6d} functions not checked: /{pattern}/ ({reason})")

    if args.expect_leak or args.expect_clean:
        return self_test(functions, bad, args.expect_leak, args.expect_clean)
    if bad:
        print(f"check_isa_symbols: FAILED: {len(bad)} function(s) outside their target use its "
              "instructions (fix the code: tests/checks/check_isa_symbols.py's header says how leaks happen)")
        return 1
    print("check_isa_symbols: OK: no target instruction outside its target's functions")
    return 0


def self_test(functions, bad, expect_leak, expect_clean):
    problems = []
    for name in expect_leak:
        if not any(name in f.name for f in bad):
            problems.append(f"expected a leak in '{name}', none reported")
    for f in bad:
        if not any(name in f.name for name in expect_leak):
            problems.append(f"unexpected leak in '{f.name}'")
    for name in expect_clean:
        found = [f for f in functions if name in f.name]
        if not found:
            problems.append(f"expected clean function '{name}' is not in the binary (inlined away?)")
        elif any(f.first for f in found):
            problems.append(f"expected '{name}' to be clean, it was reported")
    for p in problems:
        print(f"self-test: {p}")
    if problems:
        print("check_isa_symbols: self-test FAILED")
        return 1
    print(f"check_isa_symbols: self-test OK: {len(expect_leak)} planted leak(s) reported, "
          f"{len(expect_clean)} control(s) clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
