/* view.c - the screen's figures copied from the session (see view.h). */
#include "ui/view.h"

#include "engine/model.h"
#include "engine/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void view_mark(view_marks *m, const pol_set *ps)
{
    int64_t n;
    const int64_t *map = pol_set_page_map(ps, &n);
    int64_t *nm = realloc(m->map, sizeof *nm * (size_t)(n > 0 ? n : 1));
    if (!nm) return;
    if (n) memcpy(nm, map, sizeof *nm * (size_t)n);
    m->map = nm;
    m->n_map = n;
    m->steps = pol_set_stats(ps)->steps;
    m->ps = ps;
}

void view_marks_free(view_marks *m)
{
    free(m->map);
    memset(m, 0, sizeof *m);
}

/* Which pages of the sequence the first global layer still holds tokens of. */
static void held_pages(uw_view *o, const run *r, int64_t positions)
{
    memset(o->held, 0, (size_t)o->n_map);
    uint8_t *state = malloc((size_t)(positions > 0 ? positions : 1));
    if (!state) {
        memset(o->held, 1, (size_t)o->n_map);
        return;
    }
    run_position_states(r, state, positions);
    for (int64_t p = 0; p < positions; p++) {
        int64_t lp = p / o->page_size;
        if (state[p] && lp < o->n_map) o->held[lp] = 1;
    }
    free(state);
}

void view_fill(uw_view *o, const session *s, const view_marks *m, int with_settings)
{
    const run *r = sess_run(s);
    const pol_set *ps = run_policies(r);
    const unc_monitor *mon = run_monitor(r);
    run_figures fg;
    run_get_figures(r, &fg);
    int64_t n;
    const int64_t *map = pol_set_page_map(ps, &n);
    const float *h = unc_entropy(mon), *var = unc_varentropy(mon);
    int64_t nh = unc_count(mon);
    int ne;
    const unc_event *ev = unc_events(mon, &ne);
    o->ctx_used = fg.positions;
    o->tokens_kept = fg.tokens_kept;
    o->tokens_full = fg.tokens_full;
    o->kv_held = fg.kv_held;
    o->kv_full = fg.kv_full;
    o->kv_peak = fg.kv_peak;
    o->swa_window = run_model(r)->hp.n_swa;
    o->rss_mib = fg.rss_peak_mib;
    o->gpu_held = fg.gpu_held;
    o->gpu_total = fg.gpu_total;
    o->page_size = fg.page_size;
    int64_t total = (fg.positions + o->page_size - 1) / o->page_size;
    o->n_map = total < UW_MAP_MAX ? total : UW_MAP_MAX;
    int same = m->ps == ps;   /* a new policy set starts its map afresh */
    for (int64_t i = 0; i < o->n_map; i++)
        o->map[i] = (i < n ? map[i] : 0) - (same && i < m->n_map ? m->map[i] : 0);
    const pol_env *env = pol_set_env(ps);
    int64_t steps = fg.steps - (same ? m->steps : 0);
    o->map_full = steps * env->n_global * env->n_head_kv;
    held_pages(o, r, fg.positions);
    int64_t from = nh > UW_HIST ? nh - UW_HIST : 0;
    o->n_hist = (int)(nh - from);
    for (int i = 0; i < o->n_hist; i++) {
        o->entropy[i] = h[from + i];
        o->varentropy[i] = var[from + i];
    }
    o->events = ne;
    o->regenerated = 0;
    for (int i = 0; i < ne; i++) o->regenerated += ev[i].regenerated;
    snprintf(o->policy, sizeof o->policy, "%s", pol_set_spec(ps)->text);
    snprintf(o->doc, sizeof o->doc, "%s", sess_document_title(s));
    snprintf(o->title, sizeof o->title, "%s", sess_title(s));
    o->policy_pending = sess_policy_pending(s);
    o->base_model = sess_format(s) == SESS_FORMAT_PLAIN;
    o->have_doc = sess_have_document(s);
    o->doc_tokens = sess_document_tokens(s);
    o->session_id = sess_stored_id(s);
    if (with_settings) {
        o->sp = *samp_get_params(run_sampler(r));
        o->n_predict = sess_n_predict(s);
    }
    snprintf(o->budget, sizeof o->budget, "%s", sess_budget(s));
}
