/* uncertainty.c - per-token entropy bookkeeping, page statistics, thresholds and the event log. */
#include "engine/uncertainty.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"

/* A thresholds file is a few hundred bytes (with head similarities, a few KB). */
#define UNC_THRESHOLDS_MAX_BYTES ((size_t)1 << 20)

void unc_stats_of(const float *h, int64_t n, unc_stats *out)
{
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += h[i];
    double mean = n > 0 ? s / (double)n : 0;
    for (int64_t i = 0; i < n; i++) s2 += (h[i] - mean) * (h[i] - mean);   /* two passes: no cancellation */
    out->mean_h = mean;
    out->var_h = n > 0 ? s2 / (double)n : 0;
    out->n = n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double unc_quantile(double *v, int64_t n, double q)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    if (q <= 0) return v[0];
    if (q >= 1) return v[n - 1];
    double r = q * (double)(n - 1);
    int64_t lo = (int64_t)floor(r);
    double f = r - (double)lo;
    return lo + 1 < n ? v[lo] + f * (v[lo + 1] - v[lo]) : v[lo];
}

int unc_crosses(const unc_thresholds *t, const unc_stats *s)
{
    /* both high: the upper-right region of the paper's Fig. 4 (uncertain and erratic at once) */
    return t && t->valid && s->mean_h > t->h_mean && s->var_h > t->h_var;
}

int unc_thresholds_save(const char *path, const unc_thresholds *t, char *err, size_t errlen)
{
    /* a new file renamed over path: a reader never sees half a file, a link at path is replaced,
     * never followed */
    files_atomic fa;
    if (files_atomic_open(&fa, path, err, errlen)) return -1;
    FILE *f = fa.f;
    fprintf(f,
            "# kvchat uncertainty thresholds (kvchat calibrate): a generated page of `page` tokens is uncertain\n"
            "# when its mean entropy exceeds entropy_mean and the variance of its per-token entropy exceeds\n"
            "# entropy_var; both are the `quantile` of the pages seen with the full cache.\n"
            "model=%s\nfingerprint=%s\npage=%d\nquantile=%.4f\nsamples=%lld\nseed=%llu\nentropy_mean=%.9g\n"
            "entropy_var=%.9g\n",
            t->model, t->fingerprint, t->page, t->quantile, (long long)t->samples, (unsigned long long)t->seed,
            t->h_mean, t->h_var);
    if (t->n_heads > 0) {
        fputs("# key similarity of each global layer's KV heads (Chelsea spares the least similar)\nhead_similarity=", f);
        for (int i = 0; i < t->n_heads; i++)
            fprintf(f, "%s%d:%d:%.6f", i ? " " : "", t->head_sim[i].layer, t->head_sim[i].head, t->head_sim[i].sim);
        fputc('\n', f);
    }
    return files_atomic_commit(&fa, err, errlen);
}

int unc_thresholds_load(const char *path, unc_thresholds *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    /* read whole through the checked open (a FIFO, /dev/zero or a huge file refused at once) */
    size_t n;
    char *text = files_read_all(path, UNC_THRESHOLDS_MAX_BYTES, "a thresholds file", &n, err, errlen);
    if (!text) return -1;
    FILE *f = n > 0 ? fmemopen(text, n, "r") : NULL;
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, n > 0 ? strerror(errno) : "empty, expected a thresholds file");
        free(text);
        return -1;
    }
    char *line = NULL;
    size_t lcap = 0;
    int have_h = 0, have_v = 0, ln = 0, rc = -1;
    while (getline(&line, &lcap, f) > 0) {
        ln++;
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        char *eq = strchr(line, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected key=value", path, ln);
            goto out;
        }
        *eq = 0;
        const char *k = line, *v = eq + 1;
        char *end;
        if (!strcmp(k, "model")) {
            snprintf(t->model, sizeof t->model, "%s", v);
        } else if (!strcmp(k, "fingerprint")) {
            snprintf(t->fingerprint, sizeof t->fingerprint, "%s", v);
        } else if (!strcmp(k, "page")) {
            long pg = strtol(v, &end, 10);
            t->page = pg > 0 && pg <= 4096 ? (int)pg : 0;
        } else if (!strcmp(k, "quantile")) {
            t->quantile = strtod(v, &end);
        } else if (!strcmp(k, "samples")) {
            t->samples = strtoll(v, &end, 10);
        } else if (!strcmp(k, "seed")) {
            t->seed = strtoull(v, &end, 10);
        } else if (!strcmp(k, "head_similarity")) {
            t->n_heads = 0;
            for (const char *p = v; *p;) {
                int la, hd, used = 0;
                float sim;
                if (sscanf(p, "%d:%d:%f%n", &la, &hd, &sim, &used) != 3 || la < 0 || la > 32767 || hd < 0 ||
                    hd > 32767 || !isfinite(sim) || t->n_heads == UNC_MAX_HEADS) {
                    snprintf(err, errlen, "%s:%d: head_similarity wants LAYER:HEAD:SIMILARITY entries", path, ln);
                    goto out;
                }
                t->head_sim[t->n_heads++] = (unc_head_sim){ (int16_t)la, (int16_t)hd, sim };
                p += used;
                while (*p == ' ') p++;
            }
        } else if (!strcmp(k, "entropy_mean") || !strcmp(k, "entropy_var")) {
            errno = 0;
            double x = strtod(v, &end);
            if (end == v || *end || errno || !isfinite(x) || x < 0) {
                snprintf(err, errlen, "%s:%d: %s must be a non-negative number", path, ln, k);
                goto out;
            }
            if (k[8] == 'm') {
                t->h_mean = x;
                have_h = 1;
            } else {
                t->h_var = x;
                have_v = 1;
            }
        }   /* unknown keys: written by a newer kvchat, ignored */
    }
    if (!have_h || !have_v) {
        snprintf(err, errlen, "%s: missing entropy_mean or entropy_var", path);
        goto out;
    }
    t->valid = 1;
    snprintf(t->source, sizeof t->source, "%s", path);
    rc = 0;
