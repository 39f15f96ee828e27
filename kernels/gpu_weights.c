/* gpu_weights.c - how the CUDA backend holds each weight type, as plain facts both builds know:
 * `kvchat info` and the load-time note name them, and the backend sizes its copies with them.
 * The types its kernels decode (kernels/quant_blocks.h) stay as the file stores them, each row
 * padded to 16 bytes for aligned loads; the others are converted to f16 at load. */
#include "kernels/backend.h"
#include "kernels/quant_blocks.h"

int be_gpu_reads_as_stored(uint32_t type) { return qb_native(type); }

/* BF16 rows must hold whole groups of 32 for the kernels (every real model's do); F16 is F16 either
 * way. */
uint32_t be_gpu_weight_type(uint32_t type, int64_t n_in)
{
    return qb_native(type) && (n_in % 32 == 0 || type == GGML_TYPE_F16) ? type : (uint32_t)GGML_TYPE_F16;
}

uint64_t be_gpu_weight_stride(uint32_t type, int64_t n_in)
{
    uint64_t row = be_gpu_weight_type(type, n_in) == type ? (uint64_t)quant_row_size(type, n_in) : 2u * (uint64_t)n_in;
    return (row + 15) / 16 * 16;
}

uint64_t be_gpu_weight_bytes(uint32_t type, int64_t n_in, int64_t n_out)
{
    return be_gpu_weight_stride(type, n_in) * (uint64_t)n_out;
}
