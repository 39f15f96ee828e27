/* test_page_tables.c - attention's page descriptors kept on the device between calls
 * (kernels/page_tables.c) and the upload batch that carries them (kernels/upload_batch.c), with
 * host memory standing in for the device (junk in fresh allocations). After every call the batch
 * is "sent" by running the scatter kernel's per-thread function over each piece, and every
 * descriptor the kernels would read must lead to the rows, positions, biases and masks of the page
 * the call listed, with the call's flags exact: over random histories of appends, new pages,
 * evictions that give a page's memory to another page, truncations, biases, per-call masks, rows
 * the cache takes later (a deferred step's or chunk's: several entries a head, in a buffer that
 * moves, once not 16-byte aligned), two lists under
 * names that are sometimes swapped, the shape promise, copies freed while idle, a device that fills
 * up part-way through a call, batches sent in rounds, lost batches, and everything let go at once
 * (a warm-up's lists and copies) with the tables used again after. A decode step sends only
 * the descriptors of the pages that grew. The batch: pieces of any alignment, long copies cut,
 * rounds in order. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/page_tables.h"

/* NCUR: most rows a call gives that the cache takes later, in entries of CUR_PIECE rows */
enum { D = 16, P = 8, H = 3, POOL = 48, NCUR = 5, CUR_PIECE = 2, MAXE = POOL + 4 * H };

typedef struct hpage {
    uint16_t k[P * D], v[P * D];
    int32_t pos[P];
    float bias[P];
    int32_t n;
    uint64_t gen;
    int used, has_bias;
} hpage;

typedef struct cache {
    hpage pool[POOL];
    int list[H][POOL];   /* pool indices in order */
    int n[H];
    int32_t next_pos;
    uint64_t shape;      /* changes whenever a head's list changes other than at its end */
} cache;

static uint64_t gen_next = 1;
static unsigned rng = 12345;

static unsigned rnd(void)
{
    rng = rng * 1103515245u + 12345u;
    return (rng >> 8) & 0xffffff;
}

static int64_t live_blocks;
static int64_t copy_allocs_left = -1;   /* page copies the "device" still gives (-1: no limit) */

/* Fresh "device" memory holds junk, as a GPU's does: a descriptor never sent cannot pass. */
static void *h_alloc(void *ud, size_t bytes)
{
    int *fail = ud;
    if (fail && *fail) return NULL;
    void *p = malloc(bytes);
    if (!p) return NULL;
    memset(p, 0xa5, bytes);
    live_blocks++;
    return p;
}

static void *copy_alloc(void *ud, size_t bytes)
{
    if (copy_allocs_left == 0) return NULL;
    if (copy_allocs_left > 0) copy_allocs_left--;
    return h_alloc(NULL, bytes);
}

static void h_release(void *ud, void *p)
{
    if (!p) return;
    live_blocks--;
    free(p);
}

/* as the CUDA backend queues page rows: read from the pages when the batch is sent */
static int q_upload(void *ud, void *dst, const void *src, size_t bytes) { return ub_add_ref(ud, dst, src, bytes); }

typedef struct rig {
    ub_batch batch;
    pc_table copies;
    pt_set tables;
    int fail_alloc;
    uint64_t pieces_last;
} rig;

static int flush_rig(void *ud);

static void rig_init(rig *r, uint64_t idle)
{
    memset(r, 0, sizeof *r);
    pc_device pd = { &r->batch, copy_alloc, h_release, q_upload };
    pc_init(&r->copies, &pd, idle);
    pt_device td = { &r->fail_alloc, h_alloc, h_release };
    pt_init(&r->tables, &td, &r->copies, &r->batch);
    r->batch.flush = flush_rig;   /* the moves of a list's descriptors send the batch before them */
    r->batch.flush_ud = r;
}

static void rig_free(rig *r)
{
    pt_free(&r->tables);
    pc_free(&r->copies);
    ub_free(&r->batch);
}

static int overlap(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) { return a < b + bn && b < a + an; }

/* What the device does with a batch: one copy of the packed bytes, then the scatter kernel, whose
 * blocks run side by side: no two pieces may write the same bytes, and none may read what another
 * writes (a move on the device, ub_add_dev); the pieces are put in place last first, so that an
 * order the kernel does not keep cannot pass. */
static void send_batch(rig *r)
{
    size_t bytes = ub_packed_bytes(&r->batch);
    unsigned char *buf = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
    cr_assert(buf || bytes == 0);
    ub_pack(&r->batch, buf);
    const ub_piece *tab = (const ub_piece *)(buf + ub_table_offset(&r->batch));
    for (int64_t i = 0; i < r->batch.n; i++)
        for (int64_t j = 0; j < r->batch.n; j++) {
            if (j != i)
                cr_assert(!overlap(tab[i].dst, tab[i].bytes, tab[j].dst, tab[j].bytes), "pieces %ld and %ld write the same bytes",
                          (long)i, (long)j);
            if (tab[i].src)
                cr_assert(!overlap(tab[i].src, tab[i].bytes, tab[j].dst, tab[j].bytes),
                          "piece %ld reads what piece %ld writes", (long)i, (long)j);
        }
    for (int64_t i = r->batch.n - 1; i >= 0; i--)
        for (int tid = 0; tid < 3; tid++) ub_scatter_piece(buf, &tab[i], tid, 3);
    r->pieces_last = (uint64_t)r->batch.n;
    ub_clear(&r->batch, 1);
    free(buf);
}

static int64_t flushes;

/* The batch's flush (ub_batch.limit): a round sent before the call's end. */
static int flush_rig(void *ud)
{
    flushes++;
    send_batch(ud);
    return 0;
}

/* A lost batch: nothing arrives, and both tables forget what they thought was sent. */
static void lose_batch(rig *r)
{
    ub_clear(&r->batch, 0);
    pc_forget_rows(&r->copies);
    pt_forget(&r->tables);
}

static void write_rows(hpage *p, int r0, int r1, int32_t pos0)
{
    for (int i = r0; i < r1; i++) {
        for (int d = 0; d < D; d++) {
            p->k[i * D + d] = (uint16_t)rnd();
            p->v[i * D + d] = (uint16_t)rnd();
        }
        p->pos[i] = pos0 + (i - r0);
        p->bias[i] = (float)(rnd() % 100) / 10.0f;
    }
}

