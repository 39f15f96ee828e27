/* SentKV's choice (engine/policy/sentkv.c) against its rule written plainly: every finished segment
 * bounded, all of them sorted (larger bound first, lower index first), taken whole in that order
 * while they fit the budget left after the sinks and the unfinished tail, and each page's mask read
 * token by token; a segment that ends with the step's own key (not in the cache until the step's
 * layers have run) belongs to the tail until the next step. The policy ranks lazily, keeps its
 * lists between steps and reads pages from their spans; over decodes, rewinds and an eviction
 * before them (pages of scattered positions, the decode's rows appended after them), its selection
 * must be this one, entry by entry. (An eviction after a segment is summarized leaves its summary
 * as taken, which the rule here would recompute.) */
#include <criterion/criterion.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "engine/kvcache.h"
#include "engine/policy/policy.h"
#include "engine/policy/sentkv.h"
#include "kernels/backend.h"
#include "tests/fwd_fixture.h"

enum { LAYERS = 2, H = 2, G = 2, D = 8, VOCAB = 4, MAXT = 700 };

static const float boundary[VOCAB] = { 0, 1.0f, 0.3f, 0.9f };

static uint64_t next(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return *r >> 33;
}

static const float *rank_score;

static int by_rank(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    float x = rank_score[i], y = rank_score[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

/* The rule's selection for layer il, KV head h, as text: "page:mask" entries ("-" for a whole page). */
static void reference(kv_cache *kv, be_backend *b, int il, const float *q, const int32_t *tok, int64_t cur, int len,
                      int delta, int sinks, int64_t budget, char out[H][4096])
{
    int64_t ends[MAXT];
    int64_t n_seg = sentkv_split(boundary, tok, cur + 1, 0, len, delta, 0, ends, MAXT);
    while (n_seg > 0 && ends[n_seg - 1] > cur) n_seg--;   /* one ending with the step's own key: the tail's */
    cr_assert(n_seg > 0);
    float *mm = malloc(sizeof(float) * (size_t)(H * n_seg * 2 * D));
    be_summary *sum = malloc(sizeof *sum * (size_t)(H * n_seg));
    float *u = malloc(sizeof(float) * (size_t)(H * n_seg));
    int64_t off[H + 1], *order = malloc(sizeof(int64_t) * (size_t)n_seg);
    cr_assert(mm && sum && u && order);
    for (int64_t i = 0; i < H * n_seg * 2 * D; i++) mm[i] = ((i / D) % 2) ? -FLT_MAX : FLT_MAX;
    for (int h = 0; h < H; h++) {
        off[h] = h * n_seg;
        for (int i = 0; i < kv_n_pages(kv, il, h); i++) {
            const kv_page *p = kv_layer_page(kv, il, h, i);
            for (int t = 0; t < p->n; t++) {
                int64_t sg = 0;
                while (sg < n_seg && p->pos[t] >= ends[sg]) sg++;
                if (sg == n_seg) continue;
                float *o = mm + (h * n_seg + sg) * 2 * D;
                for (int d = 0; d < D; d++) {
                    float x = quant_fp16_to_f32(p->k[(size_t)t * D + d]);
                    if (x < o[d]) o[d] = x;
                    if (x > o[D + d]) o[D + d] = x;
                }
            }
        }
        for (int64_t sg = 0; sg < n_seg; sg++) {
            const float *o = mm + (h * n_seg + sg) * 2 * D;
            sum[h * n_seg + sg] = (be_summary){ .mn = o, .mx = o + D };
        }
    }
    off[H] = H * n_seg;
    be_bounds r = { .q = q, .n_head_kv = H, .group = G, .dim = D, .sum = sum, .off = off, .u = u };
    b->ops->bound_pages(b, &r);
    int64_t n = cur + 1, tail = ends[n_seg - 1];
    for (int h = 0; h < H; h++) {
        unsigned char on[MAXT + 1] = { 0 };
        for (int64_t p = 0; p < n; p++) on[p] = p < sinks || p >= tail;
        int64_t room = budget - ((n - tail) + (sinks < tail ? sinks : tail)), used = 0;
        for (int64_t i = 0; i < n_seg; i++) order[i] = i;
        rank_score = u + off[h];
        qsort(order, (size_t)n_seg, sizeof *order, by_rank);
        for (int64_t i = 0; i < n_seg && used < room; i++) {
            int64_t sg = order[i], a = sg ? ends[sg - 1] : 0, e = ends[sg];
            if (used + (e - a) > room) continue;
            for (int64_t p = a; p < e; p++) on[p] = 1;
            used += e - a;
        }
        size_t o = 0;
        out[h][0] = 0;
        for (int i = 0; i < kv_n_pages(kv, il, h); i++) {
            const kv_page *p = kv_layer_page(kv, il, h, i);
            uint64_t m[2] = { 0, 0 };
            int cnt = 0;
            for (int t = 0; t < p->n; t++)
                if (p->pos[t] < n && on[p->pos[t]]) {
                    m[t >> 6] |= 1ull << (t & 63);
                    cnt++;
                }
            if (!cnt) continue;
            if (cnt == p->n) o += (size_t)snprintf(out[h] + o, 4096 - o, "%d:- ", i);
            else
                o += (size_t)snprintf(out[h] + o, 4096 - o, "%d:%llx,%llx ", i, (unsigned long long)m[0],
                                      (unsigned long long)m[1]);
            cr_assert(o < 4000);
        }
    }
    free(mm);
    free(sum);
    free(u);
    free(order);
}

/* The policy's selection in the same text. */
static void chosen(const pol_sel *sel, kv_cache *kv, int il, char out[H][4096])
{
    int pw = (kv_page_size(kv) + 63) / 64;
    for (int h = 0; h < H; h++) {
        size_t o = 0;
        out[h][0] = 0;
        int64_t s0 = sel->per_head ? sel->off[h] : 0, s1 = sel->per_head ? sel->off[h + 1] : sel->off[1];
        for (int64_t j = s0; j < s1; j++) {
            if (!sel->mask[j]) {
                o += (size_t)snprintf(out[h] + o, 4096 - o, "%d:- ", sel->idx[j]);
                continue;
            }
            uint64_t m[2] = { sel->mask[j][0], pw > 1 ? sel->mask[j][1] : 0 };
            int n = kv_layer_page(kv, il, h, sel->idx[j])->n;   /* bits past the page's tokens mean nothing */
            if (n < 64) m[0] &= (1ull << n) - 1;
            if (n < 128 && n > 64) m[1] &= (1ull << (n - 64)) - 1;
            if (n <= 64) m[1] = 0;
            o += (size_t)snprintf(out[h] + o, 4096 - o, "%d:%llx,%llx ", sel->idx[j], (unsigned long long)m[0],
                                  (unsigned long long)m[1]);
        }
    }
}

/* One head's tokens: a random half kept (pages of scattered positions). */
static void evict(kv_cache *kv, int il, int h, uint64_t *r)
{
    int64_t n = kv_head_tokens(kv, il, h), m = 0;
    int64_t *keep = malloc(sizeof(int64_t) * (size_t)(n + 1));
    cr_assert(keep);
    for (int64_t t = 0; t < n; t++)
        if (next(r) % 2) keep[m++] = t;
    cr_assert(kv_keep_tokens(kv, il, h, keep, m) == 0);
    free(keep);
}

static void run_case(int page, uint64_t seed)
{
    char err[256];
    uint64_t r = seed;
    /* one thread, or three: the summaries are folded a (layer, head) a task on the backend's threads */
    be_backend *b = be_cpu_create(seed % 2 ? 3 : 1, err, sizeof err);
    cr_assert(b, "%s", err);
    kv_cache *kv = kv_create(LAYERS, MAXT + 8, H, D, page, NULL, err, sizeof err);
    cr_assert(kv, "%s", err);
    int global[LAYERS] = { 0, 1 };
    pol_env env = { kv, b, H * G, H, D, global, LAYERS, boundary, VOCAB, NULL, NULL, NULL, NULL, 0, NULL, NULL };
    int len = 4 + (int)(next(&r) % 12), delta = 1 + (int)(next(&r) % 6), sinks = (int)(next(&r) % 6);
    char spec[128];
    snprintf(spec, sizeof spec, "sentkv:len=%d,delta=%d,sinks=%d,budget=%d", len, delta, sinks,
             sinks + len + delta + 1 + (int)(next(&r) % 120));
    pol_spec ps_spec;
    cr_assert(pol_parse(&ps_spec, spec, NULL, err, sizeof err) == 0, "%s", err);
    pol_set *ps = pol_set_create(&ps_spec, &env, err, sizeof err);
    cr_assert(ps, "%s", err);
    int64_t budget = 0;
    sscanf(strstr(spec, "budget=") + 7, "%lld", (long long *)&budget);
    int32_t tok[MAXT + 1];
    int64_t n0 = 150 + (int64_t)(next(&r) % 200);
    for (int64_t i = 0; i < n0; i++) tok[i] = (int32_t)(next(&r) % VOCAB);
    fwd_fixture_random_keys(kv, LAYERS, n0, &r);
    pol_set_begin(ps, tok, n0, 0, 0);
    if (next(&r) % 2) evict(kv, 1, (int)(next(&r) % H), &r);   /* another policy evicted before the decode */
    float q[H * G * D];
    int selected = 0;
    for (int step = 0; step < 60; step++) {
        int64_t pos = kv_len(kv);
        if (step % 20 == 19 && pos > 40) {   /* a rewind: the segments past it are forgotten */
            pos -= 1 + (int64_t)(next(&r) % 30);
            kv_rewind(kv, pos);
        }
        tok[pos] = (int32_t)(next(&r) % VOCAB);
        pol_set_begin(ps, &tok[pos], 1, pos, 1);
        for (int i = 0; i < H * G * D; i++) q[i] = (float)(next(&r) % 2001) / 1000.0f - 1.0f;
        for (int il = 0; il < LAYERS; il++) {
            const pol_sel *sel = pol_set_select(ps, il, q);
            if (pos + 1 <= budget) {
                cr_assert(!sel, "step %d: a context within the budget is attended whole", step);
                continue;
            }
            cr_assert(sel, "step %d, layer %d: no selection at %lld tokens over a budget of %lld", step, il,
                      (long long)(pos + 1), (long long)budget);
            char want[H][4096], got[H][4096];
            chosen(sel, kv, il, got);
            reference(kv, b, il, q, tok, pos, len, delta, sinks, budget, want);
            for (int h = 0; h < H; h++)
                cr_assert(!strcmp(got[h], want[h]), "%s, pages of %d, step %d, layer %d, head %d:\n%s\nthe rule:\n%s",
                          spec, page, step, il, h, got[h], want[h]);
            selected++;
        }
        fwd_fixture_random_keys(kv, LAYERS, 1, &r);   /* the step's row, as the forward pass takes it */
    }
    cr_assert(selected > 40, "%s: %d selections compared", spec, selected);
    pol_set_free(ps);
    kv_free(kv);
    be_free(b);
}

Test(sentkv, the_choice_is_the_rule_written_plainly)
{
    static const int pages[] = { 1, 8, 32, 63, 64, 65, 70, 128 };   /* masks of one and two words */
    for (int i = 0; i < 8; i++)
        for (uint64_t seed = 1; seed <= 12; seed++) run_case(pages[i], seed * 7919 + (uint64_t)i);
}
