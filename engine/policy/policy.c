/* policy.c - the policy registry, spec parsing, and the per-sequence runtime that binds a prefill
 * and a decode policy to a KV cache and keeps the attention statistics (see policy.h). */
#include "engine/policy/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/page_list.h"
#include "engine/policy/chelsea.h"
#include "engine/policy/trace.h"

extern const pol_ops pol_full, pol_streaming, pol_quest, pol_chess, pol_sentkv, pol_take, pol_laser, pol_chelsea,
    pol_snapkv, pol_h2o;

static const pol_ops *const registry[] = { &pol_full,  &pol_streaming, &pol_quest,   &pol_chess,  &pol_sentkv,
                                           &pol_take,  &pol_laser,     &pol_chelsea, &pol_snapkv, &pol_h2o,
                                           NULL };

const pol_ops *const *pol_registry(void) { return registry; }

const pol_ops *pol_find(const char *name)
{
    for (int i = 0; registry[i]; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    return NULL;
}

static void names_of(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; registry[i] && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", registry[i]->name);
}

static void params_of(const pol_ops *p, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    if (p->n_params == 0) snprintf(buf, len, "(none)");
    for (int i = 0; i < p->n_params && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", p->params[i].name);
}

static int param_index(const pol_ops *p, const char *name)
{
    for (int i = 0; i < p->n_params; i++)
        if (!strcmp(p->params[i].name, name)) return i;
    return -1;
}

/* An enum parameter's values as "a|b|c". */
static void choices_of(const pol_param *pp, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; pp->choices[i].name && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? "|" : "", pp->choices[i].name);
}

/* Parse one value for parameter pp into *v. */
static int parse_value(const pol_ops *p, const pol_param *pp, const char *s, double *v, char *err, size_t errlen)
{
    if (pp->type == POL_ENUM) {
        for (int idx = 0; pp->choices[idx].name; idx++) {
            if (!strcmp(s, pp->choices[idx].name)) {
                *v = idx;
                return 0;
            }
        }
        char all[256];
        choices_of(pp, all, sizeof all);
        snprintf(err, errlen, "policy %s: %s=%s is not one of %s", p->name, pp->name, s, all);
        return -1;
    }
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end || !isfinite(x) || (pp->type == POL_INT && x != floor(x))) {
        snprintf(err, errlen, "policy %s: %s=%s is not %s", p->name, pp->name, s,
                 pp->type == POL_INT ? "an integer" : "a number");
        return -1;
    }
    if (x < pp->lo || x > pp->hi) {
        snprintf(err, errlen, "policy %s: %s=%s is outside [%g, %g]", p->name, pp->name, s, pp->lo, pp->hi);
        return -1;
    }
    *v = x;
    return 0;
}

/* The presets chosen in slot k: each parameter a chosen preset sets takes its value there, unless the
 * spec gave it another value than its default. */
static int apply_presets(pol_spec *out, int k, char *err, size_t errlen)
{
    const pol_ops *p = out->ops[k];
    for (int i = 0; i < p->n_params; i++) {
        const pol_param *pp = &p->params[i];
        const pol_choice *c = pp->type == POL_ENUM ? &pp->choices[(int)out->vals[k][i]] : NULL;
        if (!c || !c->sets) continue;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", c->sets);
        char *save = NULL;
        for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            if (eq) *eq = 0;
            int pi = eq ? param_index(p, kv) : -1;
            double v;
            /* a mistake in the policy's table, which the tests would have caught (they parse every preset) */
            if (pi < 0 || pi == i) {
                snprintf(err, errlen, "policy %s: %s=%s sets '%s', which is not another parameter of it", p->name,
                         pp->name, c->name, kv);
                return -1;
            }
            if (parse_value(p, &p->params[pi], eq + 1, &v, err, errlen)) return -1;
            if (out->vals[k][pi] == p->params[pi].def) out->vals[k][pi] = v;
        }
    }
    return 0;
}

