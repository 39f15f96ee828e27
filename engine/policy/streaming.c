/* streaming.c - StreamingLLM: attend to the first `sinks` tokens (attention sinks) and the most
 * recent budget - sinks tokens. Token-exact through page masks; selection only (every page stays
 * in memory, so switching policy later loses nothing). */
#include "engine/policy/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/page_list.h"
#include "engine/policy/trace.h"

enum { P_SINKS, P_BUDGET, P_COUNT };

static const pol_param params[] = {
    [P_SINKS] = { "sinks", POL_INT, 4, 0, 1 << 20, NULL, "attention-sink tokens at the start" },
    [P_BUDGET] = { "budget", POL_FLOAT, 1024, 0, 1e9, NULL, "tokens attended: sinks + recent window (fraction or count)" },
};
_Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "streaming: one entry per parameter");

typedef struct st_streaming {
    int64_t sinks;
    double budget;
    int64_t cur;              /* position of the token being decoded */
    uint64_t *masks;          /* scratch masks for partially kept pages */
    size_t mask_cap;          /* in words */
    int64_t kept_last, ctx_last;
    /* each global layer's pages' first and last positions, kept from step to step
     * (engine/page_list.h): a step looks at a page's tokens only where it straddles the kept
     * ranges' ends, not at every token of the cache (18 ms a step at 16K at the 7B shape) */
    page_spans *spans;
    int n_spans;
} st_streaming;

