/* summary_lists.h - the selection policies' summaries kept on the device (issue 25, stage 5).
 *
 * Quest bounds every page of a layer against each decode step's query, and SentKV every sentence
 * segment: the summaries (an element-wise key minimum and maximum each, be_summary) are the same
 * from one step to the next but for the few that a step adds or changes. A device backend keeps
 * each named list (be_bounds.table) on the device: each KV head's summaries side by side in a
 * region of `cap` entries, mn then mx, 2 * dim floats an entry, and each entry's n beside them
 * (dev_n: SentKV's segment lengths, be_bounds.bits), with a host record of what every entry holds
 * (its mn, mx, gen and n). A call sends only the entries whose record differs, through the upload
 * batch (kernels/upload_batch.h), or, for a summary of rows the device holds (a page's,
 * be_summary.k, or a segment's runs of rows in several pages, be_summary.runs), queues a fold of it
 * from the device's copies of the pages (sl_table.folds; a prompt's pages are there after its
 * prefill: 0.5 GiB of Quest's summaries and as much of SentKV's not sent for a 30,000-token prompt
 * at the 7B shape); under the shape promise (be_bounds.shape) it looks only at each head's entries
 * from its previous last one on, so a decode step's host work does not grow with the context. The
 * device is reached through sl_device's functions, so this is plain C, tested on the host with
 * host memory standing in for the device (tests/test_bounds.c). */
#ifndef KVCHAT_SUMMARY_LISTS_H
#define KVCHAT_SUMMARY_LISTS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/bound_kernels.h"
#include "kernels/upload_batch.h"

#define SL_MAX_HEADS 64   /* KV heads a list may have */
#define SL_IDLE 4096      /* ticks (sl_tick: the backend's attention calls) a list may go unused */

typedef struct sl_device {
    void *ud;
    void *(*alloc)(void *ud, size_t bytes);   /* NULL when out of memory */
    void (*release)(void *ud, void *p);
    /* NULL, or: the device's copy of rows [0, rows) of the page whose key rows are k (be_kv_page.k:
     * rows of dim halves) under generation gen, where it holds them (its first row's address on the
     * device), else NULL (the summary is then sent). */
    const uint16_t *(*copy_rows)(void *ud, const uint16_t *k, uint64_t gen, int32_t rows, int64_t dim);
} sl_device;

/* What an entry on the device holds: the summary it was last brought up to date from (gen 0:
 * nothing), as be_summary names it (the rest of a be_summary says where to read it from). */
typedef struct sl_seen {
    const float *mn, *mx;
    uint64_t gen;
    int64_t n;
} sl_seen;

typedef struct sl_list {
    uint64_t name;        /* 0: a free slot */
    uint64_t shape;       /* the shape the last call gave, 0: none */
    uint64_t last_use;    /* the table's tick at its last use */
    int n_heads;
    int64_t dim, cap;     /* entries a head's region holds */
    int64_t n_of[SL_MAX_HEADS];   /* each head's entries at the last call */
    sl_seen *seen;        /* [n_heads * cap] what each entry on the device holds */
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
    /* The folds the last sl_update queued (kernels/bound_kernels.h): the caller runs them
     * (bd_fold_elem) after sending the batch, before anything reads the list. */
    bd_fold *folds;
    int64_t n_folds, cap_folds;
} sl_table;

void sl_init(sl_table *t, const sl_device *dev, ub_batch *batch);
void sl_free(sl_table *t);
/* The list named r->table brought up to date for r: the entries that changed queued into the batch,
 * read from r's summaries (and their n) when it is sent (ub_add_ref): the caller sends it before r's
 * summaries or r->sum change; or, for those the device can compute, into t->folds (what the last
 * call left there is dropped).
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
