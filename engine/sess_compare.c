/* sess_compare.c - side queries over the conversation's cache (sess_compare and sess_seen in
 * session.h): the next question answered under several decode-time policies from one cache, the
 * conversation going on as before; and "what the model sees", the sequence's text by whether the
 * first global layer holds and attended it. */
#include <stdlib.h>
#include <string.h>

#include "engine/bytes.h"
#include "engine/sess_store.h"
#include "engine/sess_turns.h"
#include "engine/tokenizer.h"

/* The policies to compare: the current one first, then each of specs_in that differs from it, each
 * on the cache's prefill policy. The count, or -1 with the message in s->err. */
static int compare_specs(session *s, const char *const *specs_in, int n_in, char specs[8][256])
{
    char key[256];
    snprintf(specs[0], 256, "%s", pol_set_spec(run_policies(s->r))->text);
    int n_spec = 1;
    /* each compared policy keeps the cache's prefill policy: only the decode-time part varies; a
     * prefill policy that also acts while decoding would change the cache under the comparison */
    sess_current_prefill_key(s, key, sizeof key);
    if (!pol_spec_decode_keeps_cache(pol_set_spec(run_policies(s->r))))
        return sess_fail(s, -1, "compare needs a cache that decoding leaves alone: not under %s", key);
    for (int i = 0; i < n_in; i++) {
        pol_spec ps;
        if (pol_parse(&ps, specs_in[i], NULL, s->err, sizeof s->err)) return -1;
        for (int k = 0; k < ps.n; k++)
            if (ps.ops[k]->stage == POL_STAGE_PREFILL) {
                char names[256] = "";
                for (const pol_ops *const *p = pol_registry(); *p; p++)
                    if ((*p)->stage == POL_STAGE_DECODE)
                        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "",
                                 (*p)->name);
                return sess_fail(s, -1, "compare decode-time policies (%s) on the cache as it is", names);
            }
        char joined[256];
        if (strcmp(key, POL_FULL) != 0)
            snprintf(joined, sizeof joined, "%.120s+%.120s", key, specs_in[i]);
        else
            snprintf(joined, sizeof joined, "%s", specs_in[i]);
        /* by the canonical text: "quest" and the current "quest" (or "full" under full) run once */
        pol_spec canon;
        if (pol_parse(&canon, joined, NULL, s->err, sizeof s->err)) return -1;
        int dup = 0;
        for (int j = 0; j < n_spec; j++) dup |= !strcmp(specs[j], canon.text);
        if (!dup) snprintf(specs[n_spec++], 256, "%s", canon.text);
    }
    if (n_spec == 1)
        return sess_fail(s, -1, "nothing to compare: %s is the current policy (name another decode-time policy)",
                         specs[0]);
    return n_spec;
}

/* A column's answer as it comes: its text (the detokenizer's pieces) and the progress the front
 * end shows. */
typedef struct column {
    session *s;
    int i, n;
    const char *policy;
    tok_stream ts;
    bytes_w text;                /* its bytes, no terminator until the end (err: out of memory) */
    int64_t *all;                /* the tokens of every column so far (they are decoded together) */
} column;

static void column_token(void *ud, int32_t id)
{
    column *c = ud;
    char piece[512];
    bw_put(&c->text, piece, tok_stream_feed(&c->ts, id, piece, sizeof piece));
    ++*c->all;
    if (c->s->cb.column) c->s->cb.column(c->s->cb.ud, c->i, c->n, c->policy, *c->all);
}

/* The columns' answers from the question's end, one fork of the conversation's cache each (pages
 * shared), their decode steps batched: a compare costs about one answer's weight reads a step. */
static int answer_columns(session *s, int n_spec, char specs[8][256], sess_compared *out, int *n_out)
{
    run *fk[8] = { 0 };
    column col[8];
    gen_callbacks cbs[8];
    gen_result gr[8];
    int64_t all = 0;
    memset(col, 0, sizeof col);
    int rc = SESS_OK;
    for (int i = 0; i < n_spec && !rc; i++) {
        pol_spec spec;
        if (pol_parse(&spec, specs[i], NULL, s->err, sizeof s->err) ||
            !(fk[i] = run_fork(s->r, &spec, s->err, sizeof s->err)))
            rc = SESS_EFAIL;
        col[i] = (column){ .s = s, .i = i, .n = n_spec, .policy = specs[i], .all = &all };
        tok_stream_init(&col[i].ts, run_model(s->r)->vocab);
        cbs[i] = (gen_callbacks){ &col[i], column_token, NULL, NULL };
        if (s->cb.column) s->cb.column(s->cb.ud, i, n_spec, specs[i], 0);
    }
    const char *stops[SESS_MAX_STOP + 2];
    int n_stop = sess_stops(s, 1, stops, SESS_MAX_STOP + 2);
    /* as an answer of the conversation would be generated, less the regenerations and the streaming */
    run_answer_opts ao[8];
    for (int i = 0; i < n_spec; i++) ao[i] = (run_answer_opts){ s->cfg.n_predict, 1, 0, 1, s->cfg.monitor, stops, n_stop };
    double t0 = run_clock_s();
    if (!rc) rc = run_answer_batch(s->r, fk, n_spec, ao, cbs, gr, s->err, sizeof s->err);
    double secs = run_clock_s() - t0;
    for (int i = 0; i < n_spec && !rc; i++) {
        char piece[512];
        bw_put(&col[i].text, piece, tok_stream_flush(&col[i].ts, piece, sizeof piece));
        bw_put(&col[i].text, "", 1);
        if (col[i].text.err) {
            rc = sess_fail(s, SESS_EFAIL, "out of memory");
            break;
        }
        run_figures fg;
        run_get_figures(fk[i], &fg);
        sess_compared *c = &out[(*n_out)++];
        snprintf(c->policy, sizeof c->policy, "%.250s", specs[i]);
        c->text = (char *)col[i].text.p;   /* the caller frees it */
        col[i].text = (bytes_w){ 0 };
        c->n_tokens = gr[i].n_gen;
        c->seconds = secs;
        c->pages_per_step = fg.pages_per_step;
        c->kv_read_per_step = fg.kv_read_per_step;
        c->events = gr[i].events;
    }
    for (int i = 0; i < n_spec; i++) {
        bw_free(&col[i].text);
        run_free(fk[i]);
    }
    return rc;
}

