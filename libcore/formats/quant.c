/* quant.c — GGUF's block types in plain C: ggml's quantize_row_*_ref and dequantize_row_*
   (ggml-quants.c), their float operations in their order. The build's -ffp-contract=off
   keeps every product and sum rounding on its own, as numpy's do (gguf-py). */
#include "formats/quant.h"

#include <math.h>
#include <string.h>

#include "half.h"

#define QK 32
#define QK_K 256
#define GROUP_MAX_EPS 1e-15f

float fp16_to_f32(uint16_t h) { return half_to_float(h); }

uint16_t f32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); /* NaN stays NaN */
    if (ax >= 0x477ff000u) return sign | 0x7c00;                                 /* ≥ 65520 rounds to inf */
    if (ax < 0x38800000u) {                                                      /* below 2^-14: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)lrintf(a * 0x1p24f); /* exact scaling, ties to even */
    }
    uint32_t r = ax - 0x38000000u; /* exponent rebias 127 → 15 */
    r += 0x0fff + ((r >> 13) & 1);
    return sign | (uint16_t)(r >> 13);
}

static float rd_f16(const uint8_t *p) { return fp16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static void wr_f16(uint8_t *p, float f) {
    uint16_t h = f32_to_fp16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* ggml's: round to nearest, ties to even, for |x| < 2^22 */
static int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

/* ---- the 32-element types ---- */

static void quant_q8_0(uint8_t *y, const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    for (int j = 0; j < QK; j++) y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static void quant_q4_0(uint8_t *y, const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -8, id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    for (int j = 0; j < QK / 2; j++) {
        const float x0 = x[j] * id, x1 = x[QK / 2 + j] * id;
        const int xi0 = (int)fminf(15.0f, truncf(x0 + 8.5f)), xi1 = (int)fminf(15.0f, truncf(x1 + 8.5f));
        y[2 + j] = (uint8_t)(xi0 | xi1 << 4);
    }
}

static void quant_q5_0(uint8_t *y, const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -16, id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        const float x0 = x[j] * id, x1 = x[QK / 2 + j] * id;
        const int xi0 = (int)fminf(31.0f, truncf(x0 + 16.5f)), xi1 = (int)fminf(31.0f, truncf(x1 + 16.5f));
        y[6 + j] = (uint8_t)((xi0 & 0x0f) | (xi1 & 0x0f) << 4);
        qh |= (uint32_t)(xi0 >> 4) << j | (uint32_t)(xi1 >> 4) << (j + QK / 2);
    }
    for (int k = 0; k < 4; k++) y[2 + k] = (uint8_t)(qh >> 8 * k); /* little-endian */
}

static void quant_q4_1(uint8_t *y, const float *x) {
    float min = x[0], max = x[0];
    for (int j = 1; j < QK; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15, id = d ? 1.0f / d : 0.0f;
    wr_f16(y, d);
    wr_f16(y + 2, min);
    for (int j = 0; j < QK / 2; j++) {
        const float x0 = (x[j] - min) * id, x1 = (x[QK / 2 + j] - min) * id;
        const int xi0 = (int)fminf(15.0f, truncf(x0 + 0.5f)), xi1 = (int)fminf(15.0f, truncf(x1 + 0.5f));
        y[4 + j] = (uint8_t)(xi0 | xi1 << 4);
    }
}

static void dequant_q8_0(float *y, const uint8_t *b) {
    const float d = rd_f16(b);
    for (int j = 0; j < QK; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void dequant_q4_0(float *y, const uint8_t *b) {
    const float d = rd_f16(b);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((b[2 + j] & 0x0f) - 8) * d;
        y[j + QK / 2] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

static void dequant_q5_0(float *y, const uint8_t *b) {
    const float d = rd_f16(b);
    const uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    for (int j = 0; j < QK / 2; j++) {
        const int x0 = ((b[6 + j] & 0x0f) | (int)((qh >> j) << 4 & 0x10)) - 16;
        const int x1 = ((b[6 + j] >> 4) | (int)((qh >> (j + 12)) & 0x10)) - 16;
        y[j] = (float)x0 * d;
        y[j + QK / 2] = (float)x1 * d;
    }
}

static void dequant_q4_1(float *y, const uint8_t *b) {
    const float d = rd_f16(b), m = rd_f16(b + 2);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(b[4 + j] & 0x0f) * d + m;
        y[j + QK / 2] = (float)(b[4 + j] >> 4) * d + m;
    }
}

/* ---- the K types ---- */

static void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* llama.cpp's make_qkx2_quants: a scale and a minimum for n values, searched over
   nstep + 1 trial scales for the least weighted squared error */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_mad = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * L[i] + min - x[i];
        best_mad += weights[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float mad = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                mad += weights[i] * (diff * diff);
            }
            if (mad < best_mad) {
                memcpy(L, Laux, (size_t)n);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* llama.cpp's make_qx_quants with rmse_type 1 (weights x²): a symmetric scale for n values */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q4_K and Q5_K share everything but the width of q (nmax 15 or 31) and the packing */
static void quant_qk_scales(uint8_t *y, const float *x, uint8_t *L, int nmax) {
    float mins[QK_K / 32], scales[QK_K / 32], weights[32], max_scale = 0, max_min = 0;
    uint8_t Laux[32];
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = nmax == 15
                        ? make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20)
                        : make_qkx2_quants(32, 31, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.5f, 0.1f, 15);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t *sc = y + 4;
    memset(sc, 0, 12);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]), lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = ls > 63 ? 63 : ls; /* as ggml: to uint8_t first, then the clamp */
        lm = lm > 63 ? 63 : lm;
        if (j < 4) {
            sc[j] = (uint8_t)ls;
            sc[j + 4] = (uint8_t)lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    wr_f16(y, max_scale / 63.f);
    wr_f16(y + 2, max_min / 63.f);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t s, m;
        get_scale_min_k4(j, sc, &s, &m);
        const float d = rd_f16(y) * s;
        if (!d) continue;
        const float dm = rd_f16(y + 2) * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
}

static void quant_q4_k(uint8_t *y, const float *x) {
    uint8_t L[QK_K];
    quant_qk_scales(y, x, L, 15);
    uint8_t *q = y + 16;
    for (int j = 0; j < QK_K; j += 64) {
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        q += 32;
    }
}

static void quant_q5_k(uint8_t *y, const float *x) {
    uint8_t L[QK_K];
    quant_qk_scales(y, x, L, 31);
    uint8_t *qh = y + 16, *ql = y + 48, m1 = 1, m2 = 2;
    memset(qh, 0, QK_K / 8);
    for (int n = 0; n < QK_K; n += 64) {
        for (int j = 0; j < 32; ++j) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) {
                l1 -= 16;
                qh[j] |= m1;
            }
            if (l2 > 15) {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 = (uint8_t)(m1 << 2);
        m2 = (uint8_t)(m2 << 2);
        ql += 32;
    }
}

static void quant_q6_k(uint8_t *y, const float *x) {
    int8_t L[QK_K];
    float scales[QK_K / 16], max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
        const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
        scales[ib] = scale;
        if (fabsf(scale) > max_abs_scale) {
            max_abs_scale = fabsf(scale);
            max_scale = scale;
        }
    }
    memset(y, 0, 210);
    uint8_t *ql = y, *qh = y + 128;
    int8_t *sc = (int8_t *)(y + 192);
    if (max_abs_scale < GROUP_MAX_EPS) return; /* all zeros, d = 0 */
    float iscale = -128.f / max_scale;
    wr_f16(y + 208, 1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) {
        int v = nearest_int(iscale * scales[ib]);
        sc[ib] = (int8_t)(v > 127 ? 127 : v);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = rd_f16(y + 208) * sc[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
        }
    }
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF,
                          q4 = L[j + l + 96] & 0xF;
            ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                              ((L[j + l + 96] >> 4) << 6));
        }
        ql += 64;
        qh += 32;
    }
}

