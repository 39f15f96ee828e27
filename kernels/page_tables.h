/* page_tables.h - attention's page descriptors kept on the device between calls (issue 25, stage 2).
 *
 * The attention kernels read a list of page descriptors (ag_page: where a page's device copy is,
 * its rows, its mask) and per-KV-head offsets into it. Building and sending all of them every call
 * costs the host a lookup and a descriptor per page (2,048 pages a layer for a 7B-shaped model at
 * 8K tokens). Here each list keeps its descriptors on the device from one call to the next, under
 * the name the call gives it (be_attn.table; the forward pass names each layer's list). A call
 * compares every entry of its list with what that entry was when its descriptor was last built: the
 * same page, generation and rows, whose copy still holds them (pc_current, O(1)), is left as it is;
 * only the entries that changed are built (pc_get sends their new rows) and only the descriptors
 * that differ are sent, through the upload batch. A decode step thus sends one descriptor per KV
 * head and layer, for the page its token went to. With the forward pass's promise that a list
 * only grew at each head's end (be_attn.shape), only each head's last pages are looked at.
 * Entries are matched head by head. When a head's list grows by a page under that promise, the
 * heads after it shift in the device's array: their descriptors are moved there, from one of the list's two device
 * arrays into the other (copies on the device riding in the batch, ub_add_dev), neither rebuilt
 * nor sent again, and the host's record of them does not move at all (a region of `stride` entries
 * a head), so a page boundary costs the host a few entries a head, as any step does (at 32K on
 * the 7B shape it rebuilt and sent 2,000 descriptors a layer every 16 tokens). Entries with a
 * token mask are built every call (a policy's masks change every step). Any name is correct: a
 * list unlike the last one under its name only sends more.
 *
 * Plain C, reaching the device through two functions and the batch, tested on the host
 * (tests/test_page_tables.c) with host memory standing in for the device. */
#ifndef KVCHAT_PAGE_TABLES_H
#define KVCHAT_PAGE_TABLES_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attn_group.h"
#include "kernels/page_copies.h"
#include "kernels/upload_batch.h"

#define PT_MAX_HEADS 64    /* KV heads a list may have offsets for */

typedef struct pt_device {
    void *ud;
    void *(*alloc)(void *ud, size_t bytes);   /* NULL when out of memory */
    void (*release)(void *ud, void *p);
} pt_device;

typedef struct pt_list {
    uint64_t name;        /* the calls' name for it (be_attn.table) */
    uint64_t shape;       /* the shape the last call gave (be_attn.shape), 0: none */
    int used;
    int64_t pages_of[PT_MAX_HEADS];   /* each head's entries that are pages, at the last call */
    int64_t n_bias, n_unaligned;      /* entries with a bias; entries not whole 16-byte loads */
    /* The host's record, a region a head (one when the call gives no offsets): head g's entry j as
     * its descriptor was last built at [g * stride + j], cnt[g] of them. */
    be_kv_page *seen;     /* the entry */
    int32_t *rec;         /* the page copy it came from (pc_index); PT_DIRECT; PT_REBUILD */
    ag_page *host;        /* the descriptor as the device has it */
    int64_t stride;
    int n_reg;
    int64_t cnt[PT_MAX_HEADS];
    /* A list made as a copy of another (pt_clone) keeps of region g's first blind[g] entries only
     * the copy each names (rec), not seen nor host: an append does not read them (its moved heads go
     * between its two arrays on the device), and a call that would (one that is not an append)
     * forgets the record and builds the list whole. */
    int64_t blind[PT_MAX_HEADS];
    ag_page *dev;         /* [cap] descriptors, then PT_MAX_HEADS + 1 offsets, on the device */
    ag_page *dev_alt;     /* the same room, where moved heads go (made at the first move) */
    int64_t hp[PT_MAX_HEADS + 1];   /* the offsets as the device has them */
    int n_hp;             /* how many of them are there (-1: none sent) */
    int64_t n, cap;       /* n: entries the device holds as the record says (0: none to trust) */
    uint64_t last_use;
} pt_list;

enum { PT_DIRECT = -3, PT_REBUILD = -1 };

typedef struct pt_set {
    pt_device dev;
    pc_table *copies;     /* where the pages' device copies are kept */
    ub_batch *batch;      /* what a call sends */
    pt_list *lists;       /* open addressing on the name, a power of two */
    int n_lists, cap_lists;
    uint64_t calls;
    uint64_t *masks;      /* this call's token masks, words (the caller sends them) */
    size_t cap_masks;
    uint64_t built, kept;   /* entries built / left as they were on the device, so far (figures) */
    uint64_t moved;         /* descriptors moved on the device, so far (figures) */
    uint64_t cloned;        /* descriptors copied on the device into lists made by pt_clone (figures) */
    int clone_unsent;       /* a clone's copy is queued: the batch goes before a build writes a list */
    uint64_t bytes;       /* device bytes the lists hold */
} pt_set;

/* One call's list on the device, as pt_build leaves it. */
typedef struct pt_call {
    const ag_page *pages;        /* device address */
    const int64_t *head_pages;   /* device address, or NULL when the call gave none */
    const uint64_t *masks;       /* host words for the kernels' masks argument (n_words of them) */
    size_t n_words;
    int has_bias;                /* some entry has a bias */
    int aligned;                 /* every entry's rows are whole 16-byte loads (the grouped kernels) */
} pt_call;

