/* draftmodel.h — a draft model for speculative decoding, made from a model's own first
   L layers and its trained exit head at layer L (exit_heads.h). With the head's norm on,
       logits = E · T_L · (g ⊙ norm(h_L)),
   which a plain Llama model of L layers computes exactly: final_norm = g (the source's)
   and an untied lm_head = E·T_L [vocab][dim]. A head without the norm cannot be folded
   (the norm's 1/rms differs per position) and is refused. The draft keeps the source's
   tokenizer, so it shares the target's vocabulary by construction. */
#ifndef PD_DRAFTMODEL_H
#define PD_DRAFTMODEL_H
#include "heads/exit_heads.h"

/* writes the draft (kind model, its own digest, paradec.draft_of = the source model's
   digest, paradec.draft.layer = L) to out, weights in dt (DT_F32 or DT_BF16); refuses
   L outside 1..n_layers-1, no head at L, a head without the norm, heads of another model */
int draft_from_head(const char *model_path, const char *heads_path, int layer, const char *out, DType dt);

#endif
