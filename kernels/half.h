/* half.h — IEEE half → float, exactly: every case (subnormals, infinities, NaN quieted).
   F16C's vcvtph2ps gives the same bits; the kernels and the file formats share this. */
#ifndef PD_HALF_H
#define PD_HALF_H
#include <stdint.h>
#include <string.h>

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) u = sign | 0x7f800000 | (man << 13) | (man ? 0x400000u : 0);
    else if (exp) u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    else {
        float f = (float)man * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
