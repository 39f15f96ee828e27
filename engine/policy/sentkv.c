/* sentkv.c - SentKVCompress: sentence-level selection.
 *
 * The token stream is cut into sentence-like segments (sentkv_split: target length L, a boundary
 * searched within +-Delta of the ideal end, scored 0.7 * S(b) + 0.3 * (1 - |ideal - b| / Delta) with the
 * model's boundary weights S, else a cut at the ideal end). Each finished segment gets, per global
 * layer and KV head, the element-wise min and max of its keys. At every decode step and global layer,
 * each KV head scores the segments by the upper bound sum_i max(q_i min_i, q_i max_i) (summed over the
 * query heads sharing it), and attends to the tokens of the best segments up to the budget, plus the
 * first `sinks` tokens and the tokens of the unfinished tail, through token masks. Tokens gathered at
 * the previous step are counted: the reuse rate says how much a fetch-the-difference transfer (the
 * GPU build's CPU offload) would save. Selection only: every page stays in memory. */
#include "engine/policy/policy.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bits.h"
#include "engine/page_list.h"
#include "engine/policy/pol_util.h"
#include "engine/policy/sentkv.h"
#include "engine/policy/trace.h"
#include "kernels/backend.h"

enum { P_LEN, P_DELTA, P_BUDGET, P_SINKS, P_COUNT };