int sess_compare(session *s, const char *const *specs_in, int n_in, const char *question, sess_compared *out,
                 int *n_out)
{
    char specs[8][256];
    *n_out = 0;
    if (n_in < 1 || n_in > 7) return sess_fail(s, SESS_EFAIL, "compare up to 7 policies with the current one");
    if (s->pending_doc) return sess_fail(s, SESS_EFAIL, "ask a first question before comparing policies");
    int n_spec = compare_specs(s, specs_in, n_in, specs);
    if (n_spec < 0) return SESS_EFAIL;
    int64_t turn_start = run_pos(s->r), seq0 = sess_seq_len(s), turns0 = s->turns;
    void *s0 = malloc(run_sampler_state_size(s->r));
    if (!s0) return sess_fail(s, SESS_EFAIL, "out of memory");
    run_save_sampler(s->r, s0);
    int64_t n_eval;
    double secs;
    int rc = sess_prepare_turn(s, question, &n_eval, &secs);
    s->pending_record = -1;   /* a side query is no turn of the conversation */
    if (!rc) rc = answer_columns(s, n_spec, specs, out, n_out);
    /* the conversation goes on as before the comparison, which left its cache at the question's
     * end: back to before the question exactly (the floor stays where it was, at or before
     * turn_start, so the sliding-window layers keep what the rewind needs and nothing is evaluated
     * again, which a Ctrl-C (the abort flag raised) could not have finished) */
    int rr = run_rewind(s->r, turn_start, seq0, s->err, sizeof s->err);
    s->turns = turns0;
    run_set_floor(s->r, s->turns > 0 ? s->ans_start - 1 : turn_start);   /* where a regeneration rewinds to */
    run_load_sampler(s->r, s0);
    sess_answer_reset(s);
    if (!rc && rr) rc = rr;
    free(s0);
    return rc;
}

/* ---- what the model sees */

void sess_spans_free(sess_span *sp, int n)
{
    for (int i = 0; sp && i < n; i++) free(sp[i].text);
    free(sp);
}

/* Piece (k bytes) of state st after the spans so far: the last span grows, or a new one begins. */
static int span_add(sess_span **sp, int *ns, int *cap, int st, const char *piece, size_t k)
{
    if (*ns > 0 && (*sp)[*ns - 1].state == st) {
        size_t a = strlen((*sp)[*ns - 1].text);
        char *nt = realloc((*sp)[*ns - 1].text, a + k + 1);
        if (!nt) return -1;
        memcpy(nt + a, piece, k + 1);
        (*sp)[*ns - 1].text = nt;
        return 0;
    }
    if (*ns == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        sess_span *nsp = realloc(*sp, sizeof *nsp * (size_t)nc);
        if (!nsp) return -1;
        *sp = nsp;
        *cap = nc;
    }
    (*sp)[*ns].state = st;
    if (!((*sp)[*ns].text = strdup(piece))) return -1;
    (*ns)++;
    return 0;
}

int sess_seen(session *s, sess_span **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    int64_t n;
    const int32_t *seq = run_tokens(s->r, &n);
    uint8_t *state = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!state) return sess_fail(s, SESS_EFAIL, "out of memory");
    run_position_states(s->r, state, n);
    sess_span *sp = NULL;
    int ns = 0, cap = 0, rc = SESS_OK;
    tok_stream ts;
    tok_stream_init(&ts, run_model(s->r)->vocab);
    char piece[512];
    for (int64_t i = 0; i < n && rc == SESS_OK; i++) {
        size_t k = tok_stream_feed(&ts, seq[i], piece, sizeof piece - 1);
        if (i == n - 1) k += tok_stream_flush(&ts, piece + k, sizeof piece - 1 - k);
        if (k == 0) continue;
        piece[k] = 0;
        if (span_add(&sp, &ns, &cap, state[i], piece, k)) rc = sess_fail(s, SESS_EFAIL, "out of memory");
    }
    free(state);
    if (rc) {
        sess_spans_free(sp, ns);
        return rc;
    }
    *out = sp;
    *n_out = ns;
    return SESS_OK;
}
