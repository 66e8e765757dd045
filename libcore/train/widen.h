/* widen.h — embed a small Llama function-preservingly in a bigger Llama shape
   (DESIGN.md §7): the wide model's greedy output is the small one's, its cost is the
   big shape's. Used to measure speed on big shapes without a big trained model.

   How (s = sqrt(D/d), the wide/real residual widths):
   - the residual stream carries the real one × s in dims [0, d) and exact zeros in
     [d, D): RMS over D of the scaled stream equals RMS over d of the real one, so
     eps stays exact. Norm gains are divided by s, branch outputs multiplied by s;
   - real q head h sits in a wide head whose kv head holds h's real kv head; real
     RoPE pair i of a head sits at wide pair i·(HD/hd), which has the same frequency;
     real q rows are scaled by sqrt(HD/hd) to turn 1/sqrt(HD) into 1/sqrt(hd);
   - real FFN units come first; real layers are spread over the wide ones, the rest
     are identities (o_proj and down_proj zero);
   - every weight that cannot reach the stream is random (fixed seed), so the wide
     model costs what a real one would; everything that writes into the stream from
     an extra head, unit, dim or layer is zero. */
#ifndef PD_WIDEN_H
#define PD_WIDEN_H
#include "heads/exit_heads.h"
#include "model/checkpoint.h"

typedef struct {
    const char *name;
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim;
    const char *about;
} WidenPreset;

extern const WidenPreset widen_presets[];
extern const int widen_n_presets;

/* NULL + message naming the known presets */
const WidenPreset *widen_preset(const char *name);
/* the preset's shape; vocabulary, context, eps, theta and tying come from src */
Config widen_shape(const Config *src, const WidenPreset *p);
/* 0 when dst can hold src function-preservingly; else -1 + why ("what: ...") */
int widen_check(const Config *src, const Config *dst, const char *what);

/* the whole wide model as an f32 checkpoint (with src's tokenizer); progress may be
   NULL. out is empty on failure. */
int widen_checkpoint(const Checkpoint *src, const Config *dst, uint64_t seed, Checkpoint *out, Progress *progress);
/* the same model written straight to a paradec model file, one tensor built at a
   time: memory is the output's size (bf16: half of widen_checkpoint's f32). The file
   is byte for byte what ck_write_model writes for widen_checkpoint's result. */
int widen_write_model(const Checkpoint *src, const Config *dst, uint64_t seed, const char *path, DType dt,
                      Progress *progress);

/* exit heads trained for small_model, carried over to wide_model (written by widen
   from it): each head moves to the wide layer right after the one that runs its real
   layer, T into the top-left corner of a D×D matrix, so its logits are unchanged */
int widen_heads(const char *heads_in, const char *small_model, const char *wide_model, const char *heads_out);
/* Medusa heads trained for small_model, carried over to wide_model: W into the
   top-left corner, b into the first dims, input_scale × s (the wide normed state is
   the real one / s), an own lm_head widened as the model's (real rows × s); their
   logits are unchanged, their held-out records travel along */
int widen_medusa(const char *heads_in, const char *small_model, const char *wide_model, const char *heads_out);

#endif
