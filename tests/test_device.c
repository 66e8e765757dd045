/* test_device — the device interface on the CPU backend: uploads, downloads and copies
   at offsets (and refused past a buffer's end), wrapped host memory without a copy,
   events, strided column moves, argmax / softmax / top-k over rows against plain loops
   written here, and a captured graph replayed with new per-step data (the row count
   and the rows in buffers) giving the same bits as the same calls made directly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "device.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static unsigned urand(unsigned n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)((rng >> 33) % n);
}
static float frand(void) { return (float)urand(1u << 24) / (1u << 20) - 8.0f; }

enum { R = 7, C = 133, K = 5 };

/* the reference: the largest value, lowest index among equals */
static int ref_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void memory(Device *d) {
    DevBuf a, b;
    CHECK(dev_alloc(d, 1000, &a) == 0 && dev_alloc(d, 1000, &b) == 0, "%s", dev_errmsg());
    unsigned char src[300], got[300], zero[1000] = {0}, all[1000];
    for (int i = 0; i < 300; i++) src[i] = (unsigned char)(i * 7 + 1);
    CHECK(dev_download(d, all, a, 1000) == 0 && !memcmp(all, zero, 1000), "a fresh buffer is not zeroed");
    CHECK(dev_upload(d, dbuf_at(a, 100), src, 300) == 0, "%s", dev_errmsg());
    CHECK(dev_copy(d, dbuf_at(b, 650), dbuf_at(a, 100), 300) == 0, "%s", dev_errmsg());
    CHECK(dev_download(d, got, dbuf_at(b, 650), 300) == 0 && !memcmp(got, src, 300), "copy at offsets");
    CHECK(dev_download(d, all, b, 1000) == 0 && !memcmp(all, zero, 650) && !memcmp(all + 950, zero, 50),
          "a copy wrote outside its range");
    CHECK(dbuf_bytes(dbuf_at(b, 650)) == 350, "dbuf_bytes %zu", dbuf_bytes(dbuf_at(b, 650)));
    CHECK(dev_upload(d, dbuf_at(a, 701), src, 300) == -1 && strstr(dev_errmsg(), "overrun"), "upload past the end: %s",
          dev_errmsg());
    CHECK(dev_copy(d, b, dbuf_at(a, 999), 2) == -1, "copy from past the end accepted");
    CHECK(dev_download(d, got, dbuf_at(a, 1001), 0) == -1, "an offset past the end accepted");
    /* wrapped memory is the caller's bytes on the CPU; a GPU's (and cuemu's) is a copy */
    float host[64], back[64];
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    DevBuf w;
    int cpu = !strcmp(dev_kind(d), "cpu");
    CHECK(dev_wrap(d, host, sizeof host, &w) == 0, "%s", dev_errmsg());
    CHECK((dev_ptr(d, dbuf_at(w, 8)) == (void *)(host + 2)) == cpu,
          "wrapped buffer: a copy on the CPU, or not one elsewhere");
    CHECK(dev_download(d, back, w, sizeof back) == 0 && !memcmp(back, host, sizeof back), "wrapped bytes differ");
    /* the host may touch the CPU's memory, not cuemu's (a GPU's) */
    CHECK(dev_host(d, dbuf_at(w, 8)) == (cpu ? (void *)(host + 2) : NULL), "dev_host on %s", dev_kind(d));
    float nine = 9;
    dev_upload(d, dbuf_at(w, 4 * sizeof(float)), &nine, sizeof nine);
    CHECK((host[4] == 9) == cpu, "an upload into wrapped memory: in the caller's bytes on the CPU only");
    dev_free(d, w), dev_free(d, a), dev_free(d, b);
}

