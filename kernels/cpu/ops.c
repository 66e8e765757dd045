/* ops.c — the element-wise and per-row kernels: rmsnorm, rope, silu·mul, add,
   softmax, argmax. Reductions follow dot.h's order, so they are batch-invariant. */
#include <math.h>

#include "backend.h"
#include "dot.h"
#include "exp.h"
#include "pool.h"

void k_rmsnorm(float *y, const float *x, const float *g, int n, int dim, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        float *yt = y + (size_t)t * dim;
        float ss = dot_f32(xt, xt, dim) / dim + eps;
        float s = 1.0f / sqrtf(ss);
        int i = 0;
#ifdef __AVX512F__
        for (__m512 vs = _mm512_set1_ps(s); i + 16 <= dim; i += 16)
            _mm512_storeu_ps(yt + i, _mm512_mul_ps(_mm512_loadu_ps(g + i), _mm512_mul_ps(vs, _mm512_loadu_ps(xt + i))));
#elif defined(PD_AVX2)
        for (__m256 vs = _mm256_set1_ps(s); i + 8 <= dim; i += 8)
            _mm256_storeu_ps(yt + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_mul_ps(vs, _mm256_loadu_ps(xt + i))));
#endif
        for (; i < dim; i++) yt[i] = g[i] * (s * xt[i]);
    }
}

/* x[i] = a c - b s and x[i + half] = a s + b c for a = x[i], b = x[i + half]: a vector
   computes x C + partner S with C = (c, c) and S = (-s, s), which rounds the same */
static void rope_row(float *v, int n_heads, int hd, const float *c, const float *s) {
    int half = hd / 2, i = 0, n = n_heads * hd;
#ifdef __AVX512F__
    if (16 % hd == 0) { /* whole heads in a vector: the partner is a lane permutation */
        _Alignas(64) float C[16], S[16];
        int idx[16];
        for (int l = 0; l < 16; l++) {
            int k = l % hd;
            C[l] = c[k % half], S[l] = k < half ? -s[k] : s[k - half], idx[l] = k < half ? l + half : l - half;
        }
        __m512 vc = _mm512_loadu_ps(C), vs = _mm512_loadu_ps(S);
        __m512i vi = _mm512_loadu_si512(idx);
        for (; i + 16 <= n; i += 16) {
            __m512 x = _mm512_loadu_ps(v + i);
            _mm512_storeu_ps(v + i,
                             _mm512_add_ps(_mm512_mul_ps(x, vc), _mm512_mul_ps(_mm512_permutexvar_ps(vi, x), vs)));
        }
    } else if (half % 16 == 0) { /* the partner is the vector half a head away */
        for (int h = 0; h < n_heads; h++, i += hd)
            for (int k = 0; k < half; k += 16) {
                __m512 a = _mm512_loadu_ps(v + i + k), b = _mm512_loadu_ps(v + i + k + half);
                __m512 vc = _mm512_loadu_ps(c + k), vs = _mm512_loadu_ps(s + k);
                _mm512_storeu_ps(v + i + k, _mm512_sub_ps(_mm512_mul_ps(a, vc), _mm512_mul_ps(b, vs)));
                _mm512_storeu_ps(v + i + k + half, _mm512_add_ps(_mm512_mul_ps(a, vs), _mm512_mul_ps(b, vc)));
            }
    }
#endif
    for (; i < n; i += hd)
        for (int k = 0; k < half; k++) {
            float a = v[i + k], b = v[i + k + half];
            v[i + k] = a * c[k] - b * s[k];
            v[i + k + half] = a * s[k] + b * c[k];
        }
}

void k_rope(float *x, size_t stride, const int32_t *pos, int n, int n_heads, int hd, const float *cos_t,
            const float *sin_t) {
    int half = hd / 2;
    for (int t = 0; t < n; t++)
        rope_row(x + (size_t)t * stride, n_heads, hd, cos_t + (size_t)pos[t] * half, sin_t + (size_t)pos[t] * half);
}

void k_add(float *y, const float *x, size_t n) {
    size_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
#elif defined(PD_AVX2)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] += x[i];
}

#ifdef __AVX512F__
float k_softmax(float *x, int n) {
    float m, inv = 1.0f / k_exp_sum(x, n, &m);
    __m512 vinv = _mm512_set1_ps(inv);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vinv));
    }
    return m;
}

