"""splice_tensor.py A B NAME OUT: model file A with tensor NAME (its bytes, its quant type
and its digest) taken from model file B of the same model: a mixed-type matrix, as
llama.cpp's Q4_K_M files hold (tests/test_device_cuemu.sh). The file's own digest
(paradec.digest) stays A's, so the result loads with --no-verify only."""
import json
import struct
import sys


def load(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


(ha, da), (hb, db) = load(sys.argv[1]), load(sys.argv[2])
name, meta, mb = sys.argv[3], ha.pop('__metadata__'), hb['__metadata__']
for key in ('paradec.quant', 'paradec.digests'):
    a, b = json.loads(meta[key]), json.loads(mb[key])
    if isinstance(a, dict):
        a[name] = b[name]
    else:
        a = [e if e[0] != name else next(f for f in b if f[0] == name) for e in a]
    meta[key] = json.dumps(a, separators=(',', ':'))
out, at = [], 0
for k in sorted(ha, key=lambda k: ha[k]['data_offsets'][0]):
    h, d = (hb, db) if k == name else (ha, da)
    s, e = h[k]['data_offsets']
    ha[k] = dict(h[k], data_offsets=[at, at + e - s])
    out.append(d[s:e])
    at += e - s
ha['__metadata__'] = meta
hj = json.dumps(ha).encode()
hj += b' ' * (-len(hj) % 8)
open(sys.argv[4], 'wb').write(struct.pack('<Q', len(hj)) + hj + b''.join(out))