static const pol_param params[] = {
    [P_LEN] = { "len", POL_INT, 14, 2, 1024, NULL, "target segment length L (tokens)" },
    [P_DELTA] = { "delta", POL_INT, 8, 1, 512, NULL, "boundary search window +-Delta around the ideal end" },
    [P_BUDGET] = { "budget", POL_FLOAT, 1024, 0, 1e9, NULL, "tokens attended per layer and KV head (fraction or count)" },
    [P_SINKS] = { "sinks", POL_INT, 4, 0, 1 << 20, NULL, "first tokens always attended" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "sentkv: one entry per parameter");

int64_t sentkv_split(const float *weight, const int32_t *tok, int64_t n, int64_t start, int len, int delta, int flush,
                     int64_t *ends, int64_t max_ends)
{
    int64_t s = start, k = 0;
    while (s < n && k < max_ends) {
        int64_t ideal = s + len;                 /* exclusive end of an ideal segment */
        int64_t lo = ideal - delta, hi = ideal + delta;
        if (lo < s + 1) lo = s + 1;
        if (hi > n && !flush) break;             /* the window is not complete yet */
        int64_t best = -1;
        float best_score = -FLT_MAX;
        for (int64_t end = lo; end <= hi && end <= n; end++) {
            float w = tok[end - 1] >= 0 ? weight[tok[end - 1]] : 0;   /* ends after a boundary token (-1: unknown) */
            if (w <= 0) continue;
            float sc = 0.7f * w + 0.3f * (1.0f - (float)llabs(ideal - end) / (float)delta);
            if (sc > best_score) {
                best_score = sc;
                best = end;
            }
        }
        int64_t end = best >= 0 ? best : (ideal < n ? ideal : n);
        ends[k++] = end;
        s = end;
    }
    return k;
}

/* A global layer's summaries of every segment a head for a bounds call, head g's n at g * stride
 * (be_bounds.end: room for more after each head's): kept while the segments' storage and SentKV's
 * shape are those they were written from, so a step writes only the segments finished since, a
 * summary a head (every len tokens or so), instead of every one. */
typedef struct seg_sums {
    be_summary *sum;
    int64_t n, stride;
    const float *mm;
    const be_summary_run *runs;
    uint64_t shape;
} seg_sums;

typedef struct st_sent {
    int len, delta, sinks;
    double budget;
    int32_t *tok;            /* token ids by position */
    int64_t n_tok, cap_tok;
    int64_t *seg_end;        /* finished segments: [seg_start, seg_end) with seg_start = previous end */
    int64_t n_seg, cap_seg;
    float *mm;               /* per segment: [n_global][n_head_kv][2][D] min then max */
    int64_t cap_mm;          /* segments mm, n_runs and runs have room for (runs NULL after a restore) */
    /* On a device backend (one that binds: it keeps copies of the pages), where each summary's rows
     * are, so that the device folds it from its copies instead of receiving it (be_summary.runs):
     * per segment and (global layer, KV head) up to runs_per runs, n_runs of them (0: none known,
     * as after a restore; -1: more than runs_per; either way the summary is sent). runs_per 0: not
     * kept. */
    be_summary_run *runs;
    int32_t *n_runs;
    int runs_per;
    int64_t n_summ;          /* segments summarized */
    int64_t cur;
    /* per global layer x KV head: last step's selection bitmap over positions (reuse rate) */
    uint64_t **prev;
    int64_t *prev_words;      /* each slot's room, in words */
    int64_t *prev_len;        /* the words of it the last step wrote */
    uint64_t *now;
    int64_t now_words;
    uint64_t *masks;
    size_t mask_cap;
    float *score;            /* [n_head_kv][stride]: each head's segment bounds (the trace's) */
    page_spans *spans;       /* [n_global] where each global layer's pages are, kept from step to step */
    seg_sums *lists;         /* [n_global] each global layer's segment summaries, for the backend */
    int64_t *off, *end;      /* [n_head_kv + 1], [n_head_kv]: the bounds call's heads (be_bounds) */
    int64_t score_cap;
    uint64_t *sgen;          /* per summarized segment: its summaries' generation (be_summary.gen) */
    int64_t cap_sgen;
    uint64_t shape;          /* new whenever segments are forgotten (be_bounds.shape) */
    uint64_t serial;         /* its lists' share of the backend's names (pol_bounds_table) */
    double reused, gathered;
    int64_t tokens_last;
    int n_slots, n_spans;
    int64_t summ_per;        /* floats of one segment's summaries: [n_global][n_head_kv][2][D] */
} st_sent;

static int se_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    st_sent *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->len = (int)vals[P_LEN];
    s->delta = (int)vals[P_DELTA];
    s->budget = vals[P_BUDGET];
    s->sinks = (int)vals[P_SINKS];
    int slots = env->n_global * env->n_head_kv;
    s->n_slots = slots;
    s->summ_per = (int64_t)slots * 2 * kv_head_dim(env->kv);
    if (env->b && env->b->ops->bind) {   /* a segment's rows: within len + delta consecutive positions */
        int page = kv_page_size(env->kv);
        s->runs_per = (s->len + s->delta + page - 1) / page + 1;
    }
    s->prev = calloc((size_t)(slots > 0 ? slots : 1), sizeof *s->prev);
    s->prev_words = calloc((size_t)(slots > 0 ? slots : 1), sizeof *s->prev_words);
    s->prev_len = calloc((size_t)(slots > 0 ? slots : 1), sizeof *s->prev_len);
    s->off = malloc(sizeof(int64_t) * (size_t)(env->n_head_kv + 1));
    s->end = malloc(sizeof(int64_t) * (size_t)env->n_head_kv);
    if (!s->prev || !s->prev_words || !s->prev_len || !s->off || !s->end) goto oom;
    s->shape = kv_next_gen();
    s->serial = kv_next_gen();
    *out = s;
    return 0;
oom:
    if (s) {
        free(s->off);
        free(s->end);
        free(s->prev);
        free(s->prev_words);
        free(s->prev_len);
        free(s);
    }
    snprintf(err, errlen, "out of memory");
    return -1;
}

static void se_destroy(void *st)
{
    st_sent *s = st;
    free(s->tok);
    free(s->seg_end);
    free(s->mm);
    free(s->runs);
    free(s->n_runs);
    for (int i = 0; s->prev && i < s->n_slots; i++) free(s->prev[i]);
    free(s->prev);
    free(s->prev_words);
    free(s->prev_len);
    free(s->now);
    free(s->masks);
    free(s->score);
    for (int i = 0; s->lists && i < s->n_spans; i++) free(s->lists[i].sum);
    free(s->lists);
    free(s->off);
    free(s->end);
    free(s->sgen);
    for (int i = 0; s->spans && i < s->n_spans; i++) page_spans_free(&s->spans[i]);
    free(s->spans);
    free(s);
}

static int se_check(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen)
{
    (void)env;
    st_sent *s = st;
    int64_t b = pol_budget_tokens(s->budget, ctx);
    if (b <= s->sinks + s->len + s->delta) {
        snprintf(err, errlen, "sentkv: budget %lld tokens does not exceed the %d sinks and one segment's span (%d)",
                 (long long)b, s->sinks, s->len + s->delta);
        return -1;
    }
    return 0;
}

