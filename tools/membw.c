/* membw — the memory read bandwidth the benchmarks compare against: every thread
   streams an array larger than the last-level cache; the best of several passes.
   bin/membw [-t THREADS] [--mib SIZE] prints GB/s. With -d KIND other than cpu: the
   device's copy bandwidth instead (bytes read + written, a GPU's HBM roofline). */
#include "tool.h"

int main(int argc, char **argv) {
    tool_name = "membw";
    long threads = 1, mib = 1024;
    const char *dev = NULL;
    Flag t[] = {
        DEVICE_FLAG(&dev),
        {"-t, --threads", "N", "1", "threads streaming", F_LONG(&threads, 1, 64)},
        {"--mib", "SIZE", "1024", "MiB of the array streamed (larger than the last-level cache)",
         F_LONG(&mib, 64, 1 << 16)},
    };
    flags_parse(t, N_FLAGS(t), argc, argv, NULL, 0, "[-t THREADS] [--mib SIZE]",
                "prints the read bandwidth in GB/s.\nmemory: about --mib MiB, the array it streams.\n");
    device_arg(dev);
    if (strcmp(model_device_kind(), "cpu")) {
        double g = model_device_copy_gbs((size_t)mib << 20, 10);
        if (g < 0) die_lib();
        printf("%.2f\n", g);
        fprintf(stderr, "membw: %s copy of %ld MiB, read + written, best of 10\n", model_device_kind(), mib);
        return 0;
    }
    size_t n = (size_t)mib << 18; /* floats */
    Arena a;                      /* the same kind of memory the packed weights live in (huge pages) */
    if (arena_init(&a, n * sizeof(float))) die_lib();
    float *x = arena_push(&a, n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7); /* touch every page */
    if (model_threads((int)threads)) die("cannot start %ld threads", threads);
    double best = 1e30, sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = pd_now();
        sink += model_stream_sum(x, n);
        double dt = pd_now() - t0;
        best = dt < best ? dt : best;
    }
    printf("%.2f\n", n * sizeof(float) / best / 1e9);
    fprintf(stderr, "membw: %ld MiB, %ld threads, best of 5 passes (checksum %g)\n", mib, threads, sink);
    arena_free(&a);
    return 0;
}