static int new_page(cache *c)
{
    int free_ix[POOL], nf = 0;
    for (int i = 0; i < POOL; i++)
        if (!c->pool[i].used) free_ix[nf++] = i;
    if (!nf) return -1;
    int i = free_ix[rnd() % (unsigned)nf];   /* any free page: its memory was some other page's */
    c->pool[i].used = 1;
    c->pool[i].n = 0;
    c->pool[i].has_bias = 0;
    c->pool[i].gen = gen_next++;
    return i;
}

/* Append rows to head h: the last page fills, then new pages. */
static void append(cache *c, int h, int rows)
{
    while (rows > 0) {
        hpage *last = c->n[h] ? &c->pool[c->list[h][c->n[h] - 1]] : NULL;
        if (!last || last->n == P) {
            int i = new_page(c);
            if (i < 0) return;
            c->list[h][c->n[h]++] = i;
            continue;
        }
        int take = P - last->n < rows ? P - last->n : rows;
        write_rows(last, last->n, last->n + take, c->next_pos);
        last->n += take;
        rows -= take;
    }
}

/* Page j of head h leaves the cache (its memory free for another page). */
static void evict_page(cache *c, int h, int j)
{
    c->pool[c->list[h][j]].used = 0;
    memmove(&c->list[h][j], &c->list[h][j + 1], sizeof(int) * (size_t)(c->n[h] - j - 1));
    c->n[h]--;
}

static void evict(cache *c, int h)
{
    if (c->n[h] < 2) return;
    evict_page(c, h, (int)(rnd() % (unsigned)(c->n[h] - 1)));
}

static void truncate_last(cache *c, int h)
{
    if (!c->n[h]) return;
    hpage *p = &c->pool[c->list[h][c->n[h] - 1]];
    if (p->n < 2) return;
    p->n -= 1 + (int)(rnd() % (unsigned)(p->n - 1));
    write_rows(p, 0, p->n, c->next_pos);   /* rewritten: a new generation */
    p->gen = gen_next++;
}

typedef struct call {
    be_kv_page list[MAXE];
    uint64_t masks[MAXE];
    int64_t hp[H + 1];
    int64_t e;
} call;

/* The list a call gives: each head's pages, some masked, and when cur, n_cur rows the cache takes
 * later ([n_cur][H][D] keys at cur, the values after them) in entries of CUR_PIECE rows. */
static void make_call(cache *c, call *cl, int masks, const uint16_t *cur, const int32_t *cur_pos, int n_cur)
{
    cl->e = 0;
    for (int h = 0; h < H; h++) {
        cl->hp[h] = cl->e;
        for (int j = 0; j < c->n[h]; j++) {
            hpage *p = &c->pool[c->list[h][j]];
            be_kv_page *pg = &cl->list[cl->e];
            *pg = (be_kv_page){ p->k, p->v, p->pos, p->has_bias ? p->bias : NULL, NULL, p->n, D, 0, p->gen, P, NULL };
            if (masks && rnd() % 3 == 0) {
                cl->masks[cl->e] = ((uint64_t)rnd() << 24) ^ rnd();
                pg->mask = &cl->masks[cl->e];
            }
            cl->e++;
        }
        for (int r0 = 0; cur && r0 < n_cur; r0 += CUR_PIECE)
            cl->list[cl->e++] = (be_kv_page){ .k = cur + r0 * H * D, .v = cur + (n_cur + r0) * H * D,
                                              .pos = cur_pos + r0, .stride = H * D, .head_step = D,
                                              .n = n_cur - r0 < CUR_PIECE ? n_cur - r0 : CUR_PIECE };
    }
    cl->hp[H] = cl->e;
}

/* Every descriptor leads to what its entry lists, and the call's flags are exact; entries pointing
 * into cur [0, n_cur) are read where they are. */
static void expect_device_matches(const call *cl, const pt_call *out, const uint16_t *cur, int n_cur)
{
    for (int h = 0; h <= H; h++) cr_assert_eq(out->head_pages[h], cl->hp[h], "head offset %d", h);
    int any_bias = 0, all_aligned = 1;
    for (int64_t i = 0; i < cl->e; i++) {
        const be_kv_page *pg = &cl->list[i];
        const ag_page *d = &out->pages[i];
        cr_assert_eq(d->n, pg->n, "entry %ld rows", (long)i);
        cr_assert_eq(d->stride, pg->stride);
        cr_assert_eq(d->head_step, pg->head_step);
        if (pg->n > 0 && (((uintptr_t)d->k | (uintptr_t)d->v) % 16 || pg->stride % 8 || pg->head_step % 8))
            all_aligned = 0;
        if (pg->bias) any_bias = 1;
        if (cur && pg->k >= cur && pg->k < cur + 2 * n_cur * H * D) {
            cr_assert_eq(d->k, pg->k, "rows the cache takes later are read where they are");
            cr_assert_eq(d->v, pg->v);
            cr_assert_eq(d->pos, pg->pos);
            cr_assert_null(d->bias);
            cr_assert_eq(d->mask_off, -1);
            continue;
        }
        size_t nv = (size_t)pg->n * (size_t)pg->stride;
        cr_assert(!memcmp(d->k, pg->k, sizeof(uint16_t) * nv), "entry %ld keys", (long)i);
        cr_assert(!memcmp(d->v, pg->v, sizeof(uint16_t) * nv), "entry %ld values", (long)i);
        cr_assert(!memcmp(d->pos, pg->pos, sizeof(int32_t) * (size_t)pg->n), "entry %ld positions", (long)i);
        if (pg->bias) {
            cr_assert(d->bias && !memcmp(d->bias, pg->bias, sizeof(float) * (size_t)pg->n), "entry %ld bias", (long)i);
        } else {
            cr_assert_null(d->bias, "entry %ld has no bias", (long)i);
        }
        if (pg->mask) {
            cr_assert_geq(d->mask_off, 0);
            cr_assert_lt((size_t)d->mask_off, out->n_words);
            cr_assert_eq(out->masks[d->mask_off], pg->mask[0], "entry %ld mask", (long)i);
        } else {
            cr_assert_eq(d->mask_off, -1, "entry %ld has no mask", (long)i);
        }
    }
    cr_assert_eq(out->has_bias, any_bias, "the call's bias flag");
    cr_assert_eq(out->aligned, all_aligned, "the call's 16-byte flag");
}