/* The eval's token ids extend the token stream (after a rewind, from p0) and cut it into more segments. */
static void take_tokens(st_sent *s, const pol_env *env, const int32_t *tokens, int64_t n, int64_t p0)
{
    if (p0 < s->n_tok) {
        /* rewound: forget the segments whose boundary search read tokens at p0 or later (a segment
         * from s was cut after looking at the tokens before s + len + delta), so that the cuts are
         * those the tokens now there give */
        s->n_tok = p0;
        while (s->n_seg > 0 && (s->n_seg > 1 ? s->seg_end[s->n_seg - 2] : 0) + s->len + s->delta > p0) s->n_seg--;
        if (s->n_summ > s->n_seg) {
            s->n_summ = s->n_seg;
            s->shape = kv_next_gen();   /* summaries past here will be written again */
        }
    }
    if (p0 + n > s->cap_tok) {
        int64_t nc = (p0 + n) * 2;
        int32_t *nt = realloc(s->tok, sizeof(int32_t) * (size_t)nc);
        if (!nt) return;
        s->tok = nt;
        s->cap_tok = nc;
    }
    for (int64_t p = s->n_tok; p < p0; p++) s->tok[p] = -1;   /* tokens it never saw: no boundary known */
    memcpy(s->tok + p0, tokens, sizeof(int32_t) * (size_t)n);
    s->n_tok = p0 + n;
    int64_t start = s->n_seg ? s->seg_end[s->n_seg - 1] : 0;
    int64_t room = (s->n_tok - start) / 1 + 1;
    if (s->n_seg + room > s->cap_seg) {
        int64_t nc = (s->n_seg + room) * 2;
        int64_t *ne = realloc(s->seg_end, sizeof(int64_t) * (size_t)nc);
        if (!ne) return;
        s->seg_end = ne;
        s->cap_seg = nc;
    }
    s->n_seg += sentkv_split(env->boundary, s->tok, s->n_tok, start, s->len, s->delta, 0, s->seg_end + s->n_seg,
                             s->cap_seg - s->n_seg);
}

/* New generations for the summaries of segments [from, to) (written afresh). -1: out of memory. */
static int stamp(st_sent *s, int64_t from, int64_t to)
{
    if (to > s->cap_sgen) {
        uint64_t *ng = realloc(s->sgen, sizeof(uint64_t) * (size_t)(to * 2));
        if (!ng) return -1;
        s->sgen = ng;
        s->cap_sgen = to * 2;
    }
    for (int64_t sg = from; sg < to; sg++) s->sgen[sg] = kv_next_gen();
    return 0;
}

/* One summarize call's new segments, (n_summ, n_to), and where they lie: positions [first, last). */
typedef struct summ_job {
    const st_sent *s;
    const pol_env *env;
    int64_t n_to, first, last;
} summ_job;

/* Global layer task / n_head_kv and KV head task % n_head_kv's part of summarize: a walk over the
 * head's pages in position order from the last one holding a token before the new segments (a
 * decode step reads two or three pages a head, not the head's every page), each run of rows in one
 * segment folded into its summary in row order (the cache's fold of a page's summary, NaN changing
 * nothing): each task writes only its own (layer, head) rows of the summaries, so the tasks run
 * side by side on the backend's host threads, with the bits of one thread. */