static void events(Device *d, Device *d2) {
    DevEvent *e = dev_event_new(d);
    CHECK(dev_event_done(e) == -1, "an event never recorded reads as done");
    CHECK(dev_wait(d2, e) == -1, "waiting on an event never recorded accepted");
    DevBuf a, b;
    dev_alloc(d, 64, &a), dev_alloc(d2, 64, &b);
    int v = 42, got = 0;
    dev_upload(d, a, &v, sizeof v);
    CHECK(dev_record(d, e) == 0 && dev_event_done(e) == 1, "recorded event not done on the CPU");
    CHECK(dev_wait(d2, e) == 0, "%s", dev_errmsg());
    dev_copy(d2, b, a, sizeof v); /* the second stream reads what the first wrote before the event */
    dev_download(d2, &got, b, sizeof got);
    CHECK(got == 42, "second stream after the event read %d", got);
    dev_free(d, a), dev_free(d2, b), dev_event_free(e);
}

/* the rows ops once directly, against the loops above */
static void rows(Device *d) {
    DevBuf x, ids, p, y, cnt;
    dev_alloc(d, sizeof(float) * R * C, &x), dev_alloc(d, sizeof(int32_t) * R * K, &ids);
    dev_alloc(d, sizeof(float) * R * K, &p), dev_alloc(d, sizeof(float) * R * C, &y);
    dev_alloc(d, sizeof(int32_t), &cnt);
    float h[R][C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) h[r][c] = frand();
    h[2][17] = h[2][90] = 100; /* a tie: the lower index wins */
    h[3][5] = h[3][6] = h[3][7] = 50;
    int32_t n = R, am[R], tk[R][K];
    float pk[R][K], sm[R][C];
    dev_upload(d, x, h, sizeof h), dev_upload(d, cnt, &n, sizeof n);
    CHECK(dev_argmax_rows(d, ids, x, cnt, R, C) == 0, "%s", dev_errmsg());
    dev_download(d, am, ids, sizeof am);
    int ok = 1;
    for (int r = 0; r < R; r++) ok &= am[r] == ref_argmax(h[r], C);
    CHECK(ok && am[2] == 17, "argmax rows differ from the reference (row 2: %d)", am[2]);
    CHECK(dev_softmax_rows(d, y, x, cnt, R, C) == 0, "%s", dev_errmsg());
    dev_download(d, sm, y, sizeof sm);
    ok = 1;
    for (int r = 0; r < R; r++) {
        float row[C];
        memcpy(row, h[r], sizeof row);
        k_softmax(row, C);
        ok &= !memcmp(row, sm[r], sizeof row);
        double s = 0;
        for (int c = 0; c < C; c++) s += sm[r][c];
        ok &= fabs(s - 1) < 1e-5;
    }
    CHECK(ok, "softmax rows are not k_softmax's bits, or do not sum to 1");
    CHECK(dev_topk_rows(d, ids, p, x, cnt, R, C, K) == 0, "%s", dev_errmsg());
    dev_download(d, tk, ids, sizeof tk), dev_download(d, pk, p, sizeof pk);
    ok = 1;
    for (int r = 0; r < R; r++) { /* the reference: repeated selection of the largest not yet taken */
        char taken[C] = {0};
        for (int j = 0; j < K; j++) {
            int b = -1;
            for (int c = 0; c < C; c++)
                if (!taken[c] && (b < 0 || sm[r][c] > sm[r][b])) b = c;
            taken[b] = 1;
            ok &= tk[r][j] == b && pk[r][j] == sm[r][b];
        }
    }
    CHECK(ok, "top-k rows differ from repeated selection");
    CHECK(tk[3][0] == 5 && tk[3][1] == 6 && tk[3][2] == 7, "top-k ties not in index order: %d %d %d", tk[3][0],
          tk[3][1], tk[3][2]);
    CHECK(dev_topk_rows(d, ids, p, x, cnt, R, C, C + 1) == -1, "k past the row accepted");
    CHECK(dev_argmax_rows(d, ids, x, cnt, R + 1, C) == -1, "rows past the buffer accepted");
    dev_free(d, x), dev_free(d, ids), dev_free(d, p), dev_free(d, y), dev_free(d, cnt);
}

/* one step of a toy pipeline: the step's rows and count arrive in buffers; copy the rows
   aside, move some strided columns, argmax, top-k, softmax */
