/* trace.c - the policies' decision trace over chosen positions (see trace.h). */
#include "engine/policy/trace.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TRACE_MAX_BYTES = 4 << 20, TRACE_MAX_UNITS = 48 };

struct pol_trace {
    int64_t lo, hi;          /* traced positions [lo, hi) */
    char at[96];
    char *text;
    size_t len, cap;
    int full;                /* TRACE_MAX_BYTES reached: later lines are dropped */
};

pol_trace *pol_trace_create(int64_t lo, int64_t hi)
{
    pol_trace *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->lo = lo;
    t->hi = hi;
    t->text = calloc(1, 1);
    if (!t->text) {
        free(t);
        return NULL;
    }
    t->cap = 1;
    return t;
}

void pol_trace_free(pol_trace *t)
{
    if (!t) return;
    free(t->text);
    free(t);
}

const char *pol_trace_text(const pol_trace *t) { return t ? t->text : ""; }

void pol_trace_at(pol_trace *t, const char *fmt, ...)
{
    if (!t) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->at, sizeof t->at, fmt, ap);
    va_end(ap);
}

static void append(pol_trace *t, const char *s, size_t n)
{
    if (t->full) return;
    if (t->len + n + 64 > TRACE_MAX_BYTES) {   /* the last line says so; later ones are dropped */
        s = "(trace truncated)\n";
        n = strlen(s);
        t->full = 1;
    }
    if (t->len + n + 1 > t->cap) {
        size_t nc = (t->len + n + 1) * 2;
        char *nt = realloc(t->text, nc);
        if (!nt) {
            t->full = 1;
            return;
        }
        t->text = nt;
        t->cap = nc;
    }
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->text[t->len] = 0;
}

static void appendf(pol_trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void appendf(pol_trace *t, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) append(t, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

int pol_trace_covers(const pol_trace *t, int64_t first, int64_t last)
{
    return t && last >= t->lo && first < t->hi;
}

void pol_trace_note(pol_trace *t, const char *fmt, ...)
{
    if (!t) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    appendf(t, "[%s] %s\n", t->at, buf);
}

/* The shared body: unit u covers [first[u], last[u]] or, with pos, the single position pos[u]. */
static void decision(pol_trace *t, const char *what, int il, int g, int64_t n, const float *score,
                     const unsigned char *kept, const int64_t *first, const int64_t *last, const int32_t *pos)
{
    if (!t || n <= 0) return;
    int64_t hits = 0;
    for (int64_t u = 0; u < n; u++) {
        int64_t a = pos ? pos[u] : first[u], b = pos ? pos[u] : last[u];
        hits += pol_trace_covers(t, a, b);
    }
    if (hits == 0) return;
    int64_t n_kept = 0;
    float lowest_kept = INFINITY, best_dropped = -INFINITY;
    for (int64_t u = 0; u < n; u++) {
        if (kept[u]) {
            n_kept++;
            if (isfinite(score[u]) && score[u] < lowest_kept) lowest_kept = score[u];
        } else if (score[u] > best_dropped) {
            best_dropped = score[u];
        }
    }
    appendf(t, "[%s] %s", t->at, what);
    if (il >= 0) appendf(t, " L%d", il);
    if (g >= 0) appendf(t, " h%d", g);
    appendf(t, ": %lld units, %lld kept; lowest kept %.5g, best dropped %.5g |", (long long)n, (long long)n_kept,
            (double)lowest_kept, (double)best_dropped);
    int listed = 0;
    for (int64_t u = 0; u < n; u++) {
        int64_t a = pos ? pos[u] : first[u], b = pos ? pos[u] : last[u];
        if (!pol_trace_covers(t, a, b)) continue;
        if (listed == TRACE_MAX_UNITS) {
            appendf(t, " ... (%lld more)", (long long)(hits - listed));
            break;
        }
        /* rank: 1 + units scoring strictly higher; ties: other units with the same score */
        int64_t above = 0, tied = 0;
        for (int64_t v = 0; v < n; v++) {
            if (score[v] > score[u]) above++;
            else if (score[v] == score[u] && v != u) tied++;
        }
        if (a == b) appendf(t, " %lld", (long long)a);
        else appendf(t, " %lld-%lld", (long long)a, (long long)b);
        appendf(t, " %.5g #%lld%s%s", (double)score[u], (long long)(above + 1), tied ? "=" : "", kept[u] ? " kept;" : " DROP;");
        listed++;
    }
    append(t, "\n", 1);
}

void pol_trace_units(pol_trace *t, const char *what, int il, int g, int64_t n, const float *score,
                     const unsigned char *kept, const int64_t *first, const int64_t *last)
{
    decision(t, what, il, g, n, score, kept, first, last, NULL);
}

void pol_trace_tokens(pol_trace *t, const char *what, int il, int g, int64_t n, const float *score,
                      const unsigned char *kept, const int32_t *pos)
{
    decision(t, what, il, g, n, score, kept, NULL, NULL, pos);
}
