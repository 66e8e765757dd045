/* ops.c — the element-wise and per-row kernels: rmsnorm, rope, silu·mul, add,
   softmax, argmax. Reductions follow dot.h's order, so they are batch-invariant. */
#include <math.h>

#include "backend.h"
#include "dot.h"

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

void k_silu_mul(float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

void k_add(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

float k_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
    return mx;
}

int k_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}
