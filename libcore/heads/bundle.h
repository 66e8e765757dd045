/* bundle.h — one file with a model, its tokenizer and any number of head sets
   (`bin/pack`). A bundle is a model file (paradec.kind `bundle`) whose model tensors and
   metadata keep their names; head set i adds its tensors and metadata under the prefix
   `heads.{i}/` and is listed in paradec.bundle, a JSON array of {"prefix", "kind"}.
   model_load reads a bundle as the model; heads_load and medusa_load take the first
   set of their kind from it. */
#ifndef PD_BUNDLE_H
#define PD_BUNDLE_H
#include <stdio.h>

#include "formats/tensorfile.h"

/* tf as a file of this kind: itself when it is no bundle, else a view of the first
   head set of the kind inside (refused, naming what is there, when there is none).
   *view is always to be tf_close'd; it shares tf's tensor data */
int bundle_view(const TensorFile *tf, const char *kind, TensorFile *view, const char *what);
/* does tf, a bundle, hold a head set of this kind? (0 for any other file) */
int bundle_has(const TensorFile *tf, const char *kind);
/* writes a bundle of the model and the head files; every set must have been trained
   for this model (refused naming both digests); atomic */
int bundle_write(const char *out, const char *model, const char *const *heads, int n_heads);
/* what a bundle (or any paradec file) holds: kinds, tensors, sizes, training facts */
int bundle_list(const char *path, FILE *f);

#endif
