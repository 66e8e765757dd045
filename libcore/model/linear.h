/* linear.h — what the layers above model/ compute with the backend: a matrix packed for
   its product (f32, or the 8-bit draft form), the model's final norm and LM head over
   rows, and the element-wise steps of a ResBlock. heads/ calls these, never a kernel, so
   a device backend implements them behind the same calls (a Linear's bytes then live in
   the device's buffer); on the CPU they are the kernels' own calls, the same bits. */
#ifndef PD_LINEAR_H
#define PD_LINEAR_H
#include <stddef.h>

#include "model/model.h"

typedef enum {
    LINEAR_F32, /* exact: k_matmul's fixed reduction order, batch-invariant */
    LINEAR_Q8   /* approximate, per-row scaled 8 bits: drafts only; cols ≤ 4096 */
} LinearForm;

/* W [rows][cols] (row-major, as Hugging Face stores Linear) in the backend's layout */
typedef struct {
    LinearForm form;
    int rows, cols;
    void *p; /* linear_bytes of packed data; NULL: none */
} Linear;

/* bytes a packed [rows][cols] matrix of this form takes (64-aligned memory); 0 when the
   form cannot hold it (LINEAR_Q8 past 4096 columns) */
size_t linear_bytes(LinearForm f, int rows, int cols);
/* packs w into mem (linear_bytes of it, 64-aligned; mem may be L->p: a repack) and sets
   L; -1 + message when the form cannot hold the shape */
int linear_pack(Linear *L, void *mem, LinearForm f, const float *w, int rows, int cols);
/* y[n][rows] = x[n][cols] · W^T; a row's result never depends on n */
void linear_apply(const Linear *L, float *y, const float *x, int n);

/* y[n][dim] = the model's final RMSNorm of x[n][dim] (its gain and eps) */
void model_final_norm(const Model *m, float *y, const float *x, int n);
/* logits[n][vocab] = x[n][dim] · lm_head^T, the model's own packed LM head */
void model_lm_head(const Model *m, float *logits, const float *x, int n);
/* row v of the LM head as f32 (whatever the model stores): dim floats */
void model_lm_head_row(const Model *m, int v, float *out);
/* row r of any of the model's matrices as f32 (whatever it stores): w->cols floats */
void mat_row_f32(const Mat *w, int r, float *out);

/* y[i] += x[i];  y[i] = silu(x[i]) = x[i] / (1 + e^-x[i]): the backend's bits */
void vec_add(float *y, const float *x, size_t n);
void vec_silu(float *y, const float *x, size_t n);

/* the backend as a whole, for the tools: start its n ≥ 1 threads (the caller's counts
   as one); what --version names (backends compiled in, the CPU features the kernels
   were built for); the read-bandwidth probe (n floats read by every thread, their sum) */
int model_threads(int n);
/* the device the runners made from now on run on ("cpu", "cuemu": model_backends());
   -1 + message when it is not compiled in */
int model_device(const char *kind);
const char *model_device_kind(void);
const char *model_backends(void);
const char *model_cpu_features(void);
double model_stream_sum(const float *x, size_t n);
/* the model_device's own copy bandwidth, bytes read plus bytes written per second (a
   GPU's HBM roofline): the best of passes device-to-device copies of bytes; -1 + message
   when the device cannot hold two such buffers */
double model_device_copy_gbs(size_t bytes, int passes);

#endif