const pol_choice *pol_presets(const pol_ops *p)
{
    int i = param_index(p, "preset");
    return i >= 0 && p->params[i].type == POL_ENUM ? p->params[i].choices : NULL;
}

int64_t pol_budget_tokens(double budget, int64_t ctx)
{
    if (budget <= 0) return 0;
    if (budget < 1) {
        int64_t t = (int64_t)ceil(budget * (double)ctx);
        return t < 1 ? 1 : t;
    }
    return (int64_t)budget;
}

int pol_parse(pol_spec *out, const char *spec, const char *budget, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    char names[256];
    names_of(names, sizeof names);
    if (!spec || !*spec) spec = "full";
    if (strlen(spec) >= sizeof out->text) {
        snprintf(err, errlen, "policy spec too long");
        return -1;
    }
    double bval = 0;
    int have_budget = budget && *budget;
    if (have_budget) {
        char *end;
        bval = strtod(budget, &end);
        if (end == budget || *end || !isfinite(bval) || bval <= 0 || (bval >= 1 && bval != floor(bval))) {
            snprintf(err, errlen, "--budget %s: give a fraction of the context (0 < b < 1) or a token count", budget);
            return -1;
        }
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *part = strtok_r(buf, "+", &save); part; part = strtok_r(NULL, "+", &save)) {
        char *colon = strchr(part, ':');
        if (colon) *colon = 0;
        const pol_ops *p = pol_find(part);
        if (!p) {
            snprintf(err, errlen, "unknown policy '%s' (valid: %s)", part, names);
            return -1;
        }
        int slot = p->stage == POL_STAGE_PREFILL ? 0 : 1;
        for (int i = 0; i < out->n; i++) {
            if (out->ops[i]->stage == p->stage) {
                snprintf(err, errlen, "policy spec '%s' names two %s policies (%s and %s); combine one prefill and "
                         "one decode policy", spec, slot ? "decode" : "prefill", out->ops[i]->name, p->name);
                return -1;
            }
        }
        int k = out->n++;
        out->ops[k] = p;
        for (int i = 0; i < p->n_params; i++) out->vals[k][i] = p->params[i].def;
        if (colon) {
            char *save2 = NULL;
            for (char *kvp = strtok_r(colon + 1, ",", &save2); kvp; kvp = strtok_r(NULL, ",", &save2)) {
                char *eq = strchr(kvp, '=');
                char plist[256];
                params_of(p, plist, sizeof plist);
                if (!eq) {
                    snprintf(err, errlen, "policy %s: '%s' is not name=value (parameters: %s)", p->name, kvp, plist);
                    return -1;
                }
                *eq = 0;
                int pi = param_index(p, kvp);
                if (pi < 0) {
                    snprintf(err, errlen, "policy %s has no parameter '%s' (parameters: %s)", p->name, kvp, plist);
                    return -1;
                }
                if (parse_value(p, &p->params[pi], eq + 1, &out->vals[k][pi], err, errlen)) return -1;
                out->set[k][pi] = 1;
            }
        }
        int bi = param_index(p, "budget");
        if (have_budget && bi >= 0 && !out->set[k][bi]) {
            out->vals[k][bi] = bval;
            out->set[k][bi] = 1;
        }
    }
    if (out->n == 0) {
        snprintf(err, errlen, "empty policy spec (valid: %s)", names);
        return -1;
    }
    if (have_budget) {
        int any = 0;
        for (int i = 0; i < out->n; i++) any |= param_index(out->ops[i], "budget") >= 0;
        if (!any) {
            snprintf(err, errlen, "--budget does not apply to policy '%s' (it keeps the whole context)", spec);
            return -1;
        }
    }
    /* prefill policy first in the canonical text */
    if (out->n == 2 && out->ops[0]->stage == POL_STAGE_DECODE) {
        const pol_ops *t = out->ops[0];
        out->ops[0] = out->ops[1];
        out->ops[1] = t;
        double tv[POL_MAX_PARAMS];
        int ts[POL_MAX_PARAMS];
        memcpy(tv, out->vals[0], sizeof tv);
        memcpy(ts, out->set[0], sizeof ts);
        memcpy(out->vals[0], out->vals[1], sizeof tv);
        memcpy(out->set[0], out->set[1], sizeof ts);
        memcpy(out->vals[1], tv, sizeof tv);
        memcpy(out->set[1], ts, sizeof ts);
    }
    size_t o = 0;
    for (int k = 0; k < out->n; k++) {
        const pol_ops *p = out->ops[k];
        o += (size_t)snprintf(out->text + o, sizeof out->text - o, "%s%s", k ? "+" : "", p->name);
        int first = 1;
        for (int i = 0; i < p->n_params && o < sizeof out->text; i++) {
            if (!out->set[k][i]) continue;
            const pol_param *pp = &p->params[i];
            char val[64];
            if (pp->type == POL_ENUM) {
                snprintf(val, sizeof val, "%s", pp->choices[(int)out->vals[k][i]].name);
            } else {
                snprintf(val, sizeof val, "%g", out->vals[k][i]);
            }
            o += (size_t)snprintf(out->text + o, sizeof out->text - o, "%s%s=%s", first ? ":" : ",", pp->name, val);
            first = 0;
        }
        if (o >= sizeof out->text) o = sizeof out->text - 1;
    }
    /* after the text, which says what the spec said ("rho_g=0" stays so, and means the preset's) */
    for (int k = 0; k < out->n; k++)
        if (apply_presets(out, k, err, errlen)) return -1;
    return 0;
}

