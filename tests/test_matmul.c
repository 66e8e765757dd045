/* test_matmul — k_matmul against a slow double-precision reference, and batch
   invariance of the kernel itself: every token's row of an n-token call is
   bit-identical to the same token computed alone, for n = 1..40, on shapes that
   reach every path (odd column counts, a last block of a few rows, a matrix above
   the size that is taken in chunks with prefetching, a last chunk shorter than the
   others), with f32 and bf16 weights and 1 and 2 threads. And a matrix whose sources
   are of different block types (k_pack_blocks): each source's rows bit-identical to
   that source multiplied alone. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((next() >> 40) * (2.0 / 16777216.0) - 1.0); } /* uniform in [-1, 1) */
static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void check_shape(WType wt, int rows, int cols, int max_n) {
    size_t esize = wt == WT_F32 ? 4 : 2, nw = (size_t)rows * cols;
    void *w = malloc(nw * esize);
    float *wf = malloc(nw * sizeof(float)); /* the weights as the kernel sees them */
    for (size_t i = 0; i < nw; i++) {
        float v = frand() * 0.1f;
        if (wt == WT_F32) ((float *)w)[i] = wf[i] = v;
        else {
            uint32_t u;
            memcpy(&u, &v, 4);
            ((uint16_t *)w)[i] = (uint16_t)(u >> 16);
            wf[i] = bf16_value((uint16_t)(u >> 16));
        }
    }
    void *packed = aligned_alloc(64, (k_packed_bytes(wt, rows, cols) + 63) / 64 * 64);
    const void *src[1] = {w};
    int src_rows[1] = {rows};
    k_pack(packed, wt, cols, 1, src, src_rows);
    float *x = malloc(sizeof(float) * max_n * cols), *y = malloc(sizeof(float) * max_n * rows);
    float *alone = malloc(sizeof(float) * max_n * rows);
    for (int i = 0; i < max_n * cols; i++) x[i] = frand();
    for (int t = 0; t < max_n; t++) { /* each token alone, poisoned output first */
        memset(alone + (size_t)t * rows, 0xff, sizeof(float) * rows);
        k_matmul(alone + (size_t)t * rows, x + (size_t)t * cols, packed, wt, 1, cols, rows);
    }
    double worst = 0;
    for (int t = 0; t < max_n; t++)
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                ref += (double)x[(size_t)t * cols + c] * wf[(size_t)r * cols + c];
                mag += fabs((double)x[(size_t)t * cols + c] * wf[(size_t)r * cols + c]);
            }
            double err = fabs(alone[(size_t)t * rows + r] - ref) / (mag + 1e-30);
            if (!(err <= worst)) worst = err; /* NaN counts as worst */
        }
    CHECK(worst < 1e-5, "%s %dx%d: one token vs double reference, worst error %g of Σ|terms|",
          wt == WT_F32 ? "f32" : "bf16", rows, cols, worst);
    int differ = 0;
    for (int n = 2; n <= max_n; n++) {
        memset(y, 0xff, sizeof(float) * n * rows);
        k_matmul(y, x, packed, wt, n, cols, rows);
        if (memcmp(y, alone, sizeof(float) * n * rows)) differ++;
    }
    CHECK(differ == 0, "%s %dx%d, %d threads: %d of %d batch sizes give some token other bits than alone",
          wt == WT_F32 ? "f32" : "bf16", rows, cols, k_threads(), differ, max_n - 1);
    free(w), free(wf), free(packed), free(x), free(y), free(alone);
}

/* q|k|v as Q8_0, Q4_K, Q4_0 (random bytes; sane f16 scales) against each alone */
static void check_mixed(int n) {
    enum { COLS = 256 };
    static const WType types[3] = {WT_Q8_0, WT_Q4_K, WT_Q4_0};
    static const size_t row_bytes[3] = {8 * 34, 144, 8 * 18}; /* COLS elements of each */
    static const int rows[3] = {24, 9, 17}, scale_at[3][2] = {{0, -1}, {0, 2}, {0, -1}};
    static const int block[3] = {34, 144, 18};
    uint8_t *src[3];
    for (int s = 0; s < 3; s++) {
        src[s] = malloc(row_bytes[s] * rows[s]);
        for (size_t i = 0; i < row_bytes[s] * rows[s]; i++) src[s][i] = (uint8_t)(next() >> 24);
        for (size_t b = 0; b < row_bytes[s] * rows[s] / block[s]; b++)
            for (int k = 0; k < 2 && scale_at[s][k] >= 0; k++) { /* f16 0x1c00 + a little: about 2^-8 */
                src[s][b * block[s] + scale_at[s][k]] = (uint8_t)next();
                src[s][b * block[s] + scale_at[s][k] + 1] = 0x1c;
            }
    }
    float *x = malloc(sizeof(float) * n * COLS), *y = malloc(sizeof(float) * n * 50),
          *one = malloc(sizeof(float) * n * 24);
    for (int i = 0; i < n * COLS; i++) x[i] = frand();
    const void *const srcs[3] = {src[0], src[1], src[2]};
    size_t pb = (k_packed_bytes_blocks(COLS, 3, rows, types) + 63) & ~(size_t)63, ab = 0;
    for (int s = 0; s < 3; s++) {
        size_t b = k_packed_bytes(types[s], rows[s], COLS);
        ab = b > ab ? b : ab;
    }
    unsigned char *packed = aligned_alloc(64, pb), *alone = aligned_alloc(64, (ab + 63) & ~(size_t)63);
    k_pack_blocks(packed, COLS, 3, srcs, rows, types);
    k_matmul(y, x, packed, WT_Q8_0, n, COLS, 50);
    int bad = 0;
    for (int s = 0, r0 = 0; s < 3; r0 += rows[s++]) {
        k_pack(alone, types[s], COLS, 1, &srcs[s], &rows[s]);
        k_matmul(one, x, alone, types[s], n, COLS, rows[s]);
        for (int t = 0; t < n; t++) bad += memcmp(y + t * 50 + r0, one + t * rows[s], sizeof(float) * rows[s]) != 0;
    }
    CHECK(bad == 0, "mixed block types, %d tokens: %d rows of a source differ from it alone", n, bad);
    for (int s = 0; s < 3; s++) free(src[s]);
    free(x), free(y), free(one), free(packed), free(alone);
}

int main(void) {
    /* rows × cols: small (cached) ones with partial panels and blocks, odd columns;
       big ones (over 1 MiB) that are chunked, one with a short last chunk and an odd
       column count, one with a 1-panel last block */
    static const int shapes[][2] = {{1, 1},    {17, 3},     {64, 64},   {130, 77},  {300, 255},
                                    {512, 64}, {1000, 333}, {700, 769}, {2049, 771}};
    for (int threads = 1; threads <= 2; threads++) {
        if (k_init(threads)) {
            CHECK(0, "k_init(%d)", threads);
            continue;
        }
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            for (int wt = WT_F32; wt <= WT_BF16; wt++)
                check_shape((WType)wt, shapes[i][0], shapes[i][1], shapes[i][0] * shapes[i][1] > 500000 ? 26 : 40);
        for (int n = 1; n <= 5; n += 2) check_mixed(n);
    }
    return check_done("matmul");
}
