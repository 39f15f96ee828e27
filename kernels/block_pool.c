/* block_pool.c - fixed-size blocks from large device allocations (block_pool.h). */
#include "kernels/block_pool.h"

#include <stdlib.h>
#include <string.h>

void bp_init(bp_pool *p, void *ud, void *(*alloc)(void *, size_t), void (*release)(void *, void *), size_t chunk_bytes)
{
    memset(p, 0, sizeof *p);
    p->ud = ud;
    p->alloc = alloc;
    p->release = release;
    p->chunk_bytes = chunk_bytes;
}

static void drop_chunk(bp_pool *p, int i)
{
    bp_chunk *c = &p->chunks[i];
    p->release(p->ud, c->base);
    p->bytes -= c->block * (size_t)c->n_blocks;
    free(c->free_idx);
    p->chunks[i] = p->chunks[--p->n_chunks];
}

void bp_free(bp_pool *p)
{
    while (p->n_chunks > 0) drop_chunk(p, p->n_chunks - 1);
    free(p->chunks);
    memset(p, 0, sizeof *p);
}

/* A new chunk of blocks of size block: its index, or -1 when out of memory. */
static int add_chunk(bp_pool *p, size_t block)
{
    if (p->n_chunks == p->cap_chunks) {
        int nc = p->cap_chunks ? p->cap_chunks * 2 : 16;
        bp_chunk *n = realloc(p->chunks, sizeof *n * (size_t)nc);
        if (!n) return -1;
        p->chunks = n;
        p->cap_chunks = nc;
    }
    /* chunks of a size grow geometrically (as many blocks as that size has already, at least 16) up
     * to chunk_bytes, so a size asked for a few times holds little */
    size_t have = 0;
    for (int i = 0; i < p->n_chunks; i++)
        if (p->chunks[i].block == block) have += (size_t)p->chunks[i].n_blocks;
    size_t nb = have > 16 ? have : 16, most = p->chunk_bytes / block;
    if (nb > most) nb = most;
    if (nb < 1) nb = 1;
    if (nb > 1 << 20) nb = 1 << 20;
    int *idx = malloc(sizeof(int) * nb);
    if (!idx) return -1;
    char *base = p->alloc(p->ud, block * nb);
    if (!base) {
        free(idx);
        p->failed_bytes = block * nb;
        return -1;
    }
    /* handed out from the lowest address up */
    for (size_t i = 0; i < nb; i++) idx[i] = (int)(nb - 1 - i);
    p->chunks[p->n_chunks] = (bp_chunk){ base, block, (int)nb, idx, (int)nb };
    p->bytes += block * nb;
    p->device_allocs++;
    return p->n_chunks++;
}

void *bp_get(bp_pool *p, size_t bytes)
{
    if (bytes == 0) bytes = 1;
    p->failed_bytes = 0;
    size_t block = (bytes + 255) & ~(size_t)255;
    int ci = -1;
    for (int i = 0; i < p->n_chunks; i++)
        if (p->chunks[i].block == block && p->chunks[i].n_free > 0) {
            ci = i;
            break;
        }
    if (ci < 0 && (ci = add_chunk(p, block)) < 0) return NULL;
    bp_chunk *c = &p->chunks[ci];
    int b = c->free_idx[--c->n_free];
    p->in_use += block;
    return c->base + (size_t)b * block;
}

void bp_put(bp_pool *p, void *blk)
{
    char *q = blk;
    for (int i = 0; i < p->n_chunks; i++) {
        bp_chunk *c = &p->chunks[i];
        if (q < c->base || q >= c->base + c->block * (size_t)c->n_blocks) continue;
        size_t off = (size_t)(q - c->base);
        if (off % c->block || c->n_free == c->n_blocks) return;
        c->free_idx[c->n_free++] = (int)(off / c->block);
        p->in_use -= c->block;
        return;
    }
}

void bp_trim(bp_pool *p)
{
    for (int i = p->n_chunks - 1; i >= 0; i--)
        if (p->chunks[i].n_free == p->chunks[i].n_blocks) drop_chunk(p, i);
}
