/* view.c - the screen's figures copied from the session (see view.h). */
#include "ui/view.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

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

void view_fill(uw_view *o, const session *s, const view_marks *m, int with_settings)
{
    const fwd_ctx *f = sess_fwd(s);
    const pol_set *ps = sess_policies(s);
    const unc_monitor *mon = sess_monitor(s);
    be_backend *b = sess_backend(s);
    kv_stats ks;
    kv_get_stats(fwd_kv(f), &ks);
    int64_t n;
    const int64_t *map = pol_set_page_map(ps, &n);
    const float *h = unc_entropy(mon), *var = unc_varentropy(mon);
    int64_t nh = unc_count(mon);
    int ne;
    const unc_event *ev = unc_events(mon, &ne);
    o->ctx_used = ks.positions;
    o->tokens_kept = ks.tokens_kept;
    o->tokens_full = ks.tokens_full;
    o->kv_held = ks.bytes_resident;
    o->kv_full = ks.bytes_full;
    o->kv_peak = ks.bytes_peak;
    o->rss_mib = peak_rss_mib();
    if (b->ops->memory) b->ops->memory(b, &o->gpu_held, &o->gpu_total);
    o->page_size = kv_page_size(fwd_kv(f));
    int64_t total = (ks.positions + o->page_size - 1) / o->page_size;
    o->n_map = total < UW_MAP_MAX ? total : UW_MAP_MAX;
    int same = m->ps == ps;   /* a new policy set starts its map afresh */
    for (int64_t i = 0; i < o->n_map; i++)
        o->map[i] = (i < n ? map[i] : 0) - (same && i < m->n_map ? m->map[i] : 0);
    const pol_env *env = pol_set_env(ps);
    int64_t steps = pol_set_stats(ps)->steps - (same ? m->steps : 0);
    o->map_full = steps * env->n_global * env->n_head_kv;
    memset(o->held, env->n_global > 0 ? 0 : 1, (size_t)o->n_map);
    if (env->n_global > 0) {
        const kv_cache *kv = fwd_kv(f);
        for (int i = 0; i < kv_n_pages(kv, env->global[0], 0); i++) {
            const kv_page *p = kv_layer_page(kv, env->global[0], 0, i);
            for (int32_t t = 0; t < p->n; t++) {
                int64_t lp = p->pos[t] / o->page_size;
                if (p->pos[t] >= 0 && lp < o->n_map) o->held[lp] = 1;
            }
        }
    }
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
        o->sp = *samp_get_params(sess_sampler(s));
        o->n_predict = sess_n_predict(s);
    }
    snprintf(o->budget, sizeof o->budget, "%s", sess_budget(s));
}