double pol_spec_value(const pol_spec *s, int i, const char *name, double def)
{
    int pi = param_index(s->ops[i], name);
    return pi < 0 ? def : s->vals[i][pi];
}

void pol_list(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; registry[i] && o < len; i++) {
        const pol_ops *p = registry[i];
        o += (size_t)snprintf(buf + o, len - o, "  %-10s %s (%s)\n", p->name, p->summary,
                              p->stage == POL_STAGE_PREFILL ? "prefill; saves memory" : "decode; saves bandwidth only");
        for (int j = 0; j < p->n_params && o < len; j++) {
            const pol_param *pp = &p->params[j];
            if (pp->type == POL_ENUM) {
                char all[256];
                choices_of(pp, all, sizeof all);
                o += (size_t)snprintf(buf + o, len - o, "      %s=%s (default %s) %s\n", pp->name, all,
                                      pp->choices[(int)pp->def].name, pp->help);
                for (const pol_choice *c = pp->choices; c->name && o < len; c++)
                    if (c->sets) o += (size_t)snprintf(buf + o, len - o, "          %s: %s\n", c->name, c->sets);
            } else {
                o += (size_t)snprintf(buf + o, len - o, "      %s=%g (%g..%g) %s\n", pp->name, pp->def, pp->lo, pp->hi,
                                      pp->help);
            }
        }
    }
}

/* ---------------------------------------------------------------- selections */

void pol_sel_head(pol_sel *s, int h)
{
    if (h > 0) s->per_head = 1;
    for (int j = h; j <= s->n_head_kv; j++) s->off[j] = s->n;
}

void pol_sel_add(pol_sel *s, int page, const uint64_t *mask)
{
    if (s->n >= s->cap) return;   /* sized by the runtime for every page of every head */
    s->idx[s->n] = page;
    s->mask[s->n] = mask;
    s->n++;
    s->off[s->n_head_kv] = s->n;
}

/* ---------------------------------------------------------------- runtime */