static void summarize_head(void *ctx, int64_t task, int thread)
{
    (void)thread;
    const summ_job *j = ctx;
    const st_sent *s = j->s;
    const pol_env *env = j->env;
    const int64_t D = kv_head_dim(env->kv), per = s->summ_per;
    const int gl = (int)(task / env->n_head_kv), g = (int)(task % env->n_head_kv), il = env->global[gl];
    const int64_t off = ((int64_t)gl * env->n_head_kv + g) * 2 * D;
    float sum[256];   /* the fold's sums, unused: the columns go in blocks of 256 */
    memset(sum, 0, sizeof sum);
    int np = kv_n_pages(env->kv, il, g), i0 = np;
    while (i0 > 0) {
        const kv_page *p = kv_layer_page(env->kv, il, g, i0 - 1);
        if (p->n > 0 && p->pos[p->n - 1] < j->first) break;
        i0--;
    }
    int64_t sg = s->n_summ;
    for (int i = i0; i < np && sg < j->n_to; i++) {
        const kv_page *p = kv_layer_page(env->kv, il, g, i);
        if (p->n == 0 || p->pos[0] >= j->last) continue;
        int32_t t = 0;
        while (t < p->n && p->pos[t] < j->first) t++;
        while (t < p->n && sg < j->n_to) {
            if (p->pos[t] >= j->last) break;
            while (sg < j->n_to && p->pos[t] >= s->seg_end[sg]) sg++;
            if (sg >= j->n_to) break;
            int32_t e = t + 1;   /* the run of rows in segment sg (positions ascend in a page) */
            while (e < p->n && p->pos[e] < s->seg_end[sg]) e++;
            float *o = s->mm + sg * per + off;
            for (int64_t c = 0; c < D; c += 256) {   /* each column's rows in order, as one call folds them */
                const int64_t w = D - c < 256 ? D - c : 256;
                be_host_key_summary_rows(w, e - t, p->k + (size_t)t * (size_t)D + (size_t)c, D, sum, o + c, o + D + c);
            }
            if (s->runs_per) {   /* where the rows are, for a device's fold of the same rows */
                const int64_t at = sg * s->n_slots + task;
                int32_t *n = &s->n_runs[at];
                if (*n >= 0 && *n < s->runs_per)
                    s->runs[at * s->runs_per + (*n)++] = (be_summary_run){ .k = p->k, .gen = p->gen, .r0 = t, .n = e - t };
                else
                    *n = -1;   /* more runs than kept: sent */
            }
            t = e;
        }
    }
}

/* Min/max keys of the new finished segments that end at or before `held` (the cache holds every
 * key before it: a decode step's own key goes in after its layers, so a segment that ends with it
 * waits for the next step, attended meanwhile as part of the tail), a (global layer, KV head) a
 * task on the backend's host threads (summarize_head): linear in the new segments' tokens. */
static int summarize(st_sent *s, const pol_env *env, int64_t held)
{
    int64_t D = kv_head_dim(env->kv), per = (int64_t)env->n_global * env->n_head_kv * 2 * D;
    int64_t n_to = s->n_seg;
    while (n_to > s->n_summ && s->seg_end[n_to - 1] > held) n_to--;
    if (s->n_summ >= n_to) return 0;
    if (n_to > s->cap_mm) {   /* room for more: the summaries' addresses, which the bounds lists hold, move seldom */
        int64_t nc = n_to * 2 > 64 ? n_to * 2 : 64;
        float *nm = realloc(s->mm, sizeof(float) * (size_t)(nc * per));
        if (!nm) return -1;
        pol_huge_pages(nm, sizeof(float) * (size_t)(nc * per));   /* 600 MiB at 32K on the 7B shape */
        s->mm = nm;
        if (s->runs_per) {
            size_t n = (size_t)nc * (size_t)s->n_slots;
            be_summary_run *nr = realloc(s->runs, sizeof *nr * n * (size_t)s->runs_per);
            if (!nr) return -1;
            s->runs = nr;
            int32_t *nn = realloc(s->n_runs, sizeof *nn * n);
            if (!nn) return -1;
            s->n_runs = nn;
        }
        s->cap_mm = nc;
    }
    if (stamp(s, s->n_summ, n_to)) return -1;
    for (int64_t sg = s->n_summ; sg < n_to; sg++) {
        float *o = s->mm + sg * per;
        for (int64_t i = 0; i < per; i += 2 * D)
            for (int64_t d = 0; d < D; d++) {
                o[i + d] = FLT_MAX;
                o[i + D + d] = -FLT_MAX;
            }
    }
    if (s->runs_per)
        memset(s->n_runs + s->n_summ * s->n_slots, 0, sizeof *s->n_runs * (size_t)((n_to - s->n_summ) * s->n_slots));
    summ_job j = { s, env, n_to, s->n_summ ? s->seg_end[s->n_summ - 1] : 0, s->seg_end[n_to - 1] };
    be_host_run(env->b, summarize_head, &j, (int64_t)env->n_global * env->n_head_kv);
    s->n_summ = n_to;
    return 0;
}

/* The prompt's segments are summarized as the prefill ends (after the last global layer of its last
 * chunk, when every global layer holds its keys), so the first decode step does not pay for them
 * (it only summarizes what finished since). */
static int se_layer_done(void *st, const pol_env *env, int il, const pol_chunk *c, char *err, size_t errlen)
{
    if (c->decoding || !c->last || il != env->global[env->n_global - 1]) return 0;
    if (summarize(st, env, ((st_sent *)st)->n_tok) != 0) {
        snprintf(err, errlen, "sentkv: out of memory summarizing segments");
        return -1;
    }
    return 0;
}