typedef struct {
    DevBuf x, x2, ids, tk, tp, sm, cnt, list, nmov;
} Step;

static int step_calls(Device *d, const Step *s) {
    return dev_copy(d, s->x2, s->x, sizeof(float) * R * C) || dev_move_cols(d, s->x2, s->list, s->nmov, 4, 3, C) ||
           dev_argmax_rows(d, s->ids, s->x2, s->cnt, R, C) || dev_topk_rows(d, s->tk, s->tp, s->x2, s->cnt, R, C, K) ||
           dev_softmax_rows(d, s->sm, s->x2, s->cnt, R, C);
}

typedef struct {
    int32_t ids[R], tk[R * K];
    float tp[R * K], sm[R * C], x2[R * C];
} StepOut;

static void step_out(Device *d, const Step *s, StepOut *o) {
    memset(o, 0, sizeof *o);
    dev_download(d, o->ids, s->ids, sizeof o->ids), dev_download(d, o->tk, s->tk, sizeof o->tk);
    dev_download(d, o->tp, s->tp, sizeof o->tp), dev_download(d, o->sm, s->sm, sizeof o->sm);
    dev_download(d, o->x2, s->x2, sizeof o->x2);
}

static void new_step(Device *d, const Step *s, int step) {
    float h[R * C];
    for (int i = 0; i < R * C; i++) h[i] = frand();
    int32_t n = 1 + step % R, moves = step % 5;
    int64_t list[8];
    for (int i = 0; i < 8; i++) list[i] = urand(C); /* column starts in row 0 .. 4 rows down stay inside */
    dev_upload(d, s->x, h, sizeof h), dev_upload(d, s->cnt, &n, sizeof n);
    dev_upload(d, s->list, list, sizeof list), dev_upload(d, s->nmov, &moves, sizeof moves);
    /* outputs cleared, so a replay that skipped a call cannot pass on stale bits */
    static const unsigned char zero[sizeof(float) * R * C];
    dev_upload(d, s->ids, zero, sizeof(int32_t) * R), dev_upload(d, s->tk, zero, sizeof(int32_t) * R * K);
    dev_upload(d, s->tp, zero, sizeof(float) * R * K), dev_upload(d, s->sm, zero, sizeof zero);
}

static void graphs(Device *d) {
    Step s;
    DevBuf *all[] = {&s.x, &s.x2, &s.ids, &s.tk, &s.tp, &s.sm, &s.cnt, &s.list, &s.nmov};
    size_t sz[] = {4 * R * C, 4 * R * C, 4 * R, 4 * R * K, 4 * R * K, 4 * R * C, 4, 64, 4};
    for (int i = 0; i < 9; i++) dev_alloc(d, sz[i], all[i]);
    CHECK(dev_graph_begin(d) == 0, "%s", dev_errmsg());
    CHECK(dev_graph_begin(d) == -1, "a second capture accepted");
    CHECK(step_calls(d, &s) == 0, "%s", dev_errmsg());
    int32_t tmp;
    CHECK(dev_download(d, &tmp, s.cnt, 4) == -1, "a download while capturing accepted");
    DevGraph *g;
    CHECK(dev_graph_end(d, &g) == 0 && dev_graph_calls(g) == 5, "graph holds %d calls", dev_graph_calls(g));
    int same = 1, moved = 0;
    for (int step = 0; step < 12; step++) {
        StepOut direct, replay;
        uint64_t keep = rng;
        new_step(d, &s, step);
        step_calls(d, &s);
        step_out(d, &s, &direct);
        rng = keep; /* the same step's data again */
        new_step(d, &s, step);
        CHECK(dev_graph_replay(d, g) == 0, "%s", dev_errmsg());
        step_out(d, &s, &replay);
        same &= !memcmp(&direct, &replay, sizeof direct);
        float h[R * C];
        dev_download(d, h, s.x, sizeof h);
        moved |= memcmp(h, direct.x2, sizeof h) != 0;
        int n = 1 + step % R;
        for (int r = 0; r < n; r++) same &= direct.ids[r] == ref_argmax(direct.x2 + r * C, C);
        for (int r = n; r < R; r++) same &= direct.ids[r] == 0; /* rows past the count untouched */
    }
    CHECK(same, "a replayed graph with new per-step data differs from direct calls (or from the reference)");
    CHECK(moved, "the column moves never changed anything: the test would not see them skipped");
    dev_graph_free(g);
    for (int i = 0; i < 9; i++) dev_free(d, *all[i]);
}

