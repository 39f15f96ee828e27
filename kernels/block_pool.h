/* block_pool.h - fixed-size blocks carved from large device allocations.
 *
 * The CUDA backend keeps a device copy of every KV page it attends to: thousands of blocks of one
 * size (a page's keys, values, positions and biases), made and dropped as the cache grows, slides
 * and evicts. A device allocation each would cost microseconds apiece and, on release, a wait for
 * the whole device; here blocks come from chunks of many blocks of one size (16 blocks at first,
 * doubling up to a chunk size) and go back to their chunk's free list. Chunks whose blocks are all free are given back to the device by bp_trim. The
 * device is reached through two function pointers, so this is plain C, tested on the host
 * (tests/test_block_pool.c). */
#ifndef KVCHAT_BLOCK_POOL_H
#define KVCHAT_BLOCK_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct bp_chunk {
    char *base;
    size_t block;      /* the chunk's block size */
    int n_blocks;
    int *free_idx;     /* free block indices, a stack */
    int n_free;
} bp_chunk;

typedef struct bp_pool {
    void *ud;
    void *(*alloc)(void *ud, size_t bytes);   /* NULL when out of memory */
    void (*release)(void *ud, void *p);
    size_t chunk_bytes;                        /* a chunk's size (a bigger block gets one of its own) */
    bp_chunk *chunks;
    int n_chunks, cap_chunks;
    uint64_t bytes;                            /* device bytes held by the chunks */
    uint64_t in_use;                           /* bytes of the blocks handed out */
    uint64_t device_allocs;                    /* chunk allocations so far (for tests and figures) */
    size_t failed_bytes;                       /* the chunk the device last refused */
} bp_pool;

void bp_init(bp_pool *p, void *ud, void *(*alloc)(void *, size_t), void (*release)(void *, void *), size_t chunk_bytes);
void bp_free(bp_pool *p);
/* A block of at least bytes (rounded up to 256), or NULL when the device (or host) is out of memory. */
void *bp_get(bp_pool *p, size_t bytes);
/* Give a block back (a pointer outside every chunk is ignored). */
void bp_put(bp_pool *p, void *blk);
/* Release the chunks whose blocks are all free. */
void bp_trim(bp_pool *p);

#endif
