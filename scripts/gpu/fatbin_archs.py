#!/usr/bin/env python3
"""Lists the CUDA code a host binary carries (its .nv_fatbin section) as "ELF sm_90", "PTX sm_90"
lines, one per distinct entry: what `cuobjdump --list-elf/--list-ptx` shows, for machines where
the toolkit has no cuobjdump. Standard library only.

The section holds one or more fat binaries, each a 16-byte header (magic 0xBA55ED50, version,
header size, size of the entries that follow) and entries, each with its own header: kind
(1 = PTX, 2 = ELF), header size, payload size, ..., the SM architecture at byte 28."""
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "PTX", 2: "ELF"}


def section(path, name):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def sh(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
    strtab = sh(shstrndx)
    for i in range(shnum):
        s = sh(i)
        start = strtab[4] + s[0]
        if data[start:data.index(b"\0", start)].decode() == name:
            return data[s[4]:s[4] + s[5]]
    return b""


def entries(blob):
    out, pos = [], 0
    while pos + 16 <= len(blob):
        magic, _version, header, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned in the section
            continue
        e, end = pos + header, pos + header + size
        while e + 32 <= end:
            kind, _, eheader, payload = struct.unpack_from("<HHIQ", blob, e)
            arch, = struct.unpack_from("<I", blob, e + 28)
            if eheader == 0:
                break
            out.append((KINDS.get(kind, f"kind{kind}"), arch))
            e += eheader + payload
        pos = end
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fatbin_archs.py BINARY")
    found = sorted(set(entries(section(sys.argv[1], ".nv_fatbin"))))
    if not found:
        sys.exit(f"{sys.argv[1]}: no CUDA code (.nv_fatbin) found")
    for kind, arch in found:
        print(f"{kind} sm_{arch}")


if __name__ == "__main__":
    main()