/* Every live copy is held once for each counted entry naming it, in every list's record (the
 * entries below each region's count, trusted or not), and no free record is held: what keeps the
 * copies of an appended list's earlier pages from the idle sweep. */
static void expect_holds_counted(const rig *r)
{
    const pc_table *t = &r->copies;
    for (int i = 0; i < t->n_recs; i++) {
        int64_t want = 0;
        for (int li = 0; li < r->tables.cap_lists; li++) {
            const pt_list *l = &r->tables.lists[li];
            if (!l->used) continue;
            for (int g = 0; g < l->n_reg; g++)
                for (int64_t j = 0; j < l->cnt[g]; j++) want += l->rec[(int64_t)g * l->stride + j] == i;
        }
        cr_assert_eq(t->recs[i].held, want, "record %d: held %d, named by %ld counted entries", i, t->recs[i].held,
                     (long)want);
        cr_assert(t->recs[i].used || want == 0, "record %d is free and named", i);
    }
}

/* One call that must succeed: started, built, sent, and every descriptor checked. */
static void call_ok(rig *r, uint64_t name, uint64_t shape, const call *cl, pt_call *out)
{
    pt_begin_call(&r->tables, 4096);
    cr_assert_eq(pt_build(&r->tables, name, shape, cl->list, cl->e, cl->hp, H, NULL, out), PT_OK);
    send_batch(r);
    expect_device_matches(cl, out, NULL, 0);
}

/* A list of another cache's pages (rows rows a head) called under name and shape: call_ok. */
static void other_pages_called(rig *r, int rows, uint64_t name, uint64_t shape, pt_call *out)
{
    static cache c2;
    memset(&c2, 0, sizeof c2);
    for (int h = 0; h < H; h++) append(&c2, h, rows);
    static call cl2;
    make_call(&c2, &cl2, 0, NULL, NULL, 0);
    call_ok(r, name, shape, &cl2, out);
}

Test(page_tables, random_histories_keep_every_descriptor_right)
{
    static cache cs[2];
    memset(cs, 0, sizeof cs);
    cs[0].shape = gen_next++;
    cs[1].shape = gen_next++;
    static rig r;
    rig_init(&r, 7);   /* copies idle for 7 calls are freed */
    r.batch.limit = 4096;   /* sent in rounds */
    r.batch.flush = flush_rig;
    r.batch.flush_ud = &r;
    /* rows the cache takes later (a deferred decode step's or prefill chunk's): in one of two
     * buffers, the second not 16-byte aligned */
    static uint16_t curbuf[2][2 * NCUR * H * D + 8] __attribute__((aligned(16)));
    int32_t cur_pos[NCUR] = { 0 };
    int64_t failed = 0;
    static call cl;
    int64_t forgotten = 0, swapped = 0, clones = 0;
    uint64_t names[2] = { 1, 2 }, next_name = 100;
    for (int step = 0; step < 3000; step++) {
        int which = rnd() % 5 == 0;   /* cache 1 is used less: its copies go idle */
        cache *c = &cs[which];
        for (int h = 0; h < H; h++) {
            unsigned op = rnd() % 16;
            if (op < 9) {
                append(c, h, 1 + (op == 0 ? (int)(rnd() % 20) : 0));
                continue;   /* only at the end: the shape stays */
            }
            if (op < 11) evict(c, h);
            else if (op == 11) truncate_last(c, h);
            else if (op == 12 && c->n[h]) c->pool[c->list[h][rnd() % (unsigned)c->n[h]]].has_bias ^= 1;
            else continue;
            c->shape = gen_next++;
        }
        c->next_pos++;
        int deferred = rnd() % 2, n_cur = deferred ? 1 + (int)(rnd() % NCUR) : 0;
        const uint16_t *cur = rnd() % 4 ? curbuf[0] : curbuf[1] + 1;
        for (int i = 0; i < n_cur; i++) cur_pos[i] = c->next_pos + i;
        int masked = rnd() % 3 == 0;
        make_call(c, &cl, masked, deferred ? cur : NULL, cur_pos, n_cur);
        uint64_t name = names[which];
        if (rnd() % 50 == 0) {
            name = names[1 - which];   /* the other cache's list: everything differs, still right */
            swapped++;
        }
        pt_begin_call(&r.tables, 7);
        if (name == names[which] && rnd() % 40 == 0) {
            /* the sequence goes on under a new name, its list a copy of its last (a fork that
             * takes over): the shape's promise holds from that list's last call */
            const uint64_t from = names[which];
            name = names[which] = next_name++;
            cr_assert_eq(pt_clone(&r.tables, name, from), PT_OK);
            clones++;
        }
        pt_call out;
        if (rnd() % 23 == 0) copy_allocs_left = rnd() % 3;   /* the device fills up part-way */
        pt_direct rows = { cur, sizeof(uint16_t) * 2 * (size_t)(n_cur * H * D) };
        int rc = pt_build(&r.tables, name, masked ? 0 : c->shape, cl.list, cl.e, cl.hp, H,
                          deferred ? &rows : NULL, &out);
        copy_allocs_left = -1;
        expect_holds_counted(&r);
        if (rc == PT_NO_COPY) {
            lose_batch(&r);
            failed++;
            continue;
        }
        cr_assert_eq(rc, PT_OK, "step %d: %d", step, rc);
        if (rnd() % 97 == 0) {
            lose_batch(&r);
            forgotten++;
            continue;
        }
        send_batch(&r);
        expect_device_matches(&cl, &out, cur, n_cur);
    }
    cr_expect_gt(forgotten, 10);
    cr_expect_gt(failed, 3, "copies refused part-way: %ld times", (long)failed);
    cr_expect_gt(flushes, 100, "batches went in rounds");
    cr_expect_gt(swapped, 10);
    cr_expect_gt(clones, 20);
    cr_expect_gt(r.tables.cloned, 0, "some lists were copied on the device");
    cr_expect_gt(r.tables.moved, 5000, "descriptors moved on the device: %lu", (unsigned long)r.tables.moved);
    /* a third of the steps evict, truncate, mask or swap the lists, so many entries are built; the
     * rest stay (the decode test below counts them exactly) */
    cr_expect_gt(2 * r.tables.kept, r.tables.built, "entries kept: %lu, built: %lu",
                 (unsigned long)r.tables.kept, (unsigned long)r.tables.built);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0, "every device allocation was released");
}

