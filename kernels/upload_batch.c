/* upload_batch.c - many small host-to-device copies sent as one (see upload_batch.h). */
#include "kernels/upload_batch.h"

#include <stdlib.h>
#include <string.h>

static int grow_pieces(ub_batch *b)
{
    int64_t cap = b->cap_pieces ? b->cap_pieces * 2 : 1024;
    ub_piece *np = realloc(b->pieces, sizeof *np * (size_t)cap);
    if (np) b->pieces = np;
    const void **nr = np ? realloc(b->ref, sizeof *nr * (size_t)cap) : NULL;
    if (!nr) return -1;
    b->ref = nr;
    b->cap_pieces = cap;
    return 0;
}

/* How a piece's bytes come: copied into data now, read from the host at src when packed, or copied
 * on the device from src. */
enum { BY_COPY, BY_REF, BY_DEV };

/* One piece of at most UB_CHUNK bytes. */
static int add_piece(ub_batch *b, unsigned char *dst, const unsigned char *src, size_t bytes, int how)
{
    size_t off = (b->len + 15) & ~(size_t)15;
    if (how != BY_DEV && b->limit && b->flush && b->n > 0 && off + bytes > b->limit) {
        if (b->flush(b->flush_ud)) return -1;
        off = (b->len + 15) & ~(size_t)15;   /* 0: the flush sent and cleared the batch */
    }
    if (how == BY_COPY && b->held + bytes > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->held + bytes) cap *= 2;
        unsigned char *nd = realloc(b->data, cap);
        if (!nd) return -1;
        b->data = nd;
        b->cap = cap;
    }
    if (b->n == b->cap_pieces && grow_pieces(b)) return -1;
    b->ref[b->n] = how == BY_REF ? src : NULL;
    if (how == BY_COPY) {
        memcpy(b->data + b->held, src, bytes);
        b->held += bytes;
    }
    if (how == BY_DEV) {   /* nothing in the packed data */
        b->pieces[b->n++] = (ub_piece){ (uint64_t)(uintptr_t)dst, 0, bytes, (uint64_t)(uintptr_t)src };
        return 0;
    }
    b->pieces[b->n++] = (ub_piece){ (uint64_t)(uintptr_t)dst, off, bytes, 0 };
    b->len = off + bytes;
    return 0;
}

static int add(ub_batch *b, void *dst, const void *src, size_t bytes, int how)
{
    for (size_t o = 0; o < bytes; o += UB_CHUNK) {
        size_t n = bytes - o < UB_CHUNK ? bytes - o : UB_CHUNK;
        if (add_piece(b, (unsigned char *)dst + o, (const unsigned char *)src + o, n, how)) return -1;
    }
    return 0;
}

int ub_add(ub_batch *b, void *dst, const void *src, size_t bytes) { return add(b, dst, src, bytes, BY_COPY); }

int ub_add_ref(ub_batch *b, void *dst, const void *src, size_t bytes) { return add(b, dst, src, bytes, BY_REF); }

int ub_add_dev(ub_batch *b, void *dst, const void *src, size_t bytes) { return add(b, dst, src, bytes, BY_DEV); }

int ub_flush(ub_batch *b)
{
    if (b->n == 0) return 0;
    return b->flush ? b->flush(b->flush_ud) : -1;
}

void ub_clear(ub_batch *b, int sent)
{
    if (sent && b->n > 0) {
        b->sent_bytes += b->len;
        b->sent_pieces += (uint64_t)b->n;
        b->sends++;
    }
    b->len = b->held = 0;
    b->n = 0;
}

void ub_free(ub_batch *b)
{
    free(b->data);
    free(b->pieces);
    free(b->ref);
    memset(b, 0, sizeof *b);
}

void ub_pack(const ub_batch *b, void *out)
{
    unsigned char *o = out;
    size_t held = 0;   /* the copied pieces' bytes, in queue order */
    for (int64_t i = 0; i < b->n; i++) {
        if (b->pieces[i].src) continue;   /* copied on the device */
        size_t n = (size_t)b->pieces[i].bytes;
        memcpy(o + b->pieces[i].off, b->ref[i] ? b->ref[i] : b->data + held, n);
        if (!b->ref[i]) held += n;
    }
    memset(o + b->len, 0, ub_table_offset(b) - b->len);
    if (b->n) memcpy(o + ub_table_offset(b), b->pieces, sizeof(ub_piece) * (size_t)b->n);
}
