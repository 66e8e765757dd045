#!/usr/bin/env python3
"""gguf_patch.py — a GGUF file with one tensor info changed, for the bad-input tests (the
standard library only, so it runs without the reference venv).
  gguf_patch.py IN OUT NAME type T     the tensor's ggml type becomes T
  gguf_patch.py IN OUT NAME dim0 N     its row length (ggml dims[0]) becomes N
  gguf_patch.py IN OUT - cut N         the file without its last N bytes"""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    src, dst, name, what, val = sys.argv[1:6]
    b = bytearray(open(src, "rb").read())
    if what == "cut":
        open(dst, "wb").write(b[:len(b) - int(val)])
        return
    pos = 8
    n_t, n_kv = struct.unpack_from("<QQ", b, pos)
    pos += 16

    def rd_str(p):
        n = struct.unpack_from("<Q", b, p)[0]
        return b[p + 8:p + 8 + n].decode(), p + 8 + n

    def skip_value(p, t):
        if t == 8:
            return rd_str(p)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            for _ in range(n):
                p = skip_value(p, et)
            return p
        return p + SIZES[t]

    for _ in range(n_kv):
        _, pos = rd_str(pos)
        t = struct.unpack_from("<I", b, pos)[0]
        pos = skip_value(pos + 4, t)
    for _ in range(n_t):
        tname, pos = rd_str(pos)
        nd = struct.unpack_from("<I", b, pos)[0]
        dims_at, type_at = pos + 4, pos + 4 + 8 * nd
        if tname == name:
            if what == "type":
                struct.pack_into("<I", b, type_at, int(val))
            else:
                struct.pack_into("<Q", b, dims_at, int(val))
            open(dst, "wb").write(b)
            return
        pos = type_at + 12
    sys.exit(f"gguf_patch: no tensor {name}")


main()