Test(page_tables, a_decode_step_sends_only_the_pages_that_grew)
{
    static cache c;
    memset(&c, 0, sizeof c);
    static rig r;
    rig_init(&r, 4096);
    for (int h = 0; h < H; h++) append(&c, h, 37);
    static call cl;
    pt_call out;
    make_call(&c, &cl, 0, NULL, NULL, 0);
    call_ok(&r, 5, 42, &cl, &out);
    for (int step = 0; step < 40; step++) {
        for (int h = 0; h < H; h++) append(&c, h, 1);
        c.next_pos++;
        int64_t e0 = cl.e;
        make_call(&c, &cl, 0, NULL, NULL, 0);
        uint64_t built = r.tables.built, kept = r.tables.kept, rows = r.copies.rows_uploaded, moved = r.tables.moved;
        call_ok(&r, 5, 42, &cl, &out);
        int opened = cl.e > e0;   /* the step's token opened a new page in each head */
        cr_expect_eq(r.tables.built - built, H, "one entry a head was built");
        cr_expect_eq(r.tables.kept - kept, (uint64_t)(cl.e - H));
        cr_expect_eq(r.copies.rows_uploaded - rows, H, "one row a head was sent");
        /* three pieces of rows a head (keys, values, positions) and one descriptor a head; when
         * the token opened a page in each head (the later heads' entries shifted), each head's
         * pages before its last moved on the device in one piece, its last two sent, and the
         * offsets: nothing else was built or sent */
        cr_expect_eq(r.pieces_last, (uint64_t)(opened ? 5 * H + 1 : 4 * H), "step %d", step);
        cr_expect_eq(r.tables.moved - moved, (uint64_t)(opened ? e0 - H : 0), "step %d", step);
    }
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

/* A list built again before the batch went (a step's lists built one after another and sent
 * together), its offsets moved in between: the moves read the descriptors the first build queued,
 * so those go first. */
/* A cache of 5 pages a head and its list under `name` and `shape`, built and sent once. */
static void first_call(cache *c, rig *r, call *cl, pt_call *out, uint64_t name, uint64_t shape)
{
    memset(c, 0, sizeof *c);
    rig_init(r, 4096);
    for (int h = 0; h < H; h++) append(c, h, 5 * P);
    make_call(c, cl, 0, NULL, NULL, 0);
    call_ok(r, name, shape, cl, out);
}

/* rows more to every head (a decode step's, or a chunk's), the list made from the cache again. */
static void grow_heads(cache *c, call *cl, int rows)
{
    for (int h = 0; h < H; h++) append(c, h, rows);
    c->next_pos++;
    make_call(c, cl, 0, NULL, NULL, 0);
}

static void moved_before_sent(int no_room)
{
    static cache c;
    static rig r;
    static call cl;
    pt_call out;
    first_call(&c, &r, &cl, &out, 3, 11);
    r.fail_alloc = no_room;   /* no second array: the moved heads sent from the host's record */
    for (int round = 0; round < 6; round++) {
        grow_heads(&c, &cl, P / 2);   /* the last pages take rows */
        pt_begin_call(&r.tables, 4096);
        cr_assert_eq(pt_build(&r.tables, 3, 11, cl.list, cl.e, cl.hp, H, NULL, &out), PT_OK);   /* not sent */
        int64_t sends = flushes;
        uint64_t moved = r.tables.moved;
        grow_heads(&c, &cl, P);   /* every head opens a page: the offsets move */
        call_ok(&r, 3, 11, &cl, &out);
        cr_expect_eq(flushes - sends, 1, "the first build's pieces went before the moves");
        if (no_room)
            cr_expect_eq(r.tables.moved, moved);
        else
            cr_expect_gt(r.tables.moved, moved);
    }
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

Test(page_tables, a_list_moved_before_its_last_build_was_sent_moves_what_that_build_queued) { moved_before_sent(0); }

/* The same without room for the second array: the first build's pieces still go first. */
Test(page_tables, a_list_without_room_moved_before_its_last_build_was_sent_sends_what_that_build_queued_first)
{
    moved_before_sent(1);
}

/* No device memory for a list's second array at its first move: the moved heads' descriptors are
 * sent from the host's record instead, every descriptor right, nothing moved on the device. */
Test(page_tables, a_list_without_room_for_its_second_array_sends_its_moved_heads)
{
    static cache c;
    static rig r;
    static call cl;
    pt_call out;
    first_call(&c, &r, &cl, &out, 4, 13);
    r.fail_alloc = 1;   /* the page copies come from their own allocator: only the list's arrays fail */
    for (int step = 0; step < 3 * P; step++) {
        grow_heads(&c, &cl, 1);
        call_ok(&r, 4, 13, &cl, &out);
    }
    cr_expect_eq(r.tables.moved, 0, "nothing could be moved on the device");
    r.fail_alloc = 0;
    for (int step = 0; step < 2 * P; step++) {   /* with room again, the moves go on the device */
        grow_heads(&c, &cl, 1);
        call_ok(&r, 4, 13, &cl, &out);
    }
    cr_expect_gt(r.tables.moved, 0);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

/* A fork of c (kv_fork): the same pages, each head's last copied on write into a page of its own
 * (the same rows, a new generation), its lists in fl/fn; c's lists as they were. */
static void fork_cache(cache *c, int fl[H][POOL], int fn[H])
{
    for (int h = 0; h < H; h++) {
        memcpy(fl[h], c->list[h], sizeof fl[h]);
        fn[h] = c->n[h];
        if (!fn[h]) continue;
        const hpage *last = &c->pool[c->list[h][c->n[h] - 1]];
        int i = new_page(c);
        cr_assert_geq(i, 0);
        hpage *own = &c->pool[i];
        memcpy(own->k, last->k, sizeof own->k);
        memcpy(own->v, last->v, sizeof own->v);
        memcpy(own->pos, last->pos, sizeof own->pos);
        memcpy(own->bias, last->bias, sizeof own->bias);
        own->n = last->n;
        own->has_bias = last->has_bias;
        fl[h][fn[h] - 1] = i;
    }
}

/* c's lists swapped with fl/fn (the fork's made c's, or back). */
static void swap_lists(cache *c, int fl[H][POOL], int fn[H])
{
    for (int h = 0; h < H; h++) {
        int t[POOL];
        memcpy(t, c->list[h], sizeof t);
        memcpy(c->list[h], fl[h], sizeof t);
        memcpy(fl[h], t, sizeof t);
        int tn = c->n[h];
        c->n[h] = fn[h];
        fn[h] = tn;
    }
}

/* The fork's rows more in every head, and its call made. */
static void fork_grows(cache *c, int fl[H][POOL], int fn[H], int rows, call *cl)
{
    swap_lists(c, fl, fn);
    for (int h = 0; h < H; h++) append(c, h, rows);
    make_call(c, cl, 0, NULL, NULL, 0);
    swap_lists(c, fl, fn);
}

/* A call under name and shape that must build its list whole (call_ok), every copy held as counted. */
static void built_whole(rig *r, uint64_t name, uint64_t shape, const call *cl)
{
    pt_call out;
    uint64_t built = r->tables.built;
    call_ok(r, name, shape, cl, &out);
    cr_expect_eq(r->tables.built - built, (uint64_t)cl->e, "built whole: %lu of %ld", (unsigned long)(r->tables.built - built),
                 (long)cl->e);
    expect_holds_counted(r);
}

/* A forked sequence's list made a copy of its source's (pt_clone): its first call under the
 * source's shape builds each head's entries from its last page on and nothing before them, every
 * descriptor right, the copies held as counted; the source goes on as before; later appends as any
 * list's; and a call that is not an append (a page evicted) builds it whole, right. */
Test(page_tables, a_clone_starts_as_its_source_and_builds_only_each_heads_last_pages)
{
    static cache c;
    static rig r;
    static call cl, fcl;
    pt_call out;
    first_call(&c, &r, &cl, &out, 3, 11);   /* 5 pages a head */
    static int fl[H][POOL], fn[H];
    fork_cache(&c, fl, fn);
    cr_assert_eq(pt_clone(&r.tables, 9, 3), PT_OK);
    cr_expect_eq(r.tables.cloned, (uint64_t)cl.e);
    expect_holds_counted(&r);
    fork_grows(&c, fl, fn, P / 2 + (int)(rnd() % P), &fcl);   /* some heads open a page */
    uint64_t built = r.tables.built;
    int64_t from_last = 0;
    for (int h = 0; h < H; h++) from_last += fn[h] - (c.n[h] - 1);
    call_ok(&r, 9, 11, &fcl, &out);
    cr_expect_eq(r.tables.built - built, (uint64_t)from_last, "built %lu, each head's last pages on: %ld",
                 (unsigned long)(r.tables.built - built), (long)from_last);
    expect_holds_counted(&r);
    for (int step = 0; step < 2 * P; step++) {   /* both go on, each under its own name */
        grow_heads(&c, &cl, 1);
        call_ok(&r, 3, 11, &cl, &out);
        fork_grows(&c, fl, fn, 1, &fcl);
        built = r.tables.built;
        call_ok(&r, 9, 11, &fcl, &out);
        cr_expect_eq(r.tables.built - built, H, "a decode step's entry a head");
        expect_holds_counted(&r);
    }
    swap_lists(&c, fl, fn);   /* the fork evicts a page: a new shape, the list built whole */
    evict_page(&c, 1, 0);
    make_call(&c, &fcl, 0, NULL, NULL, 0);
    swap_lists(&c, fl, fn);
    built_whole(&r, 9, 12, &fcl);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

/* A clone's first call whose heads move (every head opens a page) appends: pt_reads_from says only
 * each head's entries from its last page on are read, and pt_build reads no other, even with the
 * device full at that call (the clone made its second array; the moved descriptors go there on the
 * device). The entries before those hold other pages, as a caller that fills only the tail leaves
 * them (the CUDA backend's deferred steps), and every descriptor is still right. */
Test(page_tables, a_clones_first_call_reads_only_each_heads_tail_with_the_device_full)
{
    static cache c;
    static rig r;
    static call cl, fcl, left;
    pt_call out;
    first_call(&c, &r, &cl, &out, 3, 11);
    static int fl[H][POOL], fn[H];
    fork_cache(&c, fl, fn);
    cr_assert_eq(pt_clone(&r.tables, 9, 3), PT_OK);
    fork_grows(&c, fl, fn, P, &fcl);
    int64_t from[H];
    cr_assert(pt_reads_from(&r.tables, 9, 11, fcl.hp, H, from), "the clone's first call is an append");
    left = fcl;
    for (int g = 0; g < H; g++)
        for (int64_t j = fcl.hp[g]; j < from[g]; j++) left.list[j] = cl.list[(j + 1) % cl.e];
    r.fail_alloc = 1;
    uint64_t built = r.tables.built, moved = r.tables.moved;
    pt_begin_call(&r.tables, 4096);
    cr_assert_eq(pt_build(&r.tables, 9, 11, left.list, left.e, left.hp, H, NULL, &out), PT_OK);
    send_batch(&r);
    r.fail_alloc = 0;
    expect_device_matches(&fcl, &out, NULL, 0);
    int64_t tail = 0;
    for (int g = 0; g < H; g++) tail += fcl.hp[g + 1] - from[g];
    cr_expect_eq(r.tables.built - built, (uint64_t)tail, "built %lu entries, the tails' %ld",
                 (unsigned long)(r.tables.built - built), (long)tail);
    cr_expect_gt(r.tables.moved, moved, "the heads moved on the device");
    expect_holds_counted(&r);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

/* A fork of a fork: the second clone's record lacks what the first lacked, and its first call
 * still reads each head's last pages only, every descriptor right. Nothing is cloned onto a name
 * that has a list, from a name that has none, from a list whose last call failed, or onto itself;
 * and without device memory the clone is not made (the call builds the list whole). */
Test(page_tables, a_clone_of_a_clone_and_the_clones_not_made)
{
    static cache c;
    static rig r;
    static call cl, fcl;
    pt_call out;
    first_call(&c, &r, &cl, &out, 3, 11);
    static int fl[H][POOL], fn[H], gl[H][POOL], gn[H];
    fork_cache(&c, fl, fn);
    cr_assert_eq(pt_clone(&r.tables, 9, 3), PT_OK);
    fork_grows(&c, fl, fn, 3 * P, &fcl);
    call_ok(&r, 9, 11, &fcl, &out);
    swap_lists(&c, fl, fn);
    fork_cache(&c, gl, gn);   /* forked from the fork */
    swap_lists(&c, fl, fn);
    cr_assert_eq(pt_clone(&r.tables, 10, 9), PT_OK);
    fork_grows(&c, gl, gn, 2, &fcl);
    uint64_t built = r.tables.built;
    int64_t from_last = 0;
    for (int h = 0; h < H; h++) from_last += gn[h] - (fn[h] - 1);
    call_ok(&r, 10, 11, &fcl, &out);
    cr_expect_eq(r.tables.built - built, (uint64_t)from_last);
    expect_holds_counted(&r);
    /* the clones not made */
    uint64_t cloned = r.tables.cloned;
    int n_lists = r.tables.n_lists;
    cr_expect_eq(pt_clone(&r.tables, 10, 3), PT_OK);   /* 10 has a list */
    cr_expect_eq(pt_clone(&r.tables, 11, 77), PT_OK);  /* 77 has none */
    cr_expect_eq(pt_clone(&r.tables, 3, 3), PT_OK);
    cr_expect_eq(r.tables.cloned, cloned);
    cr_expect_eq(r.tables.n_lists, n_lists);
    lose_batch(&r);   /* every list's last call lost: none trusted */
    cr_expect_eq(pt_clone(&r.tables, 12, 3), PT_OK);
    cr_expect_eq(r.tables.cloned, cloned);
    call_ok(&r, 3, 11, &cl, &out);   /* trusted again */
    r.fail_alloc = 1;
    cr_expect_eq(pt_clone(&r.tables, 13, 3), PT_OK);
    r.fail_alloc = 0;
    cr_expect_eq(r.tables.cloned, cloned, "no device memory: no clone");
    built_whole(&r, 13, 11, &cl);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

/* A source list that forks keep copying counts as used each time, so the idle sweep leaves it while
 * other lists' calls go on (forks answered one after another, then a batch of them); one nobody
 * copies goes. */
Test(page_tables, a_list_forks_keep_copying_is_not_idle)
{
    static cache c;
    static rig r;
    static call cl;
    pt_call out;
    first_call(&c, &r, &cl, &out, 3, 11);
    call_ok(&r, 4, 11, &cl, &out);   /* the same pages under a name nobody copies */
    uint64_t cloned = r.tables.cloned;
    for (int i = 0; i < 12; i++) {
        cr_assert_eq(pt_clone(&r.tables, 100 + (uint64_t)i, 3), PT_OK);
        other_pages_called(&r, 9, 100 + (uint64_t)i, 12, &out);   /* the fork's own calls */
        pt_trim(&r.tables, 3);
    }
    cr_expect_eq(r.tables.cloned - cloned, 12 * (uint64_t)cl.e, "every fork found its source");
    cloned = r.tables.cloned;
    cr_assert_eq(pt_clone(&r.tables, 200, 4), PT_OK);
    cr_expect_eq(r.tables.cloned, cloned, "the list nobody copied went idle and was freed");
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

Test(page_tables, out_of_device_memory_for_a_list_is_reported_and_recovers)
{
    static cache c;
    memset(&c, 0, sizeof c);
    static rig r;
    rig_init(&r, 4096);
    for (int h = 0; h < H; h++) append(&c, h, 8 * 30);   /* 30 pages a head: more than a list's first 64 */
    static call cl;
    make_call(&c, &cl, 0, NULL, NULL, 0);
    pt_call out;
    r.fail_alloc = 1;
    pt_begin_call(&r.tables, 4096);
    cr_expect_eq(pt_build(&r.tables, 1, 0, cl.list, cl.e, cl.hp, H, NULL, &out), PT_NO_DEVICE_MEMORY);
    lose_batch(&r);
    r.fail_alloc = 0;
    call_ok(&r, 1, 0, &cl, &out);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

/* The copies of an appended list's earlier pages, which its calls do not look at, are held by its
 * record and outlive the copies' idle sweeps; entries the list no longer has let go of theirs,
 * which then go at the next sweep, and a freed list lets go of all of its own. */
Test(page_tables, copies_a_list_holds_outlive_idle_sweeps_and_go_once_let_go)
{
    static cache c;
    memset(&c, 0, sizeof c);
    static rig r;
    rig_init(&r, 4);   /* a copy unused for 4 calls, and held by no list, is freed */
    for (int h = 0; h < H; h++) append(&c, h, 3 * P);   /* three full pages a head */
    static call cl;
    pt_call out;
    make_call(&c, &cl, 0, NULL, NULL, 0);
    call_ok(&r, 1, 42, &cl, &out);
    cr_assert_eq(r.copies.n, 3 * H);
    for (int step = 0; step < 3 * P; step++) {   /* 24 calls, each looking at each head's last pages only */
        for (int h = 0; h < H; h++) append(&c, h, 1);
        c.next_pos++;
        make_call(&c, &cl, 0, NULL, NULL, 0);
        pt_begin_call(&r.tables, 1000);
        cr_assert_eq(pt_build(&r.tables, 1, 42, cl.list, cl.e, cl.hp, H, NULL, &out), PT_OK);
        send_batch(&r);
        expect_device_matches(&cl, &out, NULL, 0);
        expect_holds_counted(&r);
    }
    cr_expect_eq(r.copies.n, 6 * H, "every page's copy is kept, the first ones unused for 24 calls");
    /* head 0's first two pages leave the list: their entries let go, and a sweep frees them */
    for (int i = 0; i < 2; i++) evict_page(&c, 0, 0);
    c.shape = 43;
    make_call(&c, &cl, 0, NULL, NULL, 0);
    for (int i = 0; i < 6; i++) {
        pt_begin_call(&r.tables, 1000);
        cr_assert_eq(pt_build(&r.tables, 1, 43, cl.list, cl.e, cl.hp, H, NULL, &out), PT_OK);
        send_batch(&r);
        expect_device_matches(&cl, &out, NULL, 0);
        expect_holds_counted(&r);
    }
    cr_expect_eq(r.copies.n, 6 * H - 2, "the two pages no list names went at the sweep");
    /* another list is called, then the first is freed: every copy it held goes at the next sweeps,
     * those the other holds stay */
    other_pages_called(&r, 2, 2, 7, &out);
    pt_trim(&r.tables, 0);
    cr_assert_eq(r.tables.n_lists, 1);
    expect_holds_counted(&r);
    for (int i = 0; i < 10; i++) pt_begin_call(&r.tables, 1000);
    cr_expect_eq(r.copies.n, H, "copies left after their list went: %d", r.copies.n);
    expect_holds_counted(&r);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

Test(page_tables, idle_lists_are_freed)
{
    static cache c;
    memset(&c, 0, sizeof c);
    static rig r;
    rig_init(&r, 4096);
    for (int h = 0; h < H; h++) append(&c, h, 20);
    static call cl;
    make_call(&c, &cl, 0, NULL, NULL, 0);
    pt_call out;
    for (int name = 1; name <= 3; name++) call_ok(&r, (uint64_t)name, 0, &cl, &out);
    uint64_t three = r.tables.bytes;
    for (int i = 0; i < 10; i++) call_ok(&r, 1, 0, &cl, &out);
    pt_trim(&r.tables, 5);
    cr_expect_eq(r.tables.bytes * 3, three, "the two lists unused for 10 calls were freed");
    call_ok(&r, 2, 0, &cl, &out);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

/* pt_release_all frees every list and page copy at once, and the tables work on: the same lists
 * called again are built and sent whole (every row again), each descriptor right, and a list of the
 * same name over other pages too. */
Test(page_tables, releasing_everything_frees_every_list_and_copy_and_both_work_on)
{
    static cache c;
    memset(&c, 0, sizeof c);
    static rig r;
    rig_init(&r, 4096);
    for (int h = 0; h < H; h++) append(&c, h, 29);
    static call cl;
    make_call(&c, &cl, 0, NULL, NULL, 0);
    pt_call out;
    for (int name = 1; name <= 2; name++) call_ok(&r, (uint64_t)name, 7, &cl, &out);
    cr_assert_gt(r.tables.bytes, 0);
    cr_assert_gt(r.copies.bytes, 0);
    uint64_t rows = r.copies.rows_uploaded;
    cr_expect_eq(rows, (uint64_t)(29 * H), "each row went up once");
    pt_release_all(&r.tables);
    cr_expect_eq(r.tables.bytes, 0);
    cr_expect_eq(r.copies.bytes, 0);
    cr_expect_eq(r.tables.n_lists, 0);
    cr_expect_eq(r.copies.n, 0);
    cr_expect_eq(live_blocks, 0, "device memory still held");
    /* the same list under the same name and shape: nothing of before is trusted */
    call_ok(&r, 1, 7, &cl, &out);
    cr_expect_eq(r.copies.rows_uploaded - rows, (uint64_t)(29 * H), "the rows were not sent again");
    for (int step = 0; step < 5; step++) {   /* and it keeps up with appends as before */
        for (int h = 0; h < H; h++) append(&c, h, 1);
        c.next_pos++;
        make_call(&c, &cl, 0, NULL, NULL, 0);
        call_ok(&r, 1, 7, &cl, &out);
    }
    /* other pages under a name the released set had */
    other_pages_called(&r, 11, 2, 9, &out);
    pt_release_all(&r.tables);
    pt_release_all(&r.tables);   /* twice: nothing left to free */
    cr_expect_eq(live_blocks, 0);
    rig_free(&r);
    cr_expect_eq(live_blocks, 0);
}

/* Pieces of any alignment land where they should, copies and references (ub_add_ref) mixed: a
 * copied piece keeps the bytes it was given, a referenced one takes its source's bytes as they are
 * when the batch is packed. */
Test(upload_batch, pieces_of_any_alignment_land_where_they_should)
{
    ub_batch b = { 0 };
    enum { N = 65536 };
    static unsigned char dst[N], want[N], src[N];
    memset(dst, 0, sizeof dst);
    memset(want, 0, sizeof want);
    for (int i = 0; i < N; i++) src[i] = (unsigned char)rnd();
    /* 16-byte, 4-byte and 1-byte destinations and lengths, one zero-length piece, and one of
     * 40,000 bytes that goes as three pieces of at most UB_CHUNK; every other one referenced */
    size_t at[] = { 0, 64, 130, 260, 1001, 2048, 3000, 8192 }, len[] = { 48, 33, 8, 700, 17, 0, 1000, 40000 };
    for (int i = 0; i < 8; i++) {
        const unsigned char *from = src + i * 3000;
        cr_assert_eq(i % 2 ? ub_add_ref(&b, dst + at[i], from, len[i]) : ub_add(&b, dst + at[i], from, len[i]), 0);
        if (i % 2 == 0) memcpy(want + at[i], from, len[i]);
    }
    cr_expect_eq(b.n, 6 + 3, "the empty piece queued nothing, the long one three");
    cr_expect_eq(b.held, 48 + 8 + 17 + 1000, "only the copied pieces' bytes are held");
    for (int64_t i = 0; i < b.n; i++) cr_expect_leq(b.pieces[i].bytes, UB_CHUNK);
    for (int i = 0; i < N; i++) src[i] ^= 0x5a;   /* the sources change before the batch goes */
    for (int i = 1; i < 8; i += 2) memcpy(want + at[i], src + i * 3000, len[i]);
    size_t bytes = ub_packed_bytes(&b);
    unsigned char *buf = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
    cr_assert(buf);
    memset(buf, 0xee, bytes);
    ub_pack(&b, buf);
    const ub_piece *tab = (const ub_piece *)(buf + ub_table_offset(&b));
    for (int64_t i = 0; i < b.n; i++) {
        cr_expect_eq(tab[i].off % 16, 0);
        for (int tid = 0; tid < 5; tid++) ub_scatter_piece(buf, &tab[i], tid, 5);
    }
    cr_expect(!memcmp(dst, want, sizeof dst));
    ub_clear(&b, 1);
    cr_expect_eq(b.sends, 1);
    cr_expect_eq(b.sent_pieces, 9);
    cr_expect(b.held == 0 && b.len == 0 && b.n == 0);
    free(buf);
    ub_free(&b);
}

/* A batch rides in the scatter launch's parameters (ub_inline_size) when its packed form fits one of
 * the three sizes, the smallest that holds it; packed into a parameter block of exactly that size
 * (the rest of it left as the launch finds it), the pieces land as from a copied batch. Sizes near
 * each boundary, a decode step's layer on the default model (a head: two rows of 512 bytes, a
 * position, a descriptor) and on the 7B shape (eight heads, rows of 256 bytes), 18 heads' worth,
 * and one too large for any. */
Test(upload_batch, a_small_batch_rides_in_the_smallest_parameter_size_that_holds_it)
{
    cr_expect_eq(ub_inline_size(0), UB_INLINE_SMALL);
    cr_expect_eq(ub_inline_size(UB_INLINE_SMALL), UB_INLINE_SMALL);
    cr_expect_eq(ub_inline_size(UB_INLINE_SMALL + 1), UB_INLINE_MEDIUM);
    cr_expect_eq(ub_inline_size(UB_INLINE_MEDIUM), UB_INLINE_MEDIUM);
    cr_expect_eq(ub_inline_size(UB_INLINE_MEDIUM + 1), UB_INLINE_LARGE);
    cr_expect_eq(ub_inline_size(UB_INLINE_LARGE), UB_INLINE_LARGE);
    cr_expect_eq(ub_inline_size(UB_INLINE_LARGE + 1), 0, "too large: copied");
    enum { N = 70000 };
    static unsigned char dst[N], want[N], src[N];
    const int heads[] = { 1, 8, 18, 40 };
    const size_t row[] = { 512, 256, 512, 512 }, expect[] = { UB_INLINE_SMALL, UB_INLINE_MEDIUM, UB_INLINE_LARGE, 0 };
    for (int c = 0; c < 4; c++) {
        ub_batch b;
        memset(&b, 0, sizeof b);
        memset(dst, 0, sizeof dst);
        memset(want, 0, sizeof want);
        for (int i = 0; i < N; i++) src[i] = (unsigned char)rnd();
        for (int h = 0; h < heads[c]; h++) {   /* a head's key and value rows, position, descriptor */
            const size_t at = (size_t)h * 1200, len[] = { row[c], row[c], 4, 48 },
                         off[] = { 0, row[c], 2 * row[c], 2 * row[c] + 16 };
            for (int k = 0; k < 4; k++) {
                cr_assert_eq(k % 2 ? ub_add_ref(&b, dst + at + off[k], src + at + off[k], len[k])
                                   : ub_add(&b, dst + at + off[k], src + at + off[k], len[k]),
                             0);
                memcpy(want + at + off[k], src + at + off[k], len[k]);
            }
        }
        /* a descriptor moved on the device: read from dst itself, where nothing else in the batch writes */
        memcpy(dst + 60000, src + 60000, 96);
        memcpy(want + 61000, src + 60000, 96);
        memcpy(want + 60000, src + 60000, 96);
        cr_assert_eq(ub_add_dev(&b, dst + 61000, dst + 60000, 96), 0);
        const size_t bytes = ub_packed_bytes(&b), size = ub_inline_size(bytes);
        cr_expect_eq(size, expect[c], "%d heads: %zu bytes packed ride in %zu", heads[c], bytes, size);
        if (!size) {
            ub_free(&b);
            continue;
        }
        cr_expect_leq(bytes, size);
        /* the launch's parameter block, then guard bytes: packing writes nothing past `bytes` */
        unsigned char *param = aligned_alloc(16, size + 256);
        cr_assert(param);
        memset(param, 0xee, size + 256);
        ub_pack(&b, param);
        for (size_t i = bytes; i < size + 256; i++)
            if (param[i] != 0xee) {
                cr_expect_fail("%d heads: byte %zu past the packed %zu was written", heads[c], i, bytes);
                break;
            }
        const ub_piece *tab = (const ub_piece *)(param + ub_table_offset(&b));
        for (int64_t i = 0; i < b.n; i++)
            for (int tid = 0; tid < 4; tid++) ub_scatter_piece(param, &tab[i], tid, 4);
        cr_expect(!memcmp(dst, want, sizeof dst), "%d heads: the pieces differ from what was queued", heads[c]);
        free(param);
        ub_free(&b);
    }
}

typedef struct rounds {
    ub_batch b;
    int flushes;
    int refuse;   /* the flush fails (a full staging arena) */
} rounds;

/* Send what is queued now: scatter it, in order. */
static int send_round(void *ud)
{
    rounds *r = ud;
    if (r->refuse) return -1;
    r->flushes++;
    size_t bytes = ub_packed_bytes(&r->b);
    unsigned char *buf = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
    cr_assert(buf);
    ub_pack(&r->b, buf);
    const ub_piece *tab = (const ub_piece *)(buf + ub_table_offset(&r->b));
    for (int64_t i = 0; i < r->b.n; i++) ub_scatter_piece(buf, &tab[i], 0, 1);
    ub_clear(&r->b, 1);
    free(buf);
    return 0;
}

Test(upload_batch, a_batch_past_its_limit_goes_in_rounds_in_order)
{
    static rounds r;
    memset(&r, 0, sizeof r);
    r.b.limit = 10000;
    r.b.flush = send_round;
    r.b.flush_ud = &r;
    static unsigned char dst[100000], src[100000];
    for (int i = 0; i < 100000; i++) src[i] = (unsigned char)rnd();
    /* 60,000 bytes in pieces of 3,000 (every other one referenced), then the first 3,000 again
     * from elsewhere: order matters */
    for (int i = 0; i < 20; i++)
        cr_assert_eq(i % 2 ? ub_add_ref(&r.b, dst + i * 3000, src + i * 3000, 3000)
                           : ub_add(&r.b, dst + i * 3000, src + i * 3000, 3000),
                     0);
    cr_assert_eq(ub_add(&r.b, dst, src + 90000, 3000), 0);
    cr_expect_leq(ub_packed_bytes(&r.b), 10000 + 16 + 8 * sizeof(ub_piece), "never more than the limit queued");
    cr_assert_eq(send_round(&r), 0);
    cr_expect_geq(r.flushes, 7);
    cr_expect(!memcmp(dst, src + 90000, 3000), "the later copy landed last");
    cr_expect(!memcmp(dst + 3000, src + 3000, 57000));
    /* a flush that fails fails the add */
    r.refuse = 1;
    int rc = 0;
    for (int i = 0; i < 10 && !rc; i++) rc = ub_add(&r.b, dst, src, 3000);
    cr_expect_eq(rc, -1);
    ub_free(&r.b);
}
