/* test_block_pool.c - fixed-size blocks from large allocations (kernels/block_pool.c), with host
 * memory standing in for the device: distinct blocks, reuse before new chunks, one chunk per size,
 * trimming empty chunks, and running out of memory without losing anything. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/block_pool.h"

typedef struct dev {
    int live, fail;
} dev;

static void *d_alloc(void *ud, size_t n)
{
    dev *d = ud;
    if (d->fail) return NULL;
    d->live++;
    return malloc(n);
}
static void d_release(void *ud, void *p)
{
    ((dev *)ud)->live--;
    free(p);
}

Test(block_pool, blocks_are_distinct_and_come_from_few_chunks)
{
    dev d = { 0, 0 };
    bp_pool p;
    bp_init(&p, &d, d_alloc, d_release, 1 << 16);   /* 16 blocks of 4 KiB a chunk */
    enum { N = 100 };
    char *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = bp_get(&p, 4000);
        cr_assert(b[i]);
        memset(b[i], i, 4000);   /* writes past a block would spoil a neighbour */
    }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < 4000; j += 999) cr_assert_eq((unsigned char)b[i][j], (unsigned char)i, "block %d was overwritten", i);
    cr_expect_eq(p.device_allocs, 7, "100 blocks of 16 a chunk");
    cr_expect_eq(p.in_use, (uint64_t)N * 4096);
    /* returned blocks are reused before any new chunk */
    for (int i = 0; i < N; i += 2) bp_put(&p, b[i]);
    for (int i = 0; i < N; i += 2) cr_assert(bp_get(&p, 4096));
    cr_expect_eq(p.device_allocs, 7);
    bp_free(&p);
    cr_expect_eq(d.live, 0);
}

Test(block_pool, chunks_of_a_size_double_up_to_the_chunk_size)
{
    dev d = { 0, 0 };
    bp_pool p;
    bp_init(&p, &d, d_alloc, d_release, 1 << 20);   /* at most 1024 blocks of 1 KiB */
    for (int i = 0; i < 3000; i++) cr_assert(bp_get(&p, 1024));
    /* 16, 16, 32, 64, 128, 256, 512, 1024, 1024 blocks: 3072 */
    cr_expect_eq(p.n_chunks, 9);
    cr_expect_eq(p.bytes, 3072u * 1024u);
    bp_free(&p);
}

Test(block_pool, sizes_keep_to_their_own_chunks_and_empty_chunks_are_trimmed)
{
    dev d = { 0, 0 };
    bp_pool p;
    bp_init(&p, &d, d_alloc, d_release, 1 << 16);
    void *a = bp_get(&p, 1000), *b = bp_get(&p, 3000), *c = bp_get(&p, 1 << 20);
    cr_assert(a && b && c);
    cr_expect_eq(p.n_chunks, 3, "two sizes and one block bigger than a chunk");
    bp_put(&p, b);
    bp_put(&p, c);
    bp_trim(&p);
    cr_expect_eq(p.n_chunks, 1);
    cr_expect_eq(d.live, 1);
    int x;
    bp_put(&p, &x);   /* not from the pool: ignored */
    cr_expect_eq(p.in_use, 1024);
    bp_free(&p);
    cr_expect_eq(d.live, 0);
}

Test(block_pool, out_of_memory_is_null_and_the_pool_stays_usable)
{
    dev d = { 0, 0 };
    bp_pool p;
    bp_init(&p, &d, d_alloc, d_release, 4096);
    void *a = bp_get(&p, 4096);
    cr_assert(a);
    d.fail = 1;
    cr_expect_null(bp_get(&p, 4096), "a full device gave a block");
    cr_expect_eq(p.failed_bytes, 4096, "what was asked of the device");
    cr_expect_eq(p.n_chunks, 1);
    bp_put(&p, a);
    cr_expect_eq(bp_get(&p, 4096), a, "the freed block is there without the device");
    d.fail = 0;
    bp_free(&p);
    cr_expect_eq(d.live, 0);
}