static int s_create(void **out, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    st_streaming *s = calloc(1, sizeof *s);
    if (s && env->n_global > 0 && !(s->spans = calloc((size_t)env->n_global, sizeof *s->spans))) {
        free(s);
        s = NULL;
    }
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->n_spans = env->n_global;
    s->sinks = (int64_t)vals[P_SINKS];
    s->budget = vals[P_BUDGET];
    if (s->budget >= 1 && (int64_t)s->budget <= s->sinks) {
        snprintf(err, errlen, "streaming: budget %g tokens leaves no recent window after %lld sink tokens", s->budget,
                 (long long)s->sinks);
        free(s->spans);
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

static void s_destroy(void *st)
{
    st_streaming *s = st;
    for (int i = 0; i < s->n_spans; i++) page_spans_free(&s->spans[i]);
    free(s->spans);
    free(s->masks);
    free(s);
}

static int s_check(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen)
{
    (void)env;
    st_streaming *s = st;
    int64_t b = pol_budget_tokens(s->budget, ctx);
    if (b <= s->sinks) {
        snprintf(err, errlen, "streaming: budget %lld tokens is not above the %lld sink tokens", (long long)b,
                 (long long)s->sinks);
        return -1;
    }
    return 0;
}

static void s_begin(void *st, const pol_env *env, const int32_t *tokens, int64_t n, int64_t p0, int decoding)
{
    if (decoding) ((st_streaming *)st)->cur = p0;
}

/* The trace of a step (the same in every global layer and KV head): what is kept, and the traced
 * positions' fate. */
static void trace_spans(pol_trace *t, int64_t sinks, int64_t recent_from, int64_t len)
{
    int kept = pol_trace_covers(t, 0, sinks - 1) || pol_trace_covers(t, recent_from, len - 1);
    int dropped = pol_trace_covers(t, sinks, recent_from - 1);
    if (!kept && !dropped) return;
    char sink_text[48] = "";
    if (sinks > 0) snprintf(sink_text, sizeof sink_text, "0-%lld (sinks) and ", (long long)sinks - 1);
    pol_trace_note(t, "streaming: keeps positions %s%lld-%lld (recent), drops %lld-%lld | traced positions %s", sink_text,
                   (long long)recent_from, (long long)len - 1, (long long)sinks, (long long)recent_from - 1,
                   !dropped ? "kept" : kept ? "partly kept, partly DROP" : "DROP");
}

/* How a page of positions [a.first, a.last] (ascending) stands to the kept ranges [0, sinks) and
 * [recent_from, ...): wholly kept, wholly dropped (or empty), or straddling an end. */
enum { SPAN_KEPT, SPAN_DROPPED, SPAN_STRADDLES };
static int span_fate(page_span a, int64_t sinks, int64_t recent_from)
{
    if (a.n == 0 || (a.first >= sinks && a.last < recent_from)) return SPAN_DROPPED;
    if (a.last < sinks || a.first >= recent_from) return SPAN_KEPT;
    return SPAN_STRADDLES;
}

static int s_select(void *st, const pol_env *env, int il, const float *q, pol_sel *sel)
{
    (void)q;
    st_streaming *s = st;
    int64_t len = s->cur + 1;
    int64_t budget = pol_budget_tokens(s->budget, len);
    s->ctx_last = len;
    if (budget >= len) {
        s->kept_last = len;
        return 0;
    }
    int64_t recent_from = len - (budget - s->sinks);
    if (env->trace && il == env->global[0]) trace_spans(env->trace, s->sinks, recent_from, len);
    int gl = 0;
    while (gl < env->n_global && env->global[gl] != il) gl++;
    if (gl == env->n_global) return 0;   /* never: only global layers select */
    page_spans *sp = &s->spans[gl];
    if (page_spans_update(sp, env->kv, il)) return 0;   /* out of memory: attend to everything, always correct */
    int P = kv_page_size(env->kv);
    size_t words = ((size_t)P + 63) / 64;
    /* Each head's pages that may hold a kept position: of its leading run of whole pages in order
     * (page_spans.seq: page j's positions within [j * P, (j + 1) * P)), those that reach below the
     * sinks' end or at or past the window's start, the pages between them wholly dropped and
     * never looked at; then every page after the run. */
    int64_t ranges[PAGE_LIST_MAX_HEADS][3][2];
    for (int h = 0; h < env->n_head_kv; h++) {
        int64_t np = sp->at.end[h] - sp->at.off[h], run = sp->seq[h];
        int64_t lo = (s->sinks + P - 1) / P, hi = recent_from / P;   /* pages [lo, hi) of the run: dropped */
        if (lo > run) lo = run;
        if (hi < lo) hi = lo;
        if (hi > run) hi = run;
        ranges[h][0][0] = 0, ranges[h][0][1] = lo;
        ranges[h][1][0] = hi, ranges[h][1][1] = run;
        ranges[h][2][0] = run, ranges[h][2][1] = np;
    }
    /* a mask for each page that straddles a kept range's end: at most two a head where the
     * positions ascend from page to page (as the cache keeps them), more where they do not */
    size_t straddling = 0;
    for (int h = 0; h < env->n_head_kv; h++)
        for (int r = 0; r < 3; r++)
            for (int64_t i = ranges[h][r][0]; i < ranges[h][r][1]; i++)
                straddling += span_fate(sp->spans[sp->at.off[h] + i], s->sinks, recent_from) == SPAN_STRADDLES;
    if (straddling * words > s->mask_cap) {
        size_t nc = straddling * words * 2;
        uint64_t *m = realloc(s->masks, nc * sizeof *m);
        if (!m) return 0;
        s->masks = m;
        s->mask_cap = nc;
    }
    /* per KV head: a prefill policy may have left the heads' tables different. A page's positions
     * ascend, so its first and last say whether it is wholly kept or wholly dropped; only a page
     * that straddles a kept range's end has its tokens looked at. */
    int64_t kept = 0;
    uint64_t *m = s->masks;
    for (int h = 0; h < env->n_head_kv; h++) {
        pol_sel_head(sel, h);
        const page_span *span = sp->spans + sp->at.off[h];
        for (int r = 0; r < 3; r++) {
            for (int i = (int)ranges[h][r][0]; i < (int)ranges[h][r][1]; i++) {
                int fate = span_fate(span[i], s->sinks, recent_from);
                if (fate == SPAN_DROPPED) continue;
                if (fate == SPAN_KEPT) {
                    pol_sel_add(sel, i, NULL);
                    if (h == 0) kept += span[i].n;
                    continue;
                }
                const kv_page *p = kv_layer_page(env->kv, il, h, i);
                memset(m, 0, words * sizeof *m);
                int32_t on = 0;
                for (int32_t t = 0; t < p->n; t++) {
                    if (p->pos[t] < s->sinks || p->pos[t] >= recent_from) {
                        m[t >> 6] |= 1ull << (t & 63);
                        on++;
                    }
                }
                if (on == 0) continue;
                pol_sel_add(sel, i, on == p->n ? NULL : m);
                if (on != p->n) m += words;
                if (h == 0) kept += on;
            }
        }
    }
    /* the step's own token, attended always, where the cache takes it after the layers (a device's
     * deferred row) */
    int np0 = kv_n_pages(env->kv, il, 0);
    const kv_page *last = np0 > 0 ? kv_layer_page(env->kv, il, 0, np0 - 1) : NULL;
    if (!last || last->n == 0 || last->pos[last->n - 1] < len - 1) kept++;
    s->kept_last = kept;
    return 1;
}

static void s_describe(void *st, char *buf, size_t len)
{
    st_streaming *s = st;
    snprintf(buf, len, "streaming: %lld sinks + recent window, %lld of %lld tokens", (long long)s->sinks,
             (long long)s->kept_last, (long long)s->ctx_last);
}

const pol_ops pol_streaming = {
    .name = "streaming",
    .summary = "StreamingLLM: attention sinks + recent window",
    .stage = POL_STAGE_DECODE,
    .params = params,
    .n_params = P_COUNT,
    .create = s_create,
    .destroy = s_destroy,
    .begin = s_begin,
    .select = s_select,
    .check = s_check,
    .describe = s_describe,
};