out:
    free(line);
    fclose(f);
    free(text);
    return rc;
}

struct unc_monitor {
    int page, window;
    float *h, *v;
    int64_t n, cap;
    unc_event *ev;
    int n_ev, cap_ev;
    int64_t regenerated;
};

unc_monitor *unc_create(int page, int window)
{
    unc_monitor *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->page = page > 0 ? page : 32;
    m->window = window > 0 ? window : m->page;
    return m;
}

void unc_free(unc_monitor *m)
{
    if (!m) return;
    free(m->h);
    free(m->v);
    free(m->ev);
    free(m);
}

void unc_reset(unc_monitor *m)
{
    m->n = 0;
    m->n_ev = 0;
    m->regenerated = 0;
}

int unc_push(unc_monitor *m, double h, double v)
{
    if (m->n == m->cap) {
        int64_t nc = m->cap ? m->cap * 2 : 256;
        float *nh = realloc(m->h, sizeof(float) * (size_t)nc);
        if (!nh) return -1;
        m->h = nh;
        float *nv = realloc(m->v, sizeof(float) * (size_t)nc);
        if (!nv) return -1;
        m->v = nv;
        m->cap = nc;
    }
    m->h[m->n] = (float)h;
    m->v[m->n] = (float)v;
    m->n++;
    return 0;
}

void unc_drop(unc_monitor *m, int64_t n) { m->n = n < m->n ? m->n - n : 0; }
int64_t unc_count(const unc_monitor *m) { return m->n; }
const float *unc_entropy(const unc_monitor *m) { return m->h; }
const float *unc_varentropy(const unc_monitor *m) { return m->v; }
int unc_page_size(const unc_monitor *m) { return m->page; }

void unc_range(const unc_monitor *m, int64_t from, int64_t n, unc_stats *out)
{
    if (from < 0) from = 0;
    if (from > m->n) from = m->n;
    if (n > m->n - from) n = m->n - from;
    unc_stats_of(m->h + from, n, out);
}

void unc_window(const unc_monitor *m, unc_stats *out)
{
    int64_t n = m->n < m->window ? m->n : m->window;
    unc_range(m, m->n - n, n, out);
}

int unc_add_event(unc_monitor *m, const unc_event *e)
{
    if (m->n_ev == m->cap_ev) {
        int nc = m->cap_ev ? m->cap_ev * 2 : 8;
        unc_event *ne = realloc(m->ev, sizeof *ne * (size_t)nc);
        if (!ne) return -1;
        m->ev = ne;
        m->cap_ev = nc;
    }
    m->ev[m->n_ev++] = *e;
    return 0;
}

unc_event *unc_last_event(unc_monitor *m) { return m->n_ev ? &m->ev[m->n_ev - 1] : NULL; }

const unc_event *unc_events(const unc_monitor *m, int *n)
{
    *n = m->n_ev;
    return m->ev;
}

int64_t unc_regenerated_tokens(const unc_monitor *m) { return m->regenerated; }
void unc_note_regenerated(unc_monitor *m, int64_t n) { m->regenerated += n; }

static size_t list_pages(char *buf, size_t len, const int *p, int n)
{
    size_t o = 0;
    int shown = n < UNC_EVENT_PAGES ? n : UNC_EVENT_PAGES;
    for (int i = 0; i < shown && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%d", i ? "," : "", p[i]);
    if (n > shown && o < len) o += (size_t)snprintf(buf + o, len - o, ",...");
    if (n == 0 && o < len) o += (size_t)snprintf(buf + o, len - o, "none");
    return o;
}

void unc_event_format(const unc_event *e, char *buf, size_t len)
{
    char add[160], rem[160];
    list_pages(add, sizeof add, e->added, e->n_added);
    list_pages(rem, sizeof rem, e->removed, e->n_removed);
    int o = snprintf(buf, len,
                     "event: answer page %lld (tokens %lld-%lld, position %lld): mean H %.3f (threshold %.3f), Var(H) "
                     "%.3f (threshold %.3f); reselection added %d pages [%s], removed %d [%s]",
                     (long long)e->page, (long long)(e->step - e->stats.n + 1), (long long)e->step, (long long)e->pos,
                     e->stats.mean_h, e->thr_h, e->stats.var_h, e->thr_v, e->n_added, add, e->n_removed, rem);
    if (o < 0 || (size_t)o >= len) return;
    if (!e->regenerated)
        snprintf(buf + o, len - (size_t)o, "; not regenerated (%s)",
                 e->regen_spent ? "regeneration budget spent" : "backtracking off");
    else
        snprintf(buf + o, len - (size_t)o, "; regenerated%s: mean H %.3f, Var(H) %.3f over %lld tokens, %s",
                 e->changed_text ? " with different text" : " (same text)", e->after.mean_h, e->after.var_h,
                 (long long)e->after.n, e->recovered ? "back under the thresholds" : "still over a threshold");
}