static void se_begin(void *st, const pol_env *env, const int32_t *tokens, int64_t n, int64_t p0, int decoding)
{
    st_sent *s = st;
    take_tokens(s, env, tokens, n, p0);
    if (!decoding) return;
    s->cur = p0;
    summarize(s, env, p0);
}

/* The trace of one head's choice: every finished segment with its score and whether it is in. */
static void trace_segments(const st_sent *s, const pol_env *env, int il, int g, const uint64_t *now)
{
    int64_t n = s->n_summ;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)n), *last = malloc(sizeof(int64_t) * (size_t)n);
    unsigned char *kept = malloc((size_t)n);
    if (first && last && kept) {
        for (int64_t sg = 0; sg < n; sg++) {
            first[sg] = sg ? s->seg_end[sg - 1] : 0;
            last[sg] = s->seg_end[sg] - 1;
            kept[sg] = (now[first[sg] >> 6] >> (first[sg] & 63)) & 1;
        }
        pol_trace_units(env->trace, "sentkv segments", il, g, n, s->score + s->off[g], kept, first, last);
    }
    free(first);
    free(last);
    free(kept);
}

/* A step's choice for global layer gl ([n_head_kv][words] bitmaps): the tokens gathered, and those
 * the previous step had gathered too (the reuse rate). */
static void count_choice(st_sent *s, const pol_env *env, int gl, const uint64_t *bits, int64_t words)
{
    int64_t total_tokens = 0;
    for (int g = 0; g < env->n_head_kv; g++) {
        const uint64_t *now = bits + (int64_t)g * words;
        int slot = gl * env->n_head_kv + g;
        if (s->prev_words[slot] < words) {
            uint64_t *np = realloc(s->prev[slot], sizeof(uint64_t) * (size_t)(words * 2));
            if (np) {
                s->prev[slot] = np;
                s->prev_words[slot] = words * 2;
            }
        }
        int64_t picked = 0, reused = 0;
        if (s->prev[slot] && s->prev_words[slot] >= words) {
            /* one pass: this step's bits counted, those the last step had counted again, and kept
             * for the next (the words past the last step's length were not its: compared as 0) */
            if (s->prev_len[slot] < words)
                memset(s->prev[slot] + s->prev_len[slot], 0, sizeof(uint64_t) * (size_t)(words - s->prev_len[slot]));
            be_host_bits_overlap(words, now, s->prev[slot], &picked, &reused);
            s->prev_len[slot] = words;
        } else {   /* out of memory: counted, and the next step compares with nothing */
            for (int64_t w = 0; w < words; w++) picked += bm_popcount(now[w]);
            s->prev_len[slot] = 0;
        }
        s->reused += (double)reused;
        s->gathered += (double)picked;
        total_tokens += picked;
    }
    s->tokens_last = total_tokens / (env->n_head_kv > 0 ? env->n_head_kv : 1);
}

/* The per-layer spans and lists, made at the first use. -1: out of memory. */
static int make_lists(st_sent *s, const pol_env *env)
{
    if (s->spans) return 0;
    s->spans = calloc((size_t)env->n_global, sizeof *s->spans);
    s->lists = calloc((size_t)env->n_global, sizeof *s->lists);
    if (!s->spans || !s->lists) {
        free(s->spans);
        free(s->lists);
        s->spans = NULL, s->lists = NULL;
        return -1;
    }
    s->n_spans = env->n_global;
    return 0;
}

/* Global layer gl's summaries of every segment a head (s->lists[gl]) as they are now, and the heads'
 * places in them (s->off, s->end). -1: out of memory. */
