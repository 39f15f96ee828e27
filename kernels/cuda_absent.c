/* cuda_absent.c - what a build without CUDA (plain `make`) says when asked for the GPU: no device,
 * and how to get a build that has one. `make CUDA=1` compiles the .cu files of kernels/cuda/ instead. */
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"

int be_cuda_gpu(be_gpu *g, char *why, size_t whylen)
{
    memset(g, 0, sizeof *g);
    snprintf(why, whylen, "this kvchat was built without CUDA");
    return -1;
}

uint64_t be_cuda_flash_calls(be_backend *b)
{
    (void)b;
    return 0;
}

uint64_t be_cuda_runtime_calls(be_backend *b)
{
    (void)b;
    return 0;
}

uint64_t be_cuda_inline_sends(be_backend *b)
{
    (void)b;
    return 0;
}

int64_t be_cuda_test_batch(be_backend *b, void *dst, size_t bytes, const void *src, const be_test_piece *p, int n)
{
    (void)b, (void)dst, (void)bytes, (void)src, (void)p, (void)n;
    return -1;
}

uint64_t be_cuda_input_quantizations(be_backend *b)
{
    (void)b;
    return 0;
}

void be_cuda_page_rows(be_backend *b, uint64_t *written, uint64_t *moved, uint64_t *uploaded)
{
    (void)b;
    *written = *moved = *uploaded = 0;
}

uint64_t be_cuda_cloned_entries(be_backend *b)
{
    (void)b;
    return 0;
}

void be_cuda_summaries(be_backend *b, uint64_t *folded, uint64_t *sent)
{
    (void)b;
    *folded = *sent = 0;
}

void be_cuda_warmed_up(be_backend *b) { (void)b; }

void be_cuda_settings(be_backend *b, char *buf, size_t cap)
{
    (void)b;
    if (cap) buf[0] = 0;
}

void be_cuda_graphs(be_backend *b, be_graph_stats *st)
{
    (void)b;
    memset(st, 0, sizeof *st);
}

be_backend *be_cuda_create(int n_threads, char *err, size_t errlen)
{
    (void)n_threads;
    snprintf(err, errlen, "this kvchat was built without CUDA: build it with `make CUDA=1` (nvcc and cuBLAS), "
                          "or use --device cpu");
    return NULL;
}