/* Device bytes that a call's entries may point into as they are. */
typedef struct pt_direct {
    const void *p;
    size_t bytes;
} pt_direct;

enum { PT_OK = 0, PT_NO_HOST_MEMORY, PT_NO_DEVICE_MEMORY, PT_NO_COPY, PT_BAD_LIST };

void pt_init(pt_set *s, const pt_device *dev, pc_table *copies, ub_batch *batch);
void pt_free(pt_set *s);
/* Bring list `name` to list[0 .. e) with per-KV-head offsets hp[0 .. n_heads] (hp[0] = 0, hp[n_heads]
 * = e; hp NULL: every head reads the whole list), queueing what the device needs on the batch. Entries whose k lies in
 * `direct` (NULL: none) hold device addresses already (rows the cache takes later: a deferred
 * decode step's or prefill chunk's, entries at the end of each head) and are taken as they are. A nonzero shape equal to the last call's under this name promises that
 * since that call each head's list only grew at its end (its last page took rows, pages were added
 * after it): the pages before each head's last one are then not looked at, so a decode step costs
 * the host a few entries a head rather than every page. When such a call's offsets differ from the
 * last call's, the heads' descriptors are moved on the device (the batch is sent first, through its
 * flush, if it holds anything, since the moves read what it writes); a call without the promise
 * sends the descriptors of the heads whose offsets moved instead. PT_OK, or
 * PT_NO_HOST_MEMORY (or a flush that failed), PT_NO_DEVICE_MEMORY (for a list's descriptors), PT_NO_COPY (pc_get gave none:
 * out of device memory for a page copy, or its rows could not be queued), PT_BAD_LIST (more than
 * PT_MAX_HEADS heads, offsets that do not span the list); on failure the caller
 * drops the batch and calls pt_forget. A list built twice with the batch unsent between (its
 * pieces run side by side on the device) is right only where its offsets moved under the promise
 * (the batch is then sent first); callers send the batch between two builds of one list. */
int pt_build(pt_set *s, uint64_t name, uint64_t shape, const be_kv_page *list, int64_t e, const int64_t *hp,
             int n_heads, const pt_direct *direct, pt_call *out);
/* List `name` made, where there is none, a copy of list `from` as the last call under `from` left
 * it (its descriptors copied on the device, riding in the batch; the host's record of each head's
 * entries before its last page not copied, since an append does not read them): a sequence forked
 * from another starts with its source's list, so that its first call under the source's shape
 * builds and sends each head's last pages instead of every page (at 32K on the 7B shape 8,192
 * descriptors a layer a fork). The caller promises what the shape promises for the calls under
 * `name` as if `from`'s last call had been under `name`. Nothing is done where `name` exists, `from`
 * does not, is not trusted (a failed call) or has no per-head offsets, or host or device memory is
 * short (the next call builds the list whole). The copy is sent before anything written under
 * `name` (pt_build sends the batch first); what the batch held before the copy is sent first too.
 * `from` counts as used by the call (forks made one after another keep finding it). Until the copy
 * is sent, no list is freed as idle. The list's second array is made with it (a fork's first call
 * moves its heads), so a call that pt_reads_from says appends does. 
 * PT_OK, or PT_NO_HOST_MEMORY when the batch could not be sent or queued (the caller drops it). */
int pt_clone(pt_set *s, uint64_t name, uint64_t from);
/* 1 when pt_build(s, name, shape, list, hp[n_heads], hp, n_heads, ...) would read only head g's
 * entries from[g] on (from[g] an index into list, hp[g] <= from[g] <= hp[g + 1]) and the entries
 * before it may hold anything: the call only appends to the list as it stands (its offsets may
 * have moved). 0: it would read every entry. For a caller that builds each call's list afresh (a
 * deferred step's rows after each head's pages) and need not copy what would not be read. */
int pt_reads_from(const pt_set *s, uint64_t name, uint64_t shape, const int64_t *hp, int n_heads, int64_t *from);
/* Start an attention call: pc_begin_call, and before the copies' idle sweep the lists unused for
 * `idle` calls are freed. Every counted entry of a list's record (below its region's count) that
 * names a page copy holds it (pc_hold; masked entries, built every call, and rows read where they
 * are hold none), so the sweep keeps the copies of an appended list's earlier pages, which its
 * calls do not look at, without a look at any list's entries (at 32K on the 7B shape, a batch of 8
 * sequences' lists hold millions). */
void pt_begin_call(pt_set *s, uint64_t idle);
/* Forget what every list has on the device (after a batch was lost): each is built whole next time. */
void pt_forget(pt_set *s);
/* Free the lists no call has used in the last `idle` calls. */
void pt_trim(pt_set *s, uint64_t idle);
/* Free every list and every page copy (s->copies): the sequences they served are gone (a warm-up's
 * throwaway cache), and waiting for them to go idle would hold their device memory for thousands
 * of calls. Both stay usable: the next call builds and sends what it needs whole, as a first call
 * does. Nothing may be queued on the batch for them (call it between calls). */
void pt_release_all(pt_set *s);

#endif