static int layer_list(st_sent *s, const pol_env *env, int gl)
{
    int64_t D = kv_head_dim(env->kv), per = (int64_t)env->n_global * env->n_head_kv * 2 * D;
    seg_sums *L = &s->lists[gl];
    int64_t from = L->n;   /* the segments each head's list has */
    /* (runs may move while mm stays: a list naming the old runs would send a device to freed memory) */
    if (L->mm != s->mm || L->runs != s->runs || L->shape != s->shape || s->n_summ < L->n || s->n_summ > L->stride) {
        from = 0;   /* written afresh, with room for a quarter more */
        int64_t stride = s->n_summ > L->stride ? s->n_summ + s->n_summ / 4 + 64 : L->stride;
        if (stride != L->stride) {
            be_summary *nsum = realloc(L->sum, sizeof *nsum * (size_t)(stride * env->n_head_kv));
            if (!nsum) return -1;
            L->sum = nsum;
            L->stride = stride;
        }
    }
    for (int g = 0; g < env->n_head_kv; g++)
        for (int64_t sg = from; sg < s->n_summ; sg++) {
            const float *mm = s->mm + sg * per + ((int64_t)gl * env->n_head_kv + g) * 2 * D;
            int64_t seg_len = s->seg_end[sg] - (sg ? s->seg_end[sg - 1] : 0);
            const int64_t at = sg * s->n_slots + (int64_t)gl * env->n_head_kv + g;
            const int32_t n_runs = s->runs_per && s->n_runs[at] > 0 ? s->n_runs[at] : 0;
            L->sum[g * L->stride + sg] = (be_summary){ .mn = mm, .mx = mm + D, .gen = s->sgen[sg], .n = seg_len,
                                                       .runs = n_runs ? s->runs + at * s->runs_per : NULL,
                                                       .n_runs = n_runs };
        }
    L->n = s->n_summ;
    L->mm = s->mm;
    L->runs = s->runs;
    L->shape = s->shape;
    for (int g = 0; g <= env->n_head_kv; g++) s->off[g] = g * L->stride;
    for (int g = 0; g < env->n_head_kv; g++) s->end[g] = g * L->stride + s->n_summ;
    return 0;
}

/* After a restore: every global layer's segment summaries put on the device now, as a step would
 * send them, so the first step after sends only what changed since (be_place_bounds). */
static void se_place(void *st, const pol_env *env)
{
    st_sent *s = st;
    int64_t len = s->cur + 1;
    if (pol_budget_tokens(s->budget, len) >= len || s->n_summ == 0 || make_lists(s, env)) return;
    for (int gl = 0; gl < env->n_global; gl++) {
        if (layer_list(s, env, gl)) return;
        be_bounds r = { .n_head_kv = env->n_head_kv, .group = env->n_head / env->n_head_kv, .dim = kv_head_dim(env->kv),
                        .sum = s->lists[gl].sum, .off = s->off, .end = s->end,
                        .table = pol_bounds_table(s->serial, env->global[gl]), .shape = s->shape };
        be_place_bounds(env->b, &r);
    }
}

