/* page_copies.h - device copies of KV pages for a device backend (kernels/cuda/backend_cuda.cu).
 *
 * The cache's pages live in host memory, where the policies read, evict and merge them; a device
 * backend keeps a copy of each page it attends to and brings it up to date before use: while a page's
 * content generation (be_kv_page.gen) stays the same only the rows appended since the last use are
 * copied (keys, values, positions and biases: the generation covers them all); a new generation
 * copies the page whole. Copies that no call has used for `idle` calls and no descriptor list
 * holds (pc_hold) are freed (their host pages may be gone). The device is reached through three functions, so this
 * bookkeeping is plain C and is tested on the host (tests/test_page_copies.c) with host memory
 * standing in for the device. */
#ifndef KVCHAT_PAGE_COPIES_H
#define KVCHAT_PAGE_COPIES_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

typedef struct pc_device {
    void *ud;
    void *(*alloc)(void *ud, size_t bytes);                 /* NULL when out of memory */
    void (*release)(void *ud, void *p);
    /* Queue bytes of a page for dst: 0, or -1: not sent. src may be read later, up to when the
     * caller sends what it queued (the CUDA backend's batch, ub_add_ref): the caller sends before
     * the cache's pages may change. */
    int (*upload)(void *ud, void *dst, const void *src, size_t bytes);
} pc_device;

/* One page's device copy: rows [0, n) of keys and values ([cap][stride] f16), positions and bias, in
 * one allocation that k points to. */
typedef struct pc_copy {
    const uint16_t *host_k;   /* the page it copies (its key rows' address) */
    uint64_t gen;
    int32_t n_up, cap, stride;
    int32_t bias_up;          /* rows whose bias was sent (a page's biases change only with its generation) */
    uint16_t *k, *v;
    int32_t *pos;
    float *bias;
    uint64_t last_use;
    int used;
    /* Descriptor lists' entries naming this copy (kernels/page_tables.c: pc_hold): a held copy is
     * never idle, since an appended list's earlier entries are read by the device without the
     * host looking at them each call. */
    int32_t held;
} pc_copy;

typedef struct pc_table {
    pc_device dev;
    /* Copies are records that keep their index for as long as they live, so a caller can hold an
     * index and check the copy in O(1) (pc_current); the hash is open addressing on host_k over
     * record indices (-1: empty), a power of two. */
    pc_copy *recs;
    int32_t *free_recs;       /* indices of unused records, a stack */
    int n_recs, cap_recs, n_free;   /* records made so far, room for them, unused ones */
    int32_t *slots;
    int cap, n, holes;        /* slots, live copies, slots a failed rehash left as holes (-2) */
    uint64_t bytes;           /* device bytes held by the copies */
    uint64_t calls;           /* pc_begin_call count */
    uint64_t idle;            /* calls a copy may go unused before it is freed */
    uint64_t rows_uploaded;   /* rows copied so far (for tests and figures) */
    uint64_t rows_filled;     /* rows the device wrote into copies itself (pc_fill) */
} pc_table;

void pc_init(pc_table *t, const pc_device *dev, uint64_t idle);
/* Frees every copy; the table stays usable (empty; its counters and idle setting kept). */
void pc_free(pc_table *t);
/* Start an attention call (copies used from now on count as used by it); every `idle` calls the
 * idle copies no list holds are freed. */
void pc_begin_call(pc_table *t);
/* One more (delta 1) or one fewer (-1) list entry naming record idx, a copy pc_get gave (idx < 0:
 * none, nothing done). */
void pc_hold(pc_table *t, int32_t idx, int delta);
/* The up-to-date copy of page pg (pg->n > 0), or NULL when the device is out of memory or an upload
 * failed (the copy then counts no rows as sent, so the next call sends them again). The pointer is valid until the next pc_get or pc_begin_call. */
const pc_copy *pc_get(pc_table *t, const be_kv_page *pg);
/* The copy of page pg made ready for the device to write its rows [row0, row0 + n) itself (rows the
 * host holds too, computed on the device: a prompt's K/V rows, be_ops.page_rows): its storage, every
 * row below row0 sent as pc_get sends them, the biases sent, and rows [row0, row0 + n) counted as
 * current, so the caller must write them before anything reads the copy. NULL when out of memory,
 * when an upload failed, or for rows outside [0, pg->n) (nothing then counts as sent that was not).
 * The pointer is valid until the next pc_get, pc_fill or pc_begin_call. */
pc_copy *pc_fill(pc_table *t, const be_kv_page *pg, int32_t row0, int32_t n);
/* The copy of page pg if it holds pg's rows [0, rows) under pg's generation (biases too), else NULL;
 * nothing is made or sent. It counts as used. Valid until the next pc_get, pc_fill or
 * pc_begin_call. */
const pc_copy *pc_find(pc_table *t, const be_kv_page *pg, int32_t rows);
/* The index of a copy pc_get returned: it names that copy until the copy is freed. */
int32_t pc_index(const pc_table *t, const pc_copy *c);
/* 1 when record idx still holds page pg with every row below pg->n sent, in storage whose keys are
 * at dev_k (what a caller built a descriptor from): the copy then counts as used by this call, as
 * pc_get would. 0 otherwise (the caller asks pc_get). O(1), no hashing. */
int pc_current(pc_table *t, int32_t idx, const be_kv_page *pg, const void *dev_k);
/* Forget what every copy holds (their storage stays), so each is sent whole at its next use: after
 * an upload the caller had accepted was lost. */
void pc_forget_rows(pc_table *t);

#endif
