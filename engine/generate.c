/* generate.c - sampling loop with the uncertainty monitor and page-level backtracking. */
#include "engine/generate.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/policy/policy.h"

/* An answer's last partial page is checked when it holds at least this many tokens (fewer say
 * little about the entropy's variance). */
enum { GEN_MIN_CHECKED = 4 };

/* One answer being generated: what it drives, its options, and where the loop stands. */
typedef struct gen_state {
    const gen_ctx *c;
    const gen_opts *o;
    const gen_callbacks *cb;
    gen_result *res;
    char *err;
    size_t errlen;
    int P;                   /* the monitor's page */
    int watch, track;        /* pages are checked and events logged; per-token entropy is computed */
    int can_roll;            /* ... and rolled back */
    int64_t pos0;            /* the cache's length when the answer began */
    int64_t i, committed;    /* tokens so far; handed to the caller */
    int64_t safe;            /* tokens no stop sequence can take back */
    int64_t regen_page;      /* the page being generated again (-1: none) */
    int32_t *tokens;         /* the answer so far */
    int32_t *first_try;      /* the tokens of the page being regenerated, as first generated */
    int64_t first_n;         /* how many (P, or fewer for an answer's last partial page) */
    void *samp_state;        /* sampler state at the start of the current page */
    char *text;              /* stop sequences: the answer's text (each token's piece), */
    size_t *ends;            /* where each token's text ends in it */
    size_t text_cap;
    /* The last step's logits stayed with the backend (fwd_decode_pick): its best candidates. */
    int picked;
    be_pick pk;
    float pk_val[BE_PICK_MAX];
    int32_t pk_id[BE_PICK_MAX];
    int32_t pk_pen[4096];
    int32_t want;            /* the id the next decode step evaluates (advance) */
    int rc;                  /* the answer's result once it ended: 0, or -1 on failure */
} gen_state;

static int all_space(const char *t)
{
    for (; *t; t++)
        if (!isspace((unsigned char)*t)) return 0;
    return 1;
}

/* Token i-1 just joined the answer: its text goes after token i-2's. With a stop sequence complete
 * in the text, *keep gets the tokens wholly before it and 1 is returned; else *safe gets the tokens
 * that cannot be part of a stop sequence (the text may end with the start of one). -1: no memory. */