struct pol_set {
    pol_spec spec;
    pol_env env;
    int *global;
    void *st[2];
    pol_sel sel;
    pol_step_stats stats;
    /* The page map: page i's count is hits[i], plus runs[k] for every k > i (a step that attended
     * pages 0 .. k - 1 of a head in one run counts once in runs[k]), summed into view when read. */
    int64_t *hits, *runs, *view;
    int64_t n_map, cap_map;
    int *last_pages;
    int n_last, cap_last;
    int64_t question;         /* the next prefill ends with a question of this many tokens (0: none known) */
};

pol_set *pol_set_create(const pol_spec *spec, const pol_env *env, char *err, size_t errlen)
{
    pol_set *ps = calloc(1, sizeof *ps);
    if (!ps) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ps->spec = *spec;
    ps->env = *env;
    ps->env.trace = NULL;   /* each set owns its own (pol_set_trace) */
    /* a selection's answer left with the backend is read after the step: only where the cache
     * stays as it is until then */
    if (!pol_spec_decode_keeps_cache(spec)) ps->env.sel_buf = NULL, ps->env.bits_buf = NULL;
    ps->global = malloc(sizeof(int) * (size_t)(env->n_global > 0 ? env->n_global : 1));
    ps->sel.off = calloc((size_t)env->n_head_kv + 1, sizeof(int64_t));
    if (!ps->global || !ps->sel.off) {
        pol_set_free(ps);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    memcpy(ps->global, env->global, sizeof(int) * (size_t)env->n_global);
    ps->env.global = ps->global;
    ps->sel.n_head_kv = env->n_head_kv;
    for (int i = 0; i < spec->n; i++) {
        if (spec->ops[i]->create(&ps->st[i], &ps->env, spec->vals[i], err, errlen)) {
            pol_set_free(ps);
            return NULL;
        }
    }
    return ps;
}

void pol_set_free(pol_set *ps)
{
    if (!ps) return;
    for (int i = 0; i < ps->spec.n; i++)
        if (ps->st[i]) ps->spec.ops[i]->destroy(ps->st[i]);
    free(ps->global);
    free(ps->sel.off);
    free(ps->sel.idx);
    free(ps->sel.mask);
    free(ps->hits);
    free(ps->runs);
    free(ps->view);
    free(ps->last_pages);
    pol_trace_free(ps->env.trace);
    free(ps);
}

int pol_set_trace(pol_set *ps, int64_t lo, int64_t hi)
{
    pol_trace *t = pol_trace_create(lo, hi);
    if (!t) return -1;
    pol_trace_free(ps->env.trace);
    ps->env.trace = t;
    return 0;
}

const char *pol_set_trace_text(const pol_set *ps) { return pol_trace_text(ps->env.trace); }

const pol_spec *pol_set_spec(const pol_set *ps) { return &ps->spec; }
const pol_env *pol_set_env(const pol_set *ps) { return &ps->env; }
const pol_step_stats *pol_set_stats(const pol_set *ps) { return &ps->stats; }

int pol_set_saves_memory(const pol_set *ps)
{
    for (int i = 0; i < ps->spec.n; i++)
        if (ps->spec.ops[i]->stage == POL_STAGE_PREFILL) return 1;
    return 0;
}

int pol_set_check(pol_set *ps, int64_t ctx, char *err, size_t errlen)
{
    for (int i = 0; i < ps->spec.n; i++) {
        const pol_ops *p = ps->spec.ops[i];
        /* every budget given as a token count must fit in the context; the rest is the policy's */
        double b = pol_spec_value(&ps->spec, i, "budget", 0);
        if (b >= 1 && (int64_t)b > ctx) {
            snprintf(err, errlen, "%s: budget %lld tokens is larger than the context (%lld tokens)", p->name,
                     (long long)b, (long long)ctx);
            return -1;
        }
        if (p->check && p->check(ps->st[i], &ps->env, ctx, err, errlen)) return -1;
    }
    return 0;
}

void pol_set_begin(pol_set *ps, const int32_t *tokens, int64_t n, int64_t p0, int decoding)
{
    if (decoding) pol_trace_at(ps->env.trace, "decode pos %lld", (long long)p0);
    for (int i = 0; i < ps->spec.n; i++) {
        const pol_ops *p = ps->spec.ops[i];
        if (p->begin) p->begin(ps->st[i], &ps->env, tokens, n, p0, decoding);
    }
}

void pol_set_prepare(pol_set *ps, int64_t p0)
{
    for (int i = 0; i < ps->spec.n; i++) {
        const pol_ops *p = ps->spec.ops[i];
        if (p->prepare) p->prepare(ps->st[i], &ps->env, p0);
    }
}

int pol_set_layer_done(pol_set *ps, int il, const pol_chunk *c, char *err, size_t errlen)
{
    if (!c->decoding)
        pol_trace_at(ps->env.trace, "prefill %lld+%lld%s", (long long)c->p0, (long long)c->n, c->last ? " last" : "");
    for (int i = 0; i < ps->spec.n; i++) {
        const pol_ops *p = ps->spec.ops[i];
        if (p->layer_done && p->layer_done(ps->st[i], &ps->env, il, c, err, errlen)) return -1;
    }
    return 0;
}

/* The shape the first policy that asks for one wants (only a prefill policy does). */
static pol_shape prefill_shape(const pol_set *ps)
{
    for (int i = 0; i < ps->spec.n; i++)
        if (ps->spec.ops[i]->prefill_shape) return ps->spec.ops[i]->prefill_shape(ps->st[i]);
    return (pol_shape){ 0, 0 };
}

int pol_set_chunk_size(const pol_set *ps) { return prefill_shape(ps).chunk; }
/* The probe is the question (the task's own tokens, as TAKE and LASER-KV mean it), at most the
 * policy's p of them; without a known question, the prompt's last p tokens. */
int pol_set_probe_tokens(const pol_set *ps)
{
    int p = prefill_shape(ps).probe;
    return ps->question > 0 && ps->question < p ? (int)ps->question : p;
}

int pol_set_decode_can_defer(const pol_set *ps) { return pol_spec_decode_keeps_cache(&ps->spec); }

int pol_set_prefill_layer_free(const pol_set *ps)
{
    for (int i = 0; i < ps->spec.n; i++)
        if (ps->spec.ops[i]->layer_done) return 0;
    return 1;
}

/* A selection reads its query only through backend ops (bound_pages, scores), which take the
 * device's copy; a layer_done reads the chunk's queries in host memory. (The residency tests fail
 * a policy that reads them on the host unannounced: they see NaN there.) */
int pol_set_query_rows(const pol_set *ps, const pol_chunk *c, int64_t *r0, int64_t *r1)
{
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < ps->spec.n; i++) {
        const pol_ops *p = ps->spec.ops[i];
        if (!p->layer_done || (c->decoding && p->prefill_only)) continue;
        int64_t a = 0, z = c->n + c->n_probe;
        if (p->query_rows) p->query_rows(ps->st[i], c, &a, &z);
        if (z <= a) continue;
        if (hi <= lo) lo = a, hi = z;
        else lo = a < lo ? a : lo, hi = z > hi ? z : hi;
    }
    *r0 = hi > lo ? lo : 0;
    *r1 = hi > lo ? hi : 0;
    return hi > lo;
}

