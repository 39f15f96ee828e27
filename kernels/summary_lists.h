/* summary_lists.h - the selection policies' summaries kept on the device (issue 25, stage 5).
 *
 * Quest bounds every page of a layer against each decode step's query, and SentKV every sentence
 * segment: the summaries (an element-wise key minimum and maximum each, be_summary) are the same
 * from one step to the next but for the few that a step adds or changes. A device backend keeps
 * each named list (be_bounds.table) on the device: each KV head's summaries side by side in a
 * region of `cap` entries, mn then mx, 2 * dim floats an entry, and each entry's n beside them
 * (dev_n: SentKV's segment lengths, be_bounds.bits), with a host record of what every entry holds
 * (its mn, mx, gen and n). A call sends only the entries whose record differs, through
 * the upload batch (kernels/upload_batch.h), or, for a summary of a page (be_summary.k) whose rows
 * the device holds (sl_device.fold), has the device fold it from its copy of the page (a prompt's
 * pages are there after its prefill: 0.5 GiB of Quest's summaries not sent for a 32K prompt at the
 * 7B shape); under the shape promise (be_bounds.shape) it looks
 * only at each head's entries from its previous last one on, so a decode step's host work does
 * not grow with the context. The device is reached through two functions, so this is plain C,
 * tested on the host with host memory standing in for the device (tests/test_bounds.c). */
#ifndef KVCHAT_SUMMARY_LISTS_H
#define KVCHAT_SUMMARY_LISTS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/upload_batch.h"

#define SL_MAX_HEADS 64   /* KV heads a list may have */
#define SL_IDLE 4096      /* ticks (sl_tick: the backend's attention calls) a list may go unused */

typedef struct sl_device {
    void *ud;
    void *(*alloc)(void *ud, size_t bytes);   /* NULL when out of memory */
    void (*release)(void *ud, void *p);
    /* NULL, or: entry `at` of the list sl_update is bringing up to date (at = head * cap + index:
     * bd_fold's) to be computed from the device's copy of the page whose key rows are k (n rows of
     * dim halves under generation gen: be_summary's), instead of sent. 0: queued (the caller runs
     * the folds sl_update queued once the batch is sent, before anything reads the list); -1: not,
     * the device holding no current copy of those rows (the summary is then sent). */
    int (*fold)(void *ud, int32_t at, const uint16_t *k, uint64_t gen, int32_t n, int64_t dim);
} sl_device;

typedef struct sl_list {
    uint64_t name;        /* 0: a free slot */
    uint64_t shape;       /* the shape the last call gave, 0: none */
    uint64_t last_use;    /* the table's tick at its last use */
    int n_heads;
    int64_t dim, cap;     /* entries a head's region holds */
    int64_t n_of[SL_MAX_HEADS];   /* each head's entries at the last call */
    be_summary *seen;     /* [n_heads * cap] what each entry on the device holds (gen 0: nothing) */
    float *dev;           /* [n_heads * cap][2 * dim] on the device */
    int64_t *dev_n;       /* [n_heads * cap] each entry's n on the device (SentKV's segment lengths) */
} sl_list;

typedef struct sl_table {
    sl_device dev;
    ub_batch *batch;      /* where the entries go (sent by the caller before the kernels read) */
    sl_list *lists;
    int n_lists;
    uint64_t ticks;
    uint64_t bytes;       /* device bytes held */
    uint64_t sent;        /* entries queued so far (tests and figures) */
    uint64_t folded;      /* of them, entries left to the device to fold from its page copies */
    uint64_t looked;      /* entries compared with their record so far (tests and figures) */
    int64_t *ns;          /* a run of entries' n, sent as one piece */
    int64_t cap_ns;
} sl_table;

void sl_init(sl_table *t, const sl_device *dev, ub_batch *batch);
void sl_free(sl_table *t);
/* The list named r->table brought up to date for r: the entries that changed queued into the batch,
 * read from r's summaries (and their n) when it is sent (ub_add_ref): the caller sends it before r's
 * summaries or r->sum change.
 * NULL with a message when the host or the device is out of memory, or r has more than
 * SL_MAX_HEADS heads (the list is then forgotten, so nothing stale is ever read). */
const sl_list *sl_update(sl_table *t, const be_bounds *r, char *err, size_t errlen);
/* The clock of the idle sweep, advanced by the backend once an attention call, whether or not any
 * policy bounds: every SL_IDLE ticks, the lists not used for more than SL_IDLE ticks are freed (a
 * policy switched off, or freed, leaves its lists behind). */
void sl_tick(sl_table *t);
/* A batch lost: what the lists count as sent never arrived; every entry is sent again. */
void sl_forget(sl_table *t);

#endif