static int se_select(void *st, const pol_env *env, int il, const float *q, pol_sel *sel)
{
    st_sent *s = st;
    int64_t len = s->cur + 1;
    int64_t budget = pol_budget_tokens(s->budget, len);
    if (budget >= len || s->n_summ == 0) return 0;
    int gl = -1;
    for (int i = 0; i < env->n_global; i++)
        if (env->global[i] == il) gl = i;
    if (gl < 0) return 0;
    if (make_lists(s, env)) return 0;
    const page_spans *sp = &s->spans[gl];
    if (page_spans_update(&s->spans[gl], env->kv, il)) return 0;
    int64_t D = kv_head_dim(env->kv);
    int G = env->n_head / env->n_head_kv;
    int64_t words = (len + 63) / 64;
    /* on a device, the choice stays there for attention (one wait a step, not one a layer); on the
     * host, the bitmaps and the pages' masks are the policy's */
    int kept = !env->trace && env->bits_buf && words <= env->bits_words;
    size_t pw = ((size_t)kv_page_size(env->kv) + 63) / 64;
    if (!kept) {
        if (s->now_words < words * env->n_head_kv) {
            uint64_t *nw = realloc(s->now, sizeof(uint64_t) * (size_t)(words * env->n_head_kv));
            if (!nw) return 0;
            s->now = nw;
            s->now_words = words * env->n_head_kv;
        }
        size_t need = (size_t)sp->at.off[env->n_head_kv] * pw;   /* a page's mask at its span's place */
        if (need > s->mask_cap) {
            uint64_t *nm = realloc(s->masks, sizeof(uint64_t) * need * 2);
            if (!nm) return 0;
            s->masks = nm;
            s->mask_cap = need * 2;
        }
    }
    /* every head's segment bounds against its queries and its choice, in one call */
    if (layer_list(s, env, gl)) return 0;
    const seg_sums *L = &s->lists[gl];
    int64_t n_all = L->stride * env->n_head_kv;   /* the bounds' room (the trace's) */
    if (env->trace && s->score_cap < n_all) {
        float *ns = realloc(s->score, sizeof(float) * (size_t)n_all);
        if (!ns) return 0;
        s->score = ns;
        s->score_cap = n_all;
    }
    uint64_t *bits = kept ? env->bits_buf + (int64_t)gl * env->n_head_kv * words : s->now;
    be_bounds r = { .q = q, .n_head_kv = env->n_head_kv, .group = G, .dim = D, .sum = L->sum, .off = s->off,
                    .end = s->end, .table = pol_bounds_table(s->serial, il), .shape = s->shape,
                    .u = env->trace ? s->score : NULL, .bits = bits, .words = words, .budget = budget,
                    .sinks = s->sinks, .len = len };
    env->b->ops->bound_pages(env->b, &r);
    if (kept) {   /* attention reads the choice where it is; counted when it comes back (se_chosen) */
        sel->bits = bits;
        sel->words = words;
        sel->spans = sp;
        return 1;
    }
    count_choice(s, env, gl, bits, words);
    for (int g = 0; g < env->n_head_kv; g++) {
        const uint64_t *now = bits + (int64_t)g * words;
        if (env->trace) trace_segments(s, env, il, g, now);
        /* token masks for the pages that hold chosen tokens, found from the pages' spans (the pages
         * themselves untouched: at 32K a head's 1,024 pages are as many cache misses) by walking
         * the chosen positions: the pages before the next chosen one are passed over. A page of
         * consecutive positions takes its bits a word at a time, any other (after an eviction)
         * token by token. */
        pol_sel_head(sel, g);
        const page_span *span = sp->spans + sp->at.off[g];
        int np = (int)(sp->at.end[g] - sp->at.off[g]);
        int64_t a = 0;
        for (int i = 0; (i = page_spans_next_chosen(span, np, i, now, words, &a)) >= 0; i++) {
            page_span at = span[i];
            uint64_t *m = s->masks + (size_t)(sp->at.off[g] + i) * pw;
            int32_t on = 0;
            if ((int64_t)at.last - at.first == at.n - 1 && at.last < len) {
                bm_bits_at(now, words, at.first, at.n, m, pw);
                for (size_t w = 0; w < pw; w++) on += bm_popcount(m[w]);
            } else {
                const kv_page *p = kv_layer_page(env->kv, il, g, i);
                memset(m, 0, pw * sizeof *m);
                for (int32_t t = 0; t < p->n; t++) {
                    int64_t ps = p->pos[t];
                    if (ps < len && ((now[ps >> 6] >> (ps & 63)) & 1)) {
                        m[t >> 6] |= 1ull << (t & 63);
                        on++;
                    }
                }
            }
            if (on) pol_sel_add(sel, i, on == at.n ? NULL : m);
        }
    }
    if (env->n_head_kv > 1) sel->per_head = 1;
    return 1;
}

static void se_chosen(void *st, const pol_env *env, int il, const uint64_t *bits, int64_t words)
{
    for (int gl = 0; gl < env->n_global; gl++)
        if (env->global[gl] == il) count_choice(st, env, gl, bits, words);
}

/* Tokens, segments and their summaries as taken (the reuse bookkeeping starts afresh after a
 * restore). */
static void se_save(void *st, bytes_w *w)
{
    st_sent *s = st;
    bw_i64(w, s->n_tok);
    bw_put(w, s->tok, sizeof(int32_t) * (size_t)s->n_tok);
    bw_i64(w, s->n_seg);
    bw_put(w, s->seg_end, sizeof(int64_t) * (size_t)s->n_seg);
    bw_i64(w, s->n_summ);
    bw_i64(w, s->cur);
    bw_u32(w, (uint32_t)s->n_slots);
    bw_i64(w, s->summ_per);
    bw_put(w, s->mm, sizeof(float) * (size_t)(s->n_summ * s->summ_per));
}

