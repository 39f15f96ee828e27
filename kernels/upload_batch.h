/* upload_batch.h - many small host-to-device copies sent as one (issue 25, stage 2).
 *
 * An attention call sends, for each page copy it reads, the rows appended since its last use (keys,
 * values and positions: three copies) and the page descriptors that changed. A decode step of a
 * 7B-shaped model touches a page per KV head per layer, about a thousand such copies a token, each
 * a few microseconds of the driver's time. The batch gathers them: their bytes packed in one host
 * buffer (each piece 16-byte aligned) and a table of pieces saying where each goes. The CUDA backend
 * sends the packed bytes and the table with one copy (or, when they are small, in the launch's own
 * parameters: ub_inline_size) and runs one scatter kernel, in which block i puts piece i in place
 * with ub_scatter_piece; the tests run that function on the host. */
#ifndef KVCHAT_UPLOAD_BATCH_H
#define KVCHAT_UPLOAD_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/quant_blocks.h"

typedef struct ub_piece {
    uint64_t dst;     /* the device address it goes to */
    uint64_t off;     /* where its bytes start in the packed data (a multiple of 16) */
    uint64_t bytes;
    uint64_t src;     /* 0, or the device address its bytes are copied from instead (ub_add_dev) */
} ub_piece;

#define UB_CHUNK 16384   /* bytes a piece holds at most: a longer copy is cut (a block of the scatter each) */

typedef struct ub_batch {
    unsigned char *data;  /* the bytes of copied pieces, one after another */
    size_t held, cap;     /* bytes of data in use, and room */
    size_t len;           /* the packed data's length: every piece at its 16-byte aligned offset */
    ub_piece *pieces;
    const void **ref;     /* [cap_pieces] piece i's bytes: the caller's (ub_add_ref), or NULL: the next
                             copied bytes of data (copies are held in the order they were queued) */
    int64_t n, cap_pieces;
    uint64_t sent_bytes, sent_pieces, sends;   /* totals over every ub_clear after a send (figures) */
    /* When the queued bytes would pass limit (0: no limit), ub_add first calls flush(flush_ud) to
     * send what is queued (in order, before what follows), so a call that moves a whole layer
     * (a restored session, a rebuilt cache) goes in rounds and the buffers stay bounded. flush: 0,
     * or -1 (ub_add then fails). */
    size_t limit;
    int (*flush)(void *ud);
    void *flush_ud;
} ub_batch;

/* Queue bytes of host memory (copied now: src may change once this returns) for dst, in pieces of
 * at most UB_CHUNK. 0, or -1 when the host is out of memory or a flush failed (this copy may then
 * be partly queued: the caller drops the batch). Zero bytes queue nothing. */
int ub_add(ub_batch *b, void *dst, const void *src, size_t bytes);
/* As ub_add, but src is read when the batch is packed, not now: the caller promises its bytes stay
 * as they are until the batch is sent (or a flush sends them) or dropped. Large rows (a restored
 * cache's pages) then cross the host's memory once, into the staging buffer, instead of twice. */
int ub_add_ref(ub_batch *b, void *dst, const void *src, size_t bytes);
/* Queue a copy on the device, from device bytes src to dst (nothing crosses from the host; the
 * pieces of one send run side by side, so src must not be written by anything queued with it, nor
 * dst by anything else queued with it: ub_flush between them). 0, or -1 as ub_add. */
int ub_add_dev(ub_batch *b, void *dst, const void *src, size_t bytes);
/* Send what is queued now, through flush: 0 (also when nothing is queued), -1 when there is no
 * flush or it failed. */
int ub_flush(ub_batch *b);
/* Drop what is queued; `sent` adds it to the totals. */
void ub_clear(ub_batch *b, int sent);
void ub_free(ub_batch *b);
/* The packed form: the data (ub_batch.len bytes), then at ub_table_offset the piece table. */
static inline size_t ub_table_offset(const ub_batch *b) { return (b->len + 15) & ~(size_t)15; }
static inline size_t ub_packed_bytes(const ub_batch *b) { return ub_table_offset(b) + sizeof(ub_piece) * (size_t)b->n; }
/* Write the packed form (ub_packed_bytes) to out (16-byte aligned): every piece's bytes at its
 * offset (the gaps between them are not written), then the table. */
void ub_pack(const ub_batch *b, void *out);

/* A small batch needs no copy at all: its packed form rides in the scatter launch's own parameters
 * (a kernel takes up to 32,764 bytes of them since CUDA 12.1, and kvchat's CUDA build needs CUDA 13),
 * which the launch carries to the device with the kernel, so no copy waits for the copy engine
 * before the kernel starts, and no staging buffer is taken. A decode step's batch a layer is 1-2 KiB
 * on the default model and 4-8 KiB on a 7B-shaped one (up to twice that at a page boundary; a batch
 * of sequences decoded together, all of theirs). The
 * launch carries its parameters' whole declared size, so there are three sizes, and a batch takes
 * the smallest that holds its packed form: */
#define UB_INLINE_SMALL 2048
#define UB_INLINE_MEDIUM 8192
#define UB_INLINE_LARGE 24576   /* a batch of 8 sequences' steps on the default model; more goes by copy */
/* The parameter size whose launch carries a packed form of `packed` bytes, or 0: copy it. */
static inline size_t ub_inline_size(size_t packed)
{
    return packed <= UB_INLINE_SMALL    ? UB_INLINE_SMALL
           : packed <= UB_INLINE_MEDIUM ? UB_INLINE_MEDIUM
           : packed <= UB_INLINE_LARGE  ? UB_INLINE_LARGE
                                        : 0;
}

/* 16 bytes moved as one load and one store on the device. */
typedef struct __attribute__((aligned(16))) ub_v16 {
    uint32_t w[4];
} ub_v16;

/* Thread tid of nt copies its share of piece p from the packed bytes at base (or the device bytes
 * at p->src): 16 bytes at a time where the addresses and the length allow it (a packed source
 * always does), else 4, else 1. */
QB_HD void ub_scatter_piece(const unsigned char *base, const ub_piece *p, int tid, int nt)
{
    unsigned char *dst = (unsigned char *)(uintptr_t)p->dst;
    const unsigned char *src = p->src ? (const unsigned char *)(uintptr_t)p->src : base + p->off;
    uint64_t n = p->bytes, at = p->dst | p->src;
    if (((at | n) & 15) == 0) {
        for (uint64_t i = (uint64_t)tid; i < n / 16; i += (uint64_t)nt)
            ((ub_v16 *)dst)[i] = ((const ub_v16 *)src)[i];
    } else if (((at | n) & 3) == 0) {
        for (uint64_t i = (uint64_t)tid; i < n / 4; i += (uint64_t)nt)
            ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i];
    } else {
        for (uint64_t i = (uint64_t)tid; i < n; i += (uint64_t)nt) dst[i] = src[i];
    }
}

#endif
