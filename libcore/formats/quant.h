/* quant.h — GGUF's block types (tensorfile.h's DT_Q8_0 … DT_Q6_K) in plain C, a row at a
   time: ggml's reference quantizers and its dequantizers, float operation for float
   operation, so dequant_row gives gguf-py's gguf.quants.dequantize bit for bit and
   quant_row of Q8_0 / Q4_0 / Q4_1 / Q5_0 gives gguf-py's quantize bytes. The K types quantize
   by llama.cpp's make_qkx2_quants (Q4_K, Q5_K) and make_qx_quants (Q6_K) without an
   importance matrix. A row of cols elements is ceil(cols / block) blocks; a short last
   block is quantized as if padded with zeros, and dequant_row writes only cols floats. */
#ifndef PD_QUANT_FORMAT_H
#define PD_QUANT_FORMAT_H
#include <stdint.h>

#include "formats/tensorfile.h"

/* dst holds dtype_row_bytes(t, cols); src must be finite */
void quant_row(DType t, void *dst, const float *src, int64_t cols);
void dequant_row(DType t, float *dst, const void *src, int64_t cols);

float fp16_to_f32(uint16_t h); /* IEEE half → float, every case (subnormals, inf, NaN quieted) */
uint16_t f32_to_fp16(float f); /* round to nearest even, as F16C and numpy do */

#endif