static int se_load(void *st, const pol_env *env, bytes_r *r)
{
    st_sent *s = st;
    int64_t n_tok = br_i64(r);
    if (r->err || n_tok < 0 || n_tok > kv_n_ctx(env->kv)) return -1;
    const int32_t *tok = br_view(r, sizeof(int32_t) * (size_t)n_tok);
    int64_t n_seg = br_i64(r);
    if (r->err || n_seg < 0 || n_seg > n_tok) return -1;
    const int64_t *seg = br_view(r, sizeof(int64_t) * (size_t)n_seg);
    int64_t n_summ = br_i64(r), cur = br_i64(r);
    br_u32(r);
    int64_t per = br_i64(r), want = (int64_t)env->n_global * env->n_head_kv * 2 * kv_head_dim(env->kv);
    if (r->err || n_summ < 0 || n_summ > n_seg || (n_summ > 0 && per != want) || cur < 0 || cur > kv_n_ctx(env->kv))
        return -1;
    /* the summaries as they were taken: the keys may have changed since (merged or evicted) */
    const float *mm = br_view(r, sizeof(float) * (size_t)(n_summ * (n_summ > 0 ? per : 0)));
    if (r->err) return -1;
    for (int64_t i = 0; i < n_summ * per; i++) {   /* key minima and maxima: finite */
        float x;
        memcpy(&x, mm + i, sizeof x);
        if (!isfinite(x)) return -1;
    }
    float *nmm = malloc(sizeof(float) * (size_t)(n_summ > 0 ? n_summ * per : 1));
    int32_t *nt = malloc(sizeof(int32_t) * (size_t)(n_tok > 0 ? n_tok * 2 : 1));
    int64_t *ns = malloc(sizeof(int64_t) * (size_t)(n_seg > 0 ? n_seg * 2 : 1));
    /* where the restored summaries' rows are is not known (the keys may have changed): none, so
     * they are sent (the runs themselves come with the next segments' room) */
    int32_t *nn = s->runs_per ? calloc((size_t)(n_summ > 0 ? n_summ : 1) * (size_t)s->n_slots, sizeof *nn) : NULL;
    if (!nmm || !nt || !ns || (s->runs_per && !nn)) goto fail;
    memcpy(nmm, mm, sizeof(float) * (size_t)(n_summ > 0 ? n_summ * per : 0));
    memcpy(nt, tok, sizeof(int32_t) * (size_t)n_tok);
    memcpy(ns, seg, sizeof(int64_t) * (size_t)n_seg);
    for (int64_t i = 0; i < n_tok; i++)
        if (nt[i] < -1 || nt[i] >= env->n_vocab) nt[i] = -1;
    for (int64_t i = 0; i < n_seg; i++)
        if (ns[i] <= (i ? ns[i - 1] : 0) || ns[i] > n_tok) goto fail;
    if (stamp(s, 0, n_summ)) goto fail;   /* the restored summaries are new to a device */
    s->shape = kv_next_gen();
    free(s->tok);
    free(s->seg_end);
    s->tok = nt;
    s->cap_tok = n_tok > 0 ? n_tok * 2 : 1;
    s->n_tok = n_tok;
    s->seg_end = ns;
    s->cap_seg = n_seg > 0 ? n_seg * 2 : 1;
    s->n_seg = n_seg;
    s->cur = cur;
    free(s->mm);
    free(s->runs);
    free(s->n_runs);
    s->mm = nmm;
    s->runs = NULL;
    s->n_runs = nn;
    s->cap_mm = n_summ;
    s->n_summ = n_summ;
    return 0;
fail:
    free(nmm);
    free(nt);
    free(ns);
    free(nn);
    return -1;
}

static void se_describe(void *st, char *buf, size_t len)
{
    st_sent *s = st;
    snprintf(buf, len, "sentkv: %lld segments, %lld tokens attended per head, reuse %.0f%% of gathered tokens",
             (long long)s->n_summ, (long long)s->tokens_last, s->gathered > 0 ? 100.0 * s->reused / s->gathered : 0.0);
}

const pol_ops pol_sentkv = {
    .name = "sentkv",
    .summary = "SentKVCompress: sentence segments scored by min/max key bounds, top segments per head",
    .stage = POL_STAGE_DECODE,
    .prefill_only = 1,
    .params = params,
    .n_params = P_COUNT,
    .create = se_create,
    .destroy = se_destroy,
    .begin = se_begin,
    .layer_done = se_layer_done,
    .query_rows = pol_no_query_rows,   /* it folds keys */
    .select = se_select,
    .chosen = se_chosen,
    .place = se_place,
    .check = se_check,
    .describe = se_describe,
    .save = se_save,
    .load = se_load,
};