/* slot moves against a plain reference, for each element size: a chain (each pair's
   source the next one's destination, as a kept path makes) and far pairs, rows strided */
static void moves(Device *d) {
    enum { COLS = 40, LEN = 5, N = 6 };
    for (int e = 1; e <= 4; e *= 2) {
        unsigned char h[COLS * LEN * 4], want[sizeof h], got[sizeof h];
        for (size_t i = 0; i < sizeof h; i++) h[i] = (unsigned char)urand(256);
        int64_t list[2 * N] = {3, 1, 5, 3, 7, 5, 30, 2, 39, 20, 20, 38}; /* {src, dst}, in order */
        int32_t n = N;
        memcpy(want, h, sizeof h);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < LEN; j++)
                memcpy(want + ((size_t)list[2 * i + 1] + (size_t)j * COLS) * e,
                       want + ((size_t)list[2 * i] + (size_t)j * COLS) * e, e);
        DevBuf b, l, c;
        dev_alloc(d, sizeof h, &b), dev_alloc(d, sizeof list, &l), dev_alloc(d, sizeof n, &c);
        dev_upload(d, b, h, sizeof h), dev_upload(d, l, list, sizeof list), dev_upload(d, c, &n, sizeof n);
        CHECK(dev_move_cols_elem(d, b, l, c, N, LEN, COLS, e) == 0, "%s", dev_errmsg());
        dev_download(d, got, b, sizeof got);
        CHECK(!memcmp(got, want, sizeof got), "%s: %d-byte column moves differ from the reference", dev_kind(d), e);
        dev_free(d, b), dev_free(d, l), dev_free(d, c);
    }
}

/* a graph's upload keeps the bytes as they were at capture */
static void captured_upload(Device *d) {
    DevBuf a;
    dev_alloc(d, 16, &a);
    int v = 7, got = 0;
    dev_graph_begin(d);
    dev_upload(d, a, &v, sizeof v);
    DevGraph *g;
    dev_graph_end(d, &g);
    dev_download(d, &got, a, sizeof got);
    CHECK(got == 0, "a captured upload ran at capture");
    v = 8;
    dev_graph_replay(d, g);
    dev_download(d, &got, a, sizeof got);
    CHECK(got == 7, "a replayed upload wrote %d", got);
    dev_graph_free(g), dev_free(d, a);
}

int main(void) {
    k_init(1);
    /* cuemu: the row ops are kernels/cuda/rows.cu's; cuda: the same on a GPU, where one is */
    static const char *kinds[] = {"cpu", "cuemu", "cuda"};
    for (int i = 0; i < 3; i++) {
        Device *d = dev_open(kinds[i]), *d2 = dev_open(kinds[i]);
        if (!d && !strcmp(kinds[i], "cuda")) {
            const char *e = dev_errmsg();
            CHECK(strstr(e, "not compiled in") || strstr(e, "no CUDA GPU"), "refusing cuda: %s", e);
            printf("SKIP device cuda: %s\n", e);
            break;
        }
        CHECK(d && d2, "%s", dev_errmsg());
        if (!d || !d2) break;
        CHECK(!strcmp(dev_kind(d), kinds[i]) && !strcmp(dev_kernels(d)->name, kinds[i]), "device %s says it is %s",
              kinds[i], dev_kind(d));
        memory(d);
        events(d, d2);
        rows(d);
        moves(d);
        graphs(d);
        captured_upload(d);
        dev_close(d), dev_close(d2);
    }
    return check_done("device");
}