static int check_stops(gen_state *g, const gen_opts *o, const tok_vocab *v, int64_t i, int64_t *keep, int64_t *safe)
{
    size_t before = i > 1 ? g->ends[i - 2] : 0;
    char piece[256];
    size_t n = tok_piece_text(v, g->tokens[i - 1], 0, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    if (before + n + 1 > g->text_cap) {
        size_t nc = (before + n + 1) * 2;
        char *nt = realloc(g->text, nc);
        if (!nt) return -1;
        g->text = nt;
        g->text_cap = nc;
    }
    memcpy(g->text + before, piece, n);
    size_t len = before + n;
    g->ends[i - 1] = len;
    /* a match can only end inside the new piece; the earliest one wins. A stop made of whitespace
     * alone (a base model's blank line) does not end an answer before its first other character:
     * an answer that begins on a new line is not empty (and the next turn does not learn to be). */
    size_t cut = len + 1, hold = 0, lead = 0;
    while (lead < len && isspace((unsigned char)g->text[lead])) lead++;
    for (int k = 0; k < o->n_stop; k++) {
        size_t L = strlen(o->stop[k]);
        if (L == 0) continue;
        size_t from = before + 1 > L ? before + 1 - L : 0;
        if (all_space(o->stop[k]) && from < lead) from = lead;
        for (size_t at = from; at + L <= len; at++)
            if (!memcmp(g->text + at, o->stop[k], L)) {
                if (at < cut) cut = at;
                break;
            }
        /* the longest end of the text that begins this stop sequence */
        for (size_t l = L - 1 < len ? L - 1 : len; l > hold; l--)
            if (!memcmp(g->text + len - l, o->stop[k], l)) {
                hold = l;
                break;
            }
    }
    int64_t k = 0;
    if (cut <= len) {
        while (k < i && g->ends[k] <= cut) k++;
        *keep = k;
        return 1;
    }
    while (k < i && g->ends[k] <= len - hold) k++;
    *safe = k;
    return 0;
}

static void commit(const gen_callbacks *cb, const int32_t *tokens, int64_t *committed, int64_t upto)
{
    for (int64_t j = *committed; j < upto; j++)
        if (cb && cb->token) cb->token(cb->ud, tokens[j]);
    *committed = upto;
}

static void finish_event(unc_monitor *mon, const unc_thresholds *thr, const gen_callbacks *cb, const int32_t *now,
                         int64_t n, const int32_t *before, int64_t n_before, int64_t from)
{
    unc_event *e = unc_last_event(mon);
    if (!e) return;
    unc_range(mon, from, n, &e->after);
    e->recovered = !unc_crosses(thr, &e->after);
    e->changed_text = n != n_before || memcmp(now, before, sizeof(int32_t) * (size_t)n) != 0;
    if (cb && cb->event) cb->event(cb->ud, e);
}

/* The backend's pick for the next step: the sampler's request now (nothing changes it before
 * next_token draws). */
static be_pick *pick_request(gen_state *g)
{
    be_pick *p = &g->pk;
    p->n_pen = samp_pick_request(g->c->s, BE_PICK_MAX, g->pk_pen, &p->penalty, &p->k);
    p->pen_ids = g->pk_pen;
    p->entropy = g->track;
    p->temp = g->o->temperature;
    p->val = g->pk_val;
    p->id = g->pk_id;
    return p;
}

/* A decode step's result (rc of the fwd_decode call, picked: its candidates are in g->pk); an
 * interrupt is a stop, not a failure. 0 to go on, 1 to stop, -1 on failure. */
static int step_done(gen_state *g, int rc, int picked)
{
    const gen_ctx *c = g->c;
    g->picked = rc == 0 && picked;
    if (rc == 0) {
        g->res->n_decoded++;
        return 0;
    }
    if (c->abort_flag && *c->abort_flag) {
        g->res->stop = GEN_STOP_INTERRUPT;
        return 1;
    }
    return -1;
}

/* One decode step of id; as step_done. */
static int step(gen_state *g, int32_t id)
{
    const gen_ctx *c = g->c;
    if (fwd_can_pick(c->f))
        return step_done(g, fwd_decode_pick(c->f, id, pick_request(g), c->abort_flag, g->err, g->errlen), 1);
    return step_done(g, fwd_decode(c->f, id, c->logits, c->abort_flag, g->err, g->errlen), 0);
}

static int out_of_memory(gen_state *g)
{
    snprintf(g->err, g->errlen, "out of memory");
    return -1;
}

/* Sample the next token into the answer. 0 to go on, 1 when the answer ends here (the end of
 * generation, a stop sequence), -1 on failure. */
static int next_token(gen_state *g, int32_t *out)
{
    const gen_ctx *c = g->c;
    double h = 0, vh = 0;
    int32_t id = -1;
    if (g->picked) {   /* from the backend's candidates, or the whole row when they may not do */
        g->picked = 0;
        h = g->pk.h;
        vh = g->pk.vh;
        id = samp_sample_top(c->s, g->pk_val, g->pk_id, g->pk.n_out, g->pk.k);
        if (id < 0) {
            if (fwd_picked_logits(c->f, c->logits, g->err, g->errlen)) return -1;
            id = samp_sample(c->s, c->logits);
        }
    } else {
        if (g->track) samp_entropy(c->logits, c->n_vocab, g->o->temperature, &h, &vh);   /* before sampling changes logits */
        id = samp_sample(c->s, c->logits);
    }
    if (tok_is_eog(c->v, id)) {
        g->res->stop = GEN_STOP_EOG;
        return 1;
    }
    if (g->track && unc_push(c->mon, h, vh)) return out_of_memory(g);
    samp_accept(c->s, id);
    g->tokens[g->i++] = id;
    g->safe = g->i;
    *out = id;
    if (!g->ends) return 0;
    int64_t keep;
    int r = check_stops(g, g->o, c->v, g->i, &keep, &g->safe);
    if (r < 0) return out_of_memory(g);
    if (r > 0) {
        if (g->track) unc_drop(c->mon, g->i - keep);
        g->i = keep;
        g->res->stop = GEN_STOP_SEQUENCE;
        return 1;
    }
    return 0;
}

/* Page `page`, its last n tokens, crossed the thresholds (event e): the decode policy reselects,
 * the cache, sampler and monitor roll back to the page's start, and its first token's logits are
 * to be computed again (g->want). 0 to generate the page again, -1 on failure. */
static int backtrack(gen_state *g, unc_event *e, int64_t page, int64_t P)
{
    const gen_ctx *c = g->c;
    int64_t target = g->pos0 + (g->i - P) - 1;   /* re-decode the token before the page */
    pol_change chg;
    pol_set_reselect(fwd_policy(c->f), fwd_pos(c->f), target, &chg);
    e->n_added = chg.n_added;
    e->n_removed = chg.n_removed;
    for (int k = 0; k < chg.n_added && k < UNC_EVENT_PAGES; k++) e->added[k] = chg.added[k];
    for (int k = 0; k < chg.n_removed && k < UNC_EVENT_PAGES; k++) e->removed[k] = chg.removed[k];
    if (fwd_rewind(c->f, target) != target) {
        snprintf(g->err, g->errlen, "backtracking: the cache could not roll back to position %lld", (long long)target);
        return -1;
    }
    memcpy(g->first_try, g->tokens + g->i - P, sizeof(int32_t) * (size_t)P);
    g->first_n = P;
    samp_load_state(c->s, g->samp_state);
    unc_drop(c->mon, P);
    unc_note_regenerated(c->mon, P);
    g->i -= P;
    e->regenerated = 1;
    if (unc_add_event(c->mon, e)) return out_of_memory(g);
    g->regen_page = page;
    g->res->regenerated++;
    if (g->res->regenerated >= g->o->max_regen) g->can_roll = 0;   /* from here every token is final */
    g->want = g->i > 0 ? g->tokens[g->i - 1] : g->o->prev_token;
    return 0;
}

/* The check of the answer's last n tokens, page `page` (statistics st): an event when they cross
 * the thresholds, and the page generated again while regenerations are left. 0 to go on, 2 when
 * the page is generated again (after a step of g->want), -1 on failure. */
static int check_page(gen_state *g, int64_t page, int64_t n, const unc_stats *st)
{
    const gen_opts *o = g->o;
    if (!g->watch || !unc_crosses(o->thr, st)) return 0;
    unc_event e = { 0 };
    e.step = g->i - 1;
    e.pos = g->pos0 + g->i - 1;
    e.page = page;
    e.stats = *st;
    e.thr_h = o->thr->h_mean;
    e.thr_v = o->thr->h_var;
    g->res->events++;
    if (g->can_roll && g->res->regenerated < o->max_regen) {
        int r = backtrack(g, &e, page, n);
        return r == 0 ? 2 : r;
    }
    e.regen_spent = o->max_regen > 0 && g->res->regenerated >= o->max_regen;
    if (unc_add_event(g->c->mon, &e)) return out_of_memory(g);
    if (g->cb && g->cb->event) g->cb->event(g->cb->ud, &e);
    return 0;
}

/* The answer ended inside a page: its last GEN_MIN_CHECKED or more tokens are checked as a page
 * would be, so an answer shorter than a page is checked at all. 0 when the answer stands, 2 when
 * the partial page is generated again, -1 on failure. */
static int answer_end(gen_state *g)
{
    int64_t n = g->i % g->P, page = g->i / g->P;
    if (!g->watch || n < GEN_MIN_CHECKED || page == g->regen_page) return 0;
    unc_stats st;
    unc_range(g->c->mon, g->i - n, n, &st);
    int r = check_page(g, page, n, &st);
    if (r == 2) g->res->stop = GEN_STOP_LIMIT;   /* decided again by the regenerated tokens */
    return r;
}

/* A page of the answer is complete: its check (and a rollback when it crosses), then its tokens
 * are final. 0 to go on, 2 when the page is generated again (after a step of g->want), -1 on
 * failure. */
static int page_end(gen_state *g)
{
    const gen_ctx *c = g->c;
    const gen_opts *o = g->o;
    const int P = g->P;
    int64_t page = g->i / P - 1;
    unc_stats st;
    unc_range(c->mon, g->i - P, P, &st);
    if (page == g->regen_page) {
        finish_event(c->mon, o->thr, g->cb, g->tokens + g->i - P, P, g->first_try, g->first_n, g->i - P);
        g->regen_page = -1;
    } else {
        int r = check_page(g, page, P, &st);
        if (r) return r;
    }
    if (g->track && g->cb && g->cb->page) g->cb->page(g->cb->ud, page, &st);
    commit(g->cb, g->tokens, &g->committed, g->safe < g->i ? g->safe : g->i);
    samp_save_state(c->s, g->samp_state);
    if (g->can_roll) fwd_set_mark(c->f, g->pos0 + g->i - 1);
    return 0;
}

/* The answer's end: what stop sequences may still take back is left out, an event whose page was
 * being regenerated is closed, and every kept token reaches the caller. */
static void finish(gen_state *g)
{
    const gen_ctx *c = g->c;
    gen_result *res = g->res;
    if (g->ends && g->safe < g->i && res->stop != GEN_STOP_EOG && res->stop != GEN_STOP_SEQUENCE) {
        /* cut short (length, context, interrupt) while holding back what may begin a stop sequence
         * (a base model's "\nQuestion"): it is left out, as the stop it probably was */
        if (g->track) unc_drop(c->mon, g->i - g->safe);
        g->i = g->safe;
    }
    if (g->regen_page >= 0) {   /* the answer ended inside a regenerated page */
        int64_t from = g->regen_page * g->P, n = g->i - from;
        finish_event(c->mon, g->o->thr, g->cb, g->tokens + from, n < 0 ? 0 : n, g->first_try, g->first_n, from);
    }
    commit(g->cb, g->tokens, &g->committed, g->i);   /* what was generated stays, also when interrupted */
    res->n_gen = g->i;
    fwd_set_mark(c->f, -1);
}

/* The answer begun: g's buffers, the monitor reset, the mark set. 0, or -1 (out of memory). */
static int gen_begin(gen_state *g, const gen_ctx *c, const gen_opts *o, const gen_callbacks *cb, gen_result *res,
                     char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    unc_reset(c->mon);
    *g = (gen_state){ .c = c, .o = o, .cb = cb, .res = res, .err = err, .errlen = errlen, .regen_page = -1 };
    g->P = unc_page_size(c->mon);
    g->watch = o->thr && o->thr->valid;
    g->track = g->watch || o->monitor;
    g->can_roll = g->watch && o->max_regen > 0;
    g->pos0 = fwd_pos(c->f);
    size_t n_max = (size_t)(o->n_predict > 0 ? o->n_predict : 1);
    g->tokens = malloc(sizeof(int32_t) * n_max);
    g->first_try = malloc(sizeof(int32_t) * (size_t)g->P);
    g->samp_state = malloc(samp_state_size());
    if (o->stop && o->n_stop > 0) g->ends = malloc(sizeof(size_t) * n_max);
    if (!g->tokens || !g->first_try || !g->samp_state || (o->stop && o->n_stop > 0 && !g->ends))
        return out_of_memory(g);
    if (g->can_roll && g->pos0 < 1) g->can_roll = 0;   /* nothing to re-decode from */
    samp_save_state(c->s, g->samp_state);
    /* Rolling back to a page start must be exact: sliding-window layers keep what that needs
     * (the mark; the caller's floor stays where it is). */
    if (g->can_roll) fwd_set_mark(c->f, g->pos0 - 1);
    res->stop = GEN_STOP_LIMIT;
    return 0;
}

/* The answer loop until it needs a decode step (0: of g->want; a page generated again starts with
 * the step of the token before it) or the answer ends (1, its result in g->rc). */
static int advance(gen_state *g)
{
    const gen_ctx *c = g->c;
    const gen_opts *o = g->o;
    gen_result *res = g->res;
    while (g->i < o->n_predict) {
        if (c->abort_flag && *c->abort_flag) {
            res->stop = GEN_STOP_INTERRUPT;
            break;
        }
        int32_t id;
        int r = next_token(g, &id);
        if (r < 0) {
            g->rc = -1;
            break;
        }
        if (r == 0) {
            if (!g->can_roll) commit(g->cb, g->tokens, &g->committed, g->safe);
            if (g->i % g->P == 0 && (r = page_end(g)) != 0) {
                if (r == 2) return 0;   /* the page again, from its first token's logits */
                g->rc = r < 0 ? -1 : 0;
                break;
            }
            if (fwd_pos(c->f) >= fwd_n_ctx(c->f) && g->i < o->n_predict) res->stop = GEN_STOP_CONTEXT;
        }
        if (r == 1 || g->i == o->n_predict || res->stop == GEN_STOP_CONTEXT) {   /* the answer ends here */
            r = answer_end(g);
            if (r == 2) return 0;   /* its last partial page again */
            g->rc = r < 0 ? -1 : 0;
            break;
        }
        g->want = id;
        return 0;
    }
    return 1;
}

static void gen_free(gen_state *g)
{
    free(g->tokens);
    free(g->first_try);
    free(g->samp_state);
    free(g->text);
    free(g->ends);
}

int gen_answer(const gen_ctx *c, const gen_opts *o, const gen_callbacks *cb, gen_result *res, char *err, size_t errlen)
{
    gen_state g;
    if (gen_begin(&g, c, o, cb, res, err, errlen)) {
        gen_free(&g);
        return -1;
    }
    while (!advance(&g)) {
        int r = step(&g, g.want);
        if (r) {
            g.rc = r < 0 ? -1 : 0;
            break;
        }
    }
    finish(&g);
    gen_free(&g);
    return g.rc;
}

int gen_answer_batch(fwd_ctx *lead, const gen_ctx *cs, int n, const gen_opts *os, const gen_callbacks *cbs,
                     gen_result *res, volatile sig_atomic_t *abort_flag, char *err, size_t errlen)
{
    if (n < 1 || n > FWD_BATCH_MAX) {
        snprintf(err, errlen, "a batch of %d answers: 1 to %d", n, FWD_BATCH_MAX);
        return -1;
    }
    gen_state g[FWD_BATCH_MAX];
    int live[FWD_BATCH_MAX] = { 0 }, ok[FWD_BATCH_MAX] = { 0 }, rc = 0, begun = 0;
    while (begun < n && !rc) {
        rc = gen_begin(&g[begun], &cs[begun], &os[begun], cbs ? &cbs[begun] : NULL, &res[begun], err, errlen);
        ok[begun] = live[begun] = !rc;
        begun++;
    }
    /* every answer's loop runs to its next step; the steps run as one batch; answers that end leave it */
    while (!rc) {
        fwd_ctx *fs[FWD_BATCH_MAX];
        int32_t ids[FWD_BATCH_MAX];
        float *logits[FWD_BATCH_MAX];
        be_pick picks[FWD_BATCH_MAX];
        int who[FWD_BATCH_MAX], nb = 0, pick = fwd_can_pick(lead);
        for (int s = 0; s < n; s++) {
            if (!live[s]) continue;
            int r = advance(&g[s]);
            /* its own flag raised since (a callback stopping it): its step would fail at once, an
             * interrupt, as gen_answer's does */
            if (!r && cs[s].abort_flag && *cs[s].abort_flag && (r = step_done(&g[s], -1, 0)) < 0) g[s].rc = -1;
            if (r) {
                live[s] = 0;
                if (g[s].rc) rc = -1;
                continue;
            }
            fs[nb] = cs[s].f;
            ids[nb] = g[s].want;
            logits[nb] = cs[s].logits;
            if (pick) picks[nb] = *pick_request(&g[s]);
            who[nb++] = s;
        }
        if (!nb || rc) break;
        int sr = fwd_decode_batch(lead, fs, nb, ids, logits, pick ? picks : NULL, abort_flag, err, errlen);
        int stopped = sr && abort_flag && *abort_flag;   /* the batch's flag: an interrupt for every answer */
        for (int j = 0; j < nb; j++) {
            gen_state *q = &g[who[j]];
            if (pick) q->pk = picks[j];   /* its answers (into q's own arrays) */
            int r = stopped ? (q->res->stop = GEN_STOP_INTERRUPT, 1) : step_done(q, sr, pick);
            if (r) {
                q->rc = r < 0 ? -1 : 0;
                live[who[j]] = 0;
                if (r < 0) rc = -1;
            }
        }
    }
    for (int s = 0; s < begun; s++) {
        if (ok[s]) finish(&g[s]);   /* what each answer generated stays, also after a failure */
        gen_free(&g[s]);
    }
    return rc;
}