const pol_sel *pol_set_select(pol_set *ps, int il, const float *q)
{
    int k = -1;
    for (int i = 0; i < ps->spec.n; i++)
        if (ps->spec.ops[i]->stage == POL_STAGE_DECODE && ps->spec.ops[i]->select) k = i;
    if (k < 0) return NULL;
    int64_t need = 0;
    for (int h = 0; h < ps->env.n_head_kv; h++) need += kv_n_pages(ps->env.kv, il, h);
    if (need > ps->sel.cap) {
        int64_t nc = need * 2;
        int *ni = realloc(ps->sel.idx, sizeof(int) * (size_t)nc);
        if (ni) ps->sel.idx = ni;
        const uint64_t **nm = realloc(ps->sel.mask, sizeof *nm * (size_t)nc);
        if (nm) ps->sel.mask = nm;
        if (!ni || !nm) return NULL;   /* out of memory: attend to everything, which is always correct */
        ps->sel.cap = nc;
    }
    ps->sel.n = 0;
    ps->sel.per_head = 0;
    ps->sel.best = ps->sel.n_best = NULL;
    ps->sel.from = NULL;
    ps->sel.bits = NULL;
    ps->sel.words = 0;
    ps->sel.spans = NULL;
    memset(ps->sel.off, 0, sizeof(int64_t) * (size_t)(ps->env.n_head_kv + 1));
    if (!ps->spec.ops[k]->select(ps->st[k], &ps->env, il, q, &ps->sel)) return NULL;
    if (!ps->sel.per_head) ps->sel.off[1] = ps->sel.n;
    return &ps->sel;
}

