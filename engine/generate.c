/* generate.c - sampling loop with the uncertainty monitor and page-level backtracking. */
#include "engine/generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/policy/policy.h"

typedef struct gen_state {
    int32_t *tokens;         /* the answer so far */
    int32_t *first_try;      /* the tokens of the page being regenerated, as first generated */
    void *samp_state;        /* sampler state at the start of the current page */
    char *text;              /* stop sequences: the answer's text (each token's piece), */
    size_t *ends;            /* where each token's text ends in it */
    size_t text_cap;
} gen_state;

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
    /* a match can only end inside the new piece; the earliest one wins */
    size_t cut = len + 1, hold = 0;
    for (int k = 0; k < o->n_stop; k++) {
        size_t L = strlen(o->stop[k]);
        if (L == 0) continue;
        size_t from = before + 1 > L ? before + 1 - L : 0;
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
                         const int32_t *before, int64_t n, int P, int64_t from)
{
    unc_event *e = unc_last_event(mon);
    if (!e) return;
    unc_range(mon, from, n, &e->after);
    e->recovered = !unc_crosses(thr, &e->after);
    e->changed_text = n < P || memcmp(now, before, sizeof(int32_t) * (size_t)n) != 0;
    if (cb && cb->event) cb->event(cb->ud, e);
}

/* One decode step; an interrupt is a stop, not a failure. 0 to go on, 1 to stop, -1 on failure. */
static int step(fwd_ctx *f, int32_t id, float *logits, volatile sig_atomic_t *abort_flag, gen_result *res, char *err,
                size_t errlen)
{
    if (fwd_decode(f, id, logits, abort_flag, err, errlen) == 0) {
        res->n_decoded++;
        return 0;
    }
    if (abort_flag && *abort_flag) {
        res->stop = GEN_STOP_INTERRUPT;
        return 1;
    }
    return -1;
}