static void dequant_q4_k(float *y, const uint8_t *b) {
    const float d = rd_f16(b), min = rd_f16(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
        uint8_t sc, m;
        get_scale_min_k4(is + 0, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        get_scale_min_k4(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
}

static void dequant_q5_k(float *y, const uint8_t *b) {
    const float d = rd_f16(b), min = rd_f16(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32) {
        uint8_t sc, m;
        get_scale_min_k4(is + 0, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        get_scale_min_k4(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

static void dequant_q6_k(float *y, const uint8_t *b) {
    const float d = rd_f16(b + 208);
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; ++l) {
            int is = l / 16;
            const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l + 0] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
    }
}

typedef void (*QuantFn)(uint8_t *, const float *);
typedef void (*DequantFn)(float *, const uint8_t *);

static QuantFn quant_fn(DType t) {
    switch (t) {
    case DT_Q8_0:
        return quant_q8_0;
    case DT_Q4_0:
        return quant_q4_0;
    case DT_Q4_1:
        return quant_q4_1;
    case DT_Q5_0:
        return quant_q5_0;
    case DT_Q4_K:
        return quant_q4_k;
    case DT_Q5_K:
        return quant_q5_k;
    case DT_Q6_K:
        return quant_q6_k;
    default:
        return NULL;
    }
}

static DequantFn dequant_fn(DType t) {
    switch (t) {
    case DT_Q8_0:
        return dequant_q8_0;
    case DT_Q4_0:
        return dequant_q4_0;
    case DT_Q4_1:
        return dequant_q4_1;
    case DT_Q5_0:
        return dequant_q5_0;
    case DT_Q4_K:
        return dequant_q4_k;
    case DT_Q5_K:
        return dequant_q5_k;
    case DT_Q6_K:
        return dequant_q6_k;
    default:
        return NULL;
    }
}

void quant_row(DType t, void *dst, const float *src, int64_t cols) {
    QuantFn f = quant_fn(t);
    if (!f) return;
    const int64_t B = dtype_block(t);
    const size_t bb = dtype_block_bytes(t);
    uint8_t *y = dst;
    for (int64_t c = 0; c < cols; c += B, y += bb) {
        if (cols - c >= B) f(y, src + c);
        else { /* the short last block, zero-padded */ float pad[QK_K] = {0};
            memcpy(pad, src + c, sizeof(float) * (size_t)(cols - c));
            f(y, pad);
        }
    }
}

void dequant_row(DType t, float *dst, const void *src, int64_t cols) {
    DequantFn f = dequant_fn(t);
    if (!f) return;
    const int64_t B = dtype_block(t);
    const size_t bb = dtype_block_bytes(t);
    const uint8_t *b = src;
    for (int64_t c = 0; c < cols; c += B, b += bb) {
        if (cols - c >= B) f(dst + c, b);
        else {
            float pad[QK_K];
            f(pad, b);
            memcpy(dst + c, pad, sizeof(float) * (size_t)(cols - c));
        }
    }
}