void pol_set_chosen(pol_set *ps, int il, const uint64_t *bits, int64_t words)
{
    for (int i = 0; i < ps->spec.n; i++)
        if (ps->spec.ops[i]->chosen) ps->spec.ops[i]->chosen(ps->st[i], &ps->env, il, bits, words);
}

void pol_set_place(pol_set *ps)
{
    for (int i = 0; i < ps->spec.n; i++)
        if (ps->spec.ops[i]->place) ps->spec.ops[i]->place(ps->st[i], &ps->env);
}

void pol_set_reselect(pol_set *ps, int64_t pos, int64_t keep_from, pol_change *chg)
{
    memset(chg, 0, sizeof *chg);
    if (!ps) return;
    for (int i = 0; i < ps->spec.n; i++) {
        if (!ps->spec.ops[i]->reselect) continue;
        chg->supported = 1;
        pol_trace_at(ps->env.trace, "reselect pos %lld", (long long)pos);
        ps->spec.ops[i]->reselect(ps->st[i], &ps->env, pos, keep_from, chg);
    }
}

int pol_set_can_reselect(const pol_set *ps)
{
    for (int i = 0; ps && i < ps->spec.n; i++)
        if (ps->spec.ops[i]->reselect) return 1;
    return 0;
}

void pol_set_record_step(pol_set *ps, int64_t pages, int64_t tokens, uint64_t bytes, double select_ms,
                         double attn_ms, int64_t pages_total)
{
    pol_step_stats *s = &ps->stats;
    if (s->steps == 0) s->select_ms_first = select_ms;
    s->steps++;
    s->pages_last = pages;
    s->tokens_last = tokens;
    s->bytes_touched_last = bytes;
    s->bytes_touched_total += bytes;
    s->select_ms_last = select_ms;
    s->select_ms_total += select_ms;
    s->attn_ms_total += attn_ms;
    s->pages_total_last = pages_total;
    s->pages_sum += pages;
    s->pages_total_sum += pages_total;
}

/* Room in the page map for logical page i. 0, or -1 out of memory (the hit is not counted). */
/* Room in the map for page i (and a run of i + 1 pages). -1 when out of memory. */
static int map_room(pol_set *ps, int64_t i)
{
    if (i < ps->cap_map) return 0;
    int64_t nc = (i + 1) * 2;
    int64_t *arr[3] = { ps->hits, ps->runs, ps->view };
    const int64_t had = ps->cap_map ? ps->cap_map + 1 : 0;   /* entries each array holds */
    for (int a = 0; a < 3; a++) {
        int64_t *nm = realloc(arr[a], sizeof *nm * (size_t)(nc + 1));
        if (!nm) {   /* those grown so far stay grown, the room as it was */
            ps->hits = arr[0], ps->runs = arr[1], ps->view = arr[2];
            return -1;
        }
        memset(nm + had, 0, sizeof *nm * (size_t)(nc + 1 - had));
        arr[a] = nm;
    }
    ps->hits = arr[0], ps->runs = arr[1], ps->view = arr[2];
    ps->cap_map = nc;
    return 0;
}