int gen_answer(fwd_ctx *f, samp *s, const tok_vocab *v, unc_monitor *mon, float *logits, int32_t n_vocab,
               const gen_opts *o, const gen_callbacks *cb, volatile sig_atomic_t *abort_flag, gen_result *res,
               char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    unc_reset(mon);
    const int P = unc_page_size(mon);
    const int watch = o->thr && o->thr->valid;               /* pages are checked and events logged */
    const int track = watch || o->monitor;                   /* per-token entropy is computed */
    int can_roll = watch && o->max_regen > 0;                /* ... and rolled back */
    const int64_t pos0 = fwd_pos(f);
    gen_state g = { 0 };
    g.tokens = malloc(sizeof(int32_t) * (size_t)(o->n_predict > 0 ? o->n_predict : 1));
    g.first_try = malloc(sizeof(int32_t) * (size_t)P);
    g.samp_state = malloc(samp_state_size());
    const int stops = o->stop && o->n_stop > 0;
    if (stops) g.ends = malloc(sizeof(size_t) * (size_t)(o->n_predict > 0 ? o->n_predict : 1));
    int rc = 0;
    if (!g.tokens || !g.first_try || !g.samp_state || (stops && !g.ends)) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
        goto out;
    }
    if (can_roll && pos0 < 1) can_roll = 0;   /* nothing to re-decode from */
    samp_save_state(s, g.samp_state);
    /* Rolling back to a page start must be exact: sliding-window layers keep what that needs
     * (the mark; the caller's floor stays where it is). */
    if (can_roll) fwd_set_mark(f, pos0 - 1);
    int64_t i = 0, committed = 0, regen_page = -1;
    int64_t safe = 0;            /* tokens no stop sequence can take back */
    res->stop = GEN_STOP_LIMIT;
    while (i < o->n_predict) {
        if (abort_flag && *abort_flag) {
            res->stop = GEN_STOP_INTERRUPT;
            break;
        }
        double h = 0, vh = 0;
        if (track) samp_entropy(logits, n_vocab, o->temperature, &h, &vh);   /* before sampling changes logits */
        int32_t id = samp_sample(s, logits);
        if (tok_is_eog(v, id)) {
            res->stop = GEN_STOP_EOG;
            break;
        }
        if (track && unc_push(mon, h, vh)) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
            break;
        }
        samp_accept(s, id);
        g.tokens[i++] = id;
        safe = i;
        if (stops) {
            int64_t keep;
            int r = check_stops(&g, o, v, i, &keep, &safe);
            if (r < 0) {
                snprintf(err, errlen, "out of memory");
                rc = -1;
                break;
            }
            if (r > 0) {
                if (track) unc_drop(mon, i - keep);
                i = keep;
                res->stop = GEN_STOP_SEQUENCE;
                break;
            }
        }
        if (!can_roll) commit(cb, g.tokens, &committed, safe);
        if (i % P == 0) {
            int64_t page = i / P - 1;
            unc_stats st;
            unc_range(mon, i - P, P, &st);
            if (page == regen_page) {
                finish_event(mon, o->thr, cb, g.tokens + i - P, g.first_try, P, P, i - P);
                regen_page = -1;
            } else if (watch && unc_crosses(o->thr, &st)) {
                unc_event e = { 0 };
                e.step = i - 1;
                e.pos = pos0 + i - 1;
                e.page = page;
                e.stats = st;
                e.thr_h = o->thr->h_mean;
                e.thr_v = o->thr->h_var;
                res->events++;
                if (can_roll && res->regenerated < o->max_regen) {
                    int64_t target = pos0 + (i - P) - 1;   /* re-decode the token before the page */
                    pol_change chg;
                    pol_set_reselect(fwd_policy(f), fwd_pos(f), target, &chg);
                    e.n_added = chg.n_added;
                    e.n_removed = chg.n_removed;
                    for (int k = 0; k < chg.n_added && k < UNC_EVENT_PAGES; k++) e.added[k] = chg.added[k];
                    for (int k = 0; k < chg.n_removed && k < UNC_EVENT_PAGES; k++) e.removed[k] = chg.removed[k];
                    if (fwd_rewind(f, target) != target) {
                        snprintf(err, errlen, "backtracking: the cache could not roll back to position %lld",
                                 (long long)target);
                        rc = -1;
                        break;
                    }
                    memcpy(g.first_try, g.tokens + i - P, sizeof(int32_t) * (size_t)P);
                    samp_load_state(s, g.samp_state);
                    unc_drop(mon, P);
                    unc_note_regenerated(mon, P);
                    i -= P;
                    e.regenerated = 1;
                    if (unc_add_event(mon, &e)) {
                        snprintf(err, errlen, "out of memory");
                        rc = -1;
                        break;
                    }
                    regen_page = page;
                    res->regenerated++;
                    if (res->regenerated >= o->max_regen) can_roll = 0;   /* from here every token is final */
                    int32_t prev = i > 0 ? g.tokens[i - 1] : o->prev_token;
                    int r = step(f, prev, logits, abort_flag, res, err, errlen);
                    if (r) {
                        rc = r < 0 ? -1 : 0;
                        break;
                    }
                    continue;
                }
                if (unc_add_event(mon, &e)) {
                    snprintf(err, errlen, "out of memory");
                    rc = -1;
                    break;
                }
                if (cb && cb->event) cb->event(cb->ud, &e);
            }
            if (track && cb && cb->page) cb->page(cb->ud, page, &st);
            commit(cb, g.tokens, &committed, safe < i ? safe : i);
            samp_save_state(s, g.samp_state);
            if (can_roll) fwd_set_mark(f, pos0 + i - 1);
        }
        if (i == o->n_predict) break;
        if (fwd_pos(f) >= fwd_n_ctx(f)) {
            res->stop = GEN_STOP_CONTEXT;
            break;
        }
        int r = step(f, id, logits, abort_flag, res, err, errlen);
        if (r) {
            rc = r < 0 ? -1 : 0;
            break;
        }
    }
    if (stops && safe < i && res->stop != GEN_STOP_EOG && res->stop != GEN_STOP_SEQUENCE) {
        /* cut short (length, context, interrupt) while holding back what may begin a stop sequence
         * (a base model's "\nQuestion"): it is left out, as the stop it probably was */
        if (track) unc_drop(mon, i - safe);
        i = safe;
    }
    if (regen_page >= 0) {   /* the answer ended inside a regenerated page */
        int64_t from = regen_page * P, n = i - from;
        finish_event(mon, o->thr, cb, g.tokens + from, g.first_try, n < 0 ? 0 : n, P, from);
    }
    commit(cb, g.tokens, &committed, i);   /* what was generated stays, also when interrupted */
    res->n_gen = i;
    fwd_set_mark(f, -1);
out:
    free(g.tokens);
    free(g.first_try);
    free(g.samp_state);
    free(g.text);
    free(g.ends);
    return rc;
}
