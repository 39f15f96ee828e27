/* page_tables_bench.c - the host's share of a CUDA attention call, measured without a GPU.
 *
 * Before every decode attention call the CUDA backend turns the forward pass's page list into the
 * descriptors the kernels read and sends the rows the pages gained. This times that work on this
 * machine's CPU, with host memory standing in for the device (kernels/page_tables.c,
 * kernels/page_copies.c, kernels/upload_batch.c as the backend runs them), for a decode step of a
 * 7B-shaped model (8 KV heads, head dimension 128, pages of 32 tokens) at several context lengths:
 *   kept      the descriptors kept on the device: a step sends the pages that grew; with "shape"
 *             (the forward pass's promise that the list only grew at each head's end, what runs
 *             for lists of every page) only each head's last pages are looked at, without it
 *             (a policy's selection) every entry is compared;
 *   boundary  a step whose token opened a new page in every head (once every 32 steps: the later
 *             heads' entries move);
 *   whole     the list built whole, every entry through the page-copy table (what every call did
 *             before the descriptors were kept, less its per-piece copies);
 *   restored  the list built whole and every page's rows sent, in rounds of 32 MiB as the backend
 *             sends them: a layer of a restored snapshot placed on the device (be_ops.place_pages),
 *             or the first call after a restore that was not placed (milliseconds: the host's
 *             packing of the rows, which a GPU's copies overlap).
 * Each line: microseconds a layer call (the median), the list's entries and the pieces the batch
 * carried. The device copies a decode call issues for its pages are now two (the batch and its
 * scatter kernel); before they were three a page that grew (keys, values, positions: one page a
 * KV head) and two for the descriptors and offsets, 26 a layer here, 832 a 32-layer step.
 * Usage: page_tables_bench [CONTEXT ...]   (default 2048 8192 32768) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_time.h"
#include "kernels/page_tables.h"

enum { HKV = 8, D = 128, P = 32, STEPS = 64 };

static void *h_alloc(void *ud, size_t bytes) { return malloc(bytes); }
static void h_release(void *ud, void *p) { free(p); }
/* as the CUDA backend queues page rows: read from the pages when the batch is packed */
static int q_upload(void *ud, void *dst, const void *src, size_t bytes) { return ub_add_ref(ud, dst, src, bytes); }

typedef struct rig {
    ub_batch batch;
    pc_table copies;
    pt_set tables;
    unsigned char *packed;
    size_t cap_packed;
} rig;

/* The host's share of sending the batch: packing it into the staging buffer. */
static void pack(rig *r);
static int flush_round(void *ud)
{
    pack((rig *)ud);
    return 0;
}

static void pack(rig *r)
{
    size_t bytes = ub_packed_bytes(&r->batch);
    if (bytes > r->cap_packed) {
        free(r->packed);
        r->cap_packed = bytes * 2;
        r->packed = malloc(r->cap_packed);
        if (!r->packed) {
            fprintf(stderr, "page_tables_bench: out of memory\n");
            exit(1);
        }
    }
    ub_pack(&r->batch, r->packed);
    ub_clear(&r->batch, 1);
}