void pol_set_hit_page(pol_set *ps, int64_t first_pos)
{
    int64_t i = first_pos / kv_page_size(ps->env.kv);
    if (i < 0 || map_room(ps, i)) return;
    ps->hits[i]++;
    if (i + 1 > ps->n_map) ps->n_map = i + 1;
}

void pol_set_hit_spans(pol_set *ps, const page_span *span, int64_t n, int64_t seq, int last)
{
    int64_t P = kv_page_size(ps->env.kv), hi = -1;
    int shift = (P & (P - 1)) == 0 ? __builtin_ctzll((unsigned long long)P) : -1;
    if (seq > n) seq = n;
    for (int64_t j = seq; j < n; j++)
        if (span[j].n && span[j].first > hi) hi = span[j].first;
    int64_t top = hi < 0 ? -1 : shift >= 0 ? hi >> shift : hi / P;
    if (seq - 1 > top) top = seq - 1;
    if (top < 0 || map_room(ps, top)) return;
    if (seq > 0) ps->runs[seq]++;   /* pages 0 .. seq - 1, one each */
    for (int64_t j = 0; last && j < seq; j++) pol_set_last_add(ps, (int)j);
    for (int64_t j = seq; j < n; j++) {
        if (!span[j].n || span[j].first < 0) continue;   /* an empty page attends to nothing */
        int64_t i = shift >= 0 ? span[j].first >> shift : span[j].first / P;
        ps->hits[i]++;
        if (last) pol_set_last_add(ps, (int)i);
    }
    if (top + 1 > ps->n_map) ps->n_map = top + 1;
}

void pol_set_last_reset(pol_set *ps) { ps->n_last = 0; }

void pol_set_last_add(pol_set *ps, int logical_page)
{
    if (ps->n_last == ps->cap_last) {
        int nc = ps->cap_last ? ps->cap_last * 2 : 256;
        int *n = realloc(ps->last_pages, sizeof *n * (size_t)nc);
        if (!n) return;
        ps->last_pages = n;
        ps->cap_last = nc;
    }
    ps->last_pages[ps->n_last++] = logical_page;
}

const int64_t *pol_set_page_map(const pol_set *ps, int64_t *n_pages)
{
    *n_pages = ps->n_map;
    int64_t acc = 0;   /* the runs that reach past page i */
    for (int64_t i = ps->n_map - 1; i >= 0; i--) {
        acc += ps->runs[i + 1];
        ps->view[i] = ps->hits[i] + acc;
    }
    return ps->view;
}

const int *pol_set_last_pages(const pol_set *ps, int *n)
{
    *n = ps->n_last;
    return ps->last_pages;
}

void pol_set_describe(const pol_set *ps, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < ps->spec.n && o < len; i++) {
        const pol_ops *p = ps->spec.ops[i];
        if (!p->describe) continue;
        char one[256];
        p->describe(ps->st[i], one, sizeof one);
        if (one[0]) o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? "; " : "", one);
        int probe = p->prefill_shape ? p->prefill_shape(ps->st[i]).probe : 0;
        if (!one[0] || probe <= 0 || o >= len) continue;
        if (ps->question <= 0)
            o += (size_t)snprintf(buf + o, len - o, " (no question yet: the probe is the prompt's last %d tokens)",
                                  probe);
        else if (ps->question <= probe)
            o += (size_t)snprintf(buf + o, len - o, " (the probe is the question, %lld tokens)",
                                  (long long)ps->question);
        else
            o += (size_t)snprintf(buf + o, len - o, " (the probe is the question's last %d tokens)", probe);
    }
}

