#!/usr/bin/env python3
"""digests.py FILE — the digests a paradec file records, recomputed here from the
safetensors layout and docs/formats.md alone (no paradec code), for
test_weights_verify. Prints one line per tensor the file lists in paradec.digests,
"NAME RECORDED COMPUTED" (XXH3-64 of its bytes), then "paradec.digest RECORDED
COMPUTED" (XXH3-128 over every weight: name, NUL, dtype as int32, shape as two int64,
bytes). Hashes with the xxhash module, else with xxhsum / xxh128sum; exits 3 when
neither is there."""
import json
import re
import shutil
import struct
import subprocess
import sys

DTYPES = ["F32", "F16", "BF16", "U8", "I8", "I32", "I64"]  # paradec's DType numbering

try:
    import xxhash

    def h64(b):
        return xxhash.xxh3_64_hexdigest(b)

    def h128(b):
        return xxhash.xxh3_128_hexdigest(b)
except ImportError:
    if not (shutil.which("xxhsum") and shutil.which("xxh128sum")):
        print("digests.py: neither the xxhash module nor xxhsum/xxh128sum", file=sys.stderr)
        sys.exit(3)

    def run(cmd, b):
        out = subprocess.run(cmd, input=b, stdout=subprocess.PIPE, check=True).stdout.decode()
        return re.search(r"\b([0-9a-f]{16,32})\b", out).group(1)

    def h64(b):
        return run(["xxhsum", "-H3", "-"], b)

    def h128(b):
        return run(["xxh128sum", "-"], b)

raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8 : 8 + n])
meta = header.pop("__metadata__")
data = raw[8 + n :]


def tensor_bytes(name):
    a, b = header[name]["data_offsets"]
    return data[a:b]


# block tensors (paradec.quant) are fed as their block type and logical shape [rows, cols]
QTYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
quant = json.loads(meta.get("paradec.quant", "{}"))
stream = bytearray()
for name, rec in json.loads(meta["paradec.digests"]):
    b = tensor_bytes(name)
    print(name, rec, h64(b))
    if name == "tokenizer.bytes" or (meta.get("paradec.kind") == "bundle" and name.startswith("heads.")):
        continue
    shape = header[name]["shape"]
    code = DTYPES.index(header[name]["dtype"])
    if name in quant:
        code, shape = 7 + QTYPES.index(quant[name][0].upper()), [shape[0], quant[name][1]]
    stream += name.encode() + b"\0" + struct.pack("<i", code)
    stream += struct.pack("<qq", shape[0], shape[1] if len(shape) == 2 else 1) + b
print("paradec.digest", meta["paradec.digest"], h128(bytes(stream)))