static int run(int64_t ctx, int shape_given)
{
    int64_t pages = (ctx + 3 * STEPS + P - 1) / P + 2;   /* room for the steps' tokens */
    size_t page_vals = (size_t)P * D;
    uint16_t *kv = calloc((size_t)(HKV * pages) * 2 * page_vals, sizeof(uint16_t));
    int32_t *pos = calloc((size_t)(HKV * pages) * P, sizeof(int32_t));
    be_kv_page *list = calloc((size_t)(HKV * pages), sizeof *list);
    if (!kv || !pos || !list) {
        fprintf(stderr, "page_tables_bench: out of memory for %lld tokens\n", (long long)ctx);
        return 1;
    }
    /* rows in memory of their own, as a cache's are (untouched, calloc's pages would all read as
     * the one zero page, from the processor's caches) */
    for (size_t i = 0; i < (size_t)(HKV * pages) * 2 * page_vals; i++) kv[i] = (uint16_t)(i * 2654435761u >> 16);
    for (size_t i = 0; i < (size_t)(HKV * pages) * P; i++) pos[i] = (int32_t)i;
    int32_t n_tok = (int32_t)ctx;
    rig r;
    memset(&r, 0, sizeof r);
    pc_device pd = { &r.batch, h_alloc, h_release, q_upload };
    pc_init(&r.copies, &pd, 1u << 30);
    pt_device td = { NULL, h_alloc, h_release };
    pt_init(&r.tables, &td, &r.copies, &r.batch);
    r.batch.limit = (size_t)32 << 20;   /* the CUDA backend's rounds */
    r.batch.flush = flush_round;
    r.batch.flush_ud = &r;
    int64_t hp[HKV + 1], e = 0;
    const char *modes[] = { "kept", "boundary", "whole", "restored" };
    double t[4][STEPS];
    int nt[4] = { 0, 0, 0, 0 };
    uint64_t pieces[4] = { 0, 0, 0, 0 }, bytes[4] = { 0, 0, 0, 0 };
    int64_t entries = 0;
    for (int step = -1; step < 3 * STEPS && (nt[0] < STEPS || nt[1] < 8 || nt[2] < 8 || nt[3] < 8); step++) {
        /* the list the forward pass hands the call: every page of every head, the last one partial */
        e = 0;
        int64_t n_pages = (n_tok + P - 1) / P;
        for (int g = 0; g < HKV; g++) {
            hp[g] = e;
            for (int64_t j = 0; j < n_pages; j++) {
                int64_t pi = (int64_t)g * pages + j;
                int32_t n = j < n_pages - 1 ? P : n_tok - (int32_t)(j * P);
                list[e++] = (be_kv_page){ kv + (size_t)pi * 2 * page_vals, kv + ((size_t)pi * 2 + 1) * page_vals,
                                          pos + (size_t)pi * P, NULL, NULL, n, D, 0, (uint64_t)pi + 1, P, NULL };
            }
        }
        hp[HKV] = e;
        int mode = step >= 0 && step % 7 == 3 ? 2 : step >= 0 && step % 7 == 5 ? 3 : n_tok % P == 1 ? 1 : 0;
        if (mode >= 2) pt_forget(&r.tables);   /* every entry built, as before */
        if (mode == 3) pc_forget_rows(&r.copies);   /* and every row sent */
        pt_call out;
        pt_begin_call(&r.tables, 1u << 30);
        uint64_t pieces0 = r.batch.sent_pieces, bytes0 = r.batch.sent_bytes;
        double t0 = bench_now_us();
        if (pt_build(&r.tables, 1, shape_given ? 77 : 0, list, e, hp, HKV, NULL, &out) != PT_OK) {
            fprintf(stderr, "page_tables_bench: pt_build failed\n");
            return 1;
        }
        pack(&r);
        double dt = bench_now_us() - t0;
        if (step >= 0 && nt[mode] < STEPS) {
            t[mode][nt[mode]++] = dt;
            pieces[mode] = r.batch.sent_pieces - pieces0;
            bytes[mode] = r.batch.sent_bytes - bytes0;
        }
        entries = e;
        n_tok++;   /* the step's token */
    }
    for (int m = 0; m < 4; m++) {
        double med = bench_median(t[m], nt[m]);
        if (shape_given && m >= 2) continue;   /* the same as without */
        if (m == 3)
            printf("%6lld tokens  %-8s %-9s %8.1f ms a layer, %.2f GB/s  (%lld entries, %llu pieces)\n", (long long)ctx,
                   modes[m], "", med / 1e3, (double)bytes[m] / (med * 1e3),
                   (long long)entries, (unsigned long long)pieces[m]);
        else
            printf("%6lld tokens  %-8s %-9s %8.1f us a layer call  (%lld entries, %llu pieces in the batch)\n",
                   (long long)ctx, modes[m], m == 2 ? "" : shape_given ? "shape" : "no shape", med, (long long)entries,
                   (unsigned long long)pieces[m]);
    }
    pt_free(&r.tables);
    pc_free(&r.copies);
    ub_free(&r.batch);
    free(r.packed);
    free(kv);
    free(pos);
    free(list);
    return 0;
}

int main(int argc, char **argv)
{
    int64_t def[] = { 2048, 8192, 32768 };
    int n = argc > 1 ? argc - 1 : 3;
    for (int i = 0; i < n; i++) {
        char *end = NULL;
        long long c = argc > 1 ? strtoll(argv[i + 1], &end, 10) : def[i];
        if (argc > 1 && (end == argv[i + 1] || *end || c < 1 || c > 1 << 20)) {
            fprintf(stderr, "page_tables_bench: argument %d is not a context length from 1 to 1048576\n", i + 1);
            return 2;
        }
        if (run((int64_t)c, 0) || run((int64_t)c, 1)) return 1;
    }
    return 0;
}