void pol_set_question(pol_set *ps, int64_t n_tokens)
{
    if (ps) ps->question = n_tokens > 0 ? n_tokens : 0;
}

void pol_set_save(const pol_set *ps, bytes_w *w)
{
    bw_str(w, ps ? ps->spec.text : "");
    bw_u32(w, ps ? (uint32_t)ps->spec.n : 0);
    for (int i = 0; ps && i < ps->spec.n; i++) {
        bw_str(w, ps->spec.ops[i]->name);
        bytes_w one = { 0 };
        if (ps->spec.ops[i]->save) ps->spec.ops[i]->save(ps->st[i], &one);
        w->err |= one.err;
        bw_u32(w, (uint32_t)one.n);
        bw_put(w, one.p, one.n);
        bw_free(&one);
    }
}

int pol_set_load(pol_set *ps, bytes_r *r, int apply, char *err, size_t errlen)
{
    char text[256], name[64];
    br_str(r, text, sizeof text);
    uint32_t n = br_u32(r);
    if (r->err || n > 2) goto bad;
    for (uint32_t i = 0; i < n; i++) {
        br_str(r, name, sizeof name);
        uint32_t len = br_u32(r);
        const void *p = br_view(r, len);
        if (r->err) goto bad;
        if (!ps) continue;
        for (int k = 0; k < ps->spec.n; k++) {
            const pol_ops *op = ps->spec.ops[k];
            if (strcmp(op->name, name) || !op->load) continue;
            /* checking loads into a scratch state of the same policy, so a refusal changes nothing */
            void *target = ps->st[k];
            if (!apply && op->create(&target, &ps->env, ps->spec.vals[k], err, errlen) != 0) return -1;
            bytes_r one = { p, len, 0, 0 };
            int bad = op->load(target, &ps->env, &one) != 0 || one.err || one.off != len;
            if (!apply) op->destroy(target);
            if (bad) {
                snprintf(err, errlen, "the snapshot's %s state does not fit this session", name);
                return -1;
            }
        }
    }
    return 0;
bad:
    snprintf(err, errlen, "the snapshot's policy section is malformed");
    return -1;
}

int pol_split_list(const char *list, char specs[][256], int max)
{
    int n = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int cont = strchr(t, '=') && !strchr(t, ':') && n > 0;
        if (cont) {
            size_t l = strlen(specs[n - 1]);
            snprintf(specs[n - 1] + l, 256 - l, ",%s", t);
        } else {
            if (n == max) return -1;
            snprintf(specs[n++], 256, "%s", t);
        }
    }
    return n;
}

int pol_spec_decode_keeps_cache(const pol_spec *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->ops[i]->layer_done && !s->ops[i]->prefill_only) return 0;
    return 1;
}

/* Chunks of 256 tokens: the soft matching's own chunk, within which links are made. */
int pol_head_similarity(be_backend *b, const kv_cache *kv, int il, int g, double *out)
{
    return chelsea_head_similarity(b, kv, il, g, 256, out);
}

void pol_strip_budget(const char *spec, char *out, size_t cap)
{
    char buf[256];
    size_t o = 0;
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    out[0] = 0;
    char *save = NULL;
    for (char *part = strtok_r(buf, "+", &save); part; part = strtok_r(NULL, "+", &save)) {
        char *colon = strchr(part, ':');
        if (colon) *colon = 0;
        o += (size_t)snprintf(out + o, o < cap ? cap - o : 0, "%s%s", o ? "+" : "", part);
        if (!colon) continue;
        int first = 1;
        char *save2 = NULL;
        for (char *kv = strtok_r(colon + 1, ",", &save2); kv; kv = strtok_r(NULL, ",", &save2)) {
            if (!strncmp(kv, "budget=", 7)) continue;
            o += (size_t)snprintf(out + o, o < cap ? cap - o : 0, "%s%s", first ? ":" : ",", kv);
            first = 0;
        }
    }
}
