/* ops.c — the element-wise and per-row kernels: rmsnorm, rope, silu·mul, add,
   softmax, argmax. Reductions follow dot.h's order, so they are batch-invariant. */
#include <math.h>

#include "backend.h"
#include "dot.h"
#include "pool.h"

void k_rmsnorm(float *y, const float *x, const float *g, int n, int dim, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        float *yt = y + (size_t)t * dim;
        float ss = dot_f32(xt, xt, dim) / dim + eps;
        float s = 1.0f / sqrtf(ss);
        for (int i = 0; i < dim; i++) yt[i] = g[i] * (s * xt[i]);
    }
}

void k_rope(float *x, const int32_t *pos, int n, int n_heads, int hd, const float *cos_t,
            const float *sin_t) {
    int half = hd / 2;
    for (int t = 0; t < n; t++) {
        const float *c = cos_t + (size_t)pos[t] * half, *s = sin_t + (size_t)pos[t] * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = a * s[i] + b * c[i];
            }
        }
    }
}



void k_add(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

#ifdef __AVX512F__
/* e^x to about 1 ulp: x = n ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial for e^r,
   then 2^n by scalef. Our own, so every build computes the same bits. */
static inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-103.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.3981999507e-3f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

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
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, load_f32_or(x + i, n - i, -INFINITY));
    float m = _mm512_reduce_max_ps(mx);
    __m512 vm = _mm512_set1_ps(m);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        e = _mm512_maskz_mov_ps(k, e);
        _mm512_mask_storeu_ps(x + i, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    *max_out = m;
    return _mm512_reduce_add_ps(sum);
}
void k_silu_mul(float *a, const float *b, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(a + i);
        __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(a + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                                              _mm512_loadu_ps(b + i)));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(m, a + i);
        __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                                                      _mm512_maskz_loadu_ps(m, b + i)));
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
#else
float k_exp_sum(float *x, int n, float *max_out) {
    float mx = x[0], sum = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) sum += (x[i] = expf(x[i] - mx));
    *max_out = mx;
    return sum;
}

void k_silu_mul(float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

int k_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
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