float k_exp_sum(float *x, int n, float *max_out) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, load_f32_or(x + i, n - i, -INFINITY));
    *max_out = _mm512_reduce_max_ps(mx);
    return exp_sum(x, n, *max_out);
}
static inline __m512 silu_ps(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
void k_silu_mul(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m,
                              _mm512_mul_ps(silu_ps(_mm512_maskz_loadu_ps(m, a + i)), _mm512_maskz_loadu_ps(m, b + i)));
    }
}
void k_silu(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, silu_ps(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* the lowest index among equal maxima: the vector max first, then the first lane
   holding it */
int k_argmax(const float *x, int n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, load_f32_or(x + i, n - i, -INFINITY));
    float m = _mm512_reduce_max_ps(mx);
    __m512 vm = _mm512_set1_ps(m);
    for (int i = 0; i < n; i += 16) {
        __mmask16 hit = _mm512_cmpeq_ps_mask(load_f32_or(x + i, n - i, -INFINITY), vm);
        if (hit) return i + __builtin_ctz(hit);
    }
    return 0; /* all NaN */
}
#elif defined(PD_AVX2)
/* the 16-lane maximum of x, lanes past n at -inf */
static float max16(const float *x, int n) {
    __m256 lo = _mm256_set1_ps(-INFINITY), hi = lo;
    for (int i = 0; i < n; i += 16) {
        lo = _mm256_max_ps(lo, load8_or(x + i, n - i, -INFINITY));
        hi = _mm256_max_ps(hi, load8_or(x + i + 8, n - i - 8, -INFINITY));
    }
    return hmax2(lo, hi);
}
float k_exp_sum(float *x, int n, float *max_out) {
    *max_out = max16(x, n);
    return exp_sum(x, n, *max_out);
}
float k_softmax(float *x, int n) {
    float m, inv = 1.0f / k_exp_sum(x, n, &m);
    int i = 0;
    for (__m256 v = _mm256_set1_ps(inv); i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), v));
    for (; i < n; i++) x[i] *= inv;
    return m;
}
static inline __m256 silu8(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
void k_silu_mul(float *y, const float *a, const float *b, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(a + i)), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] / (1.0f + exp1(0.0f - a[i])) * b[i];
}
void k_silu(float *y, const float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = x[i] / (1.0f + exp1(0.0f - x[i]));
}
int k_argmax(const float *x, int n) {
    __m256 vm = _mm256_set1_ps(max16(x, n));
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vm, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; i++)
        if (x[i] == vm[0]) return i;
    return 0;
}
#else
/* the spec: the vector paths' lanes one at a time */
static float max16(const float *x, int n) {
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = -INFINITY;
    for (int i = 0; i < n; i++) lane[i % 16] = max1(lane[i % 16], x[i]);
    return tree_max16(lane);
}
float k_exp_sum(float *x, int n, float *max_out) {
    *max_out = max16(x, n);
    return exp_sum(x, n, *max_out);
}

void k_silu_mul(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] / (1.0f + exp1(0.0f - a[i])) * b[i];
}
void k_silu(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + exp1(0.0f - x[i]));
}

/* the lowest index holding the maximum; 0 when that is NaN */
int k_argmax(const float *x, int n) {
    float m = max16(x, n);
    for (int i = 0; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

float k_softmax(float *x, int n) {
    float mx, inv = 1.0f / k_exp_sum(x, n, &mx);
    for (int i = 0; i < n; i++) x[i] *= inv;
    return mx;
}
#endif

typedef struct {
    const float *x;
    size_t per;       /* floats a chunk */
    double sums[256]; /* one per chunk */
} StreamJob;

static void stream_chunk(void *ctx, int b, int e) {
    StreamJob *j = ctx;
    for (int c = b; c < e; c++) {
        const float *x = j->x + (size_t)c * j->per;
#ifdef __AVX512F__
        /* eight independent sums over 512 bytes an iteration: as many loads in flight
           as the matmul keeps, so the probe is not slower than the thing it measures */
        __m512 a[8];
        for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_ps();
        for (size_t i = 0; i + 128 <= j->per; i += 128)
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) a[k] = _mm512_add_ps(a[k], _mm512_loadu_ps(x + i + 16 * k));
        for (int k = 1; k < 8; k++) a[0] = _mm512_add_ps(a[0], a[k]);
        j->sums[c] = hsum(a[0]);
#elif defined(PD_AVX2)
        __m256 a[8];
        for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
        for (size_t i = 0; i + 64 <= j->per; i += 64)
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) a[k] = _mm256_add_ps(a[k], _mm256_loadu_ps(x + i + 8 * k));
        for (int k = 2; k < 8; k++) a[k % 2] = _mm256_add_ps(a[k % 2], a[k]);
        j->sums[c] = hsum2(a[0], a[1]);
#else
        double s = 0;
        for (size_t i = 0; i < j->per; i++) s += x[i];
        j->sums[c] = s;
#endif
    }
}

double k_stream_sum(const float *x, size_t n) {
    StreamJob j = {x, (n / 256) & ~(size_t)127, {0}};
    pool_run(stream_chunk, &j, 256, 1, 1);
    double s = 0;
    for (int c = 0; c < 256; c++) s += j.sums[c];
    return s;
}

/* ---- whole-batch forms: one call per layer, each row the per-row kernel's bits ---- */

void k_add_rows(float *y, size_t stride, const float *x, int n, int cols) {
    for (int i = 0; i < n; i++) k_add(y + (size_t)i * stride, x, (size_t)cols);
}

void k_silu_mul_rows(float *y, const float *gu, int n, int cols) {
    for (int i = 0; i < n; i++) {
        const float *g = gu + (size_t)i * 2 * cols;
        k_silu_mul(y + (size_t)i * cols, g, g + cols, (size_t)cols);
    }
}

void k_kv_write(float *k, float *v, size_t block_stride, int block_size, int kv_dim, const int *const *table,
                const int32_t *slot, const float *src, size_t src_stride, size_t v_off, int n) {
    for (int i = 0; i < n; i++) {
        const float *sk = src + (size_t)i * src_stride, *sv = sk + v_off;
        size_t b = (size_t)table[i][slot[i] / block_size] * block_stride + (size_t)(slot[i] % block_size);
        for (int d = 0; d < kv_dim; d++) {
            k[b + (size_t)d * block_size] = sk[d];
            v[b + (size_t)d * block_size] = sv[d];
        }
    }
}
