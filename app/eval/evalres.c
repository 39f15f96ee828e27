/* evalres.c - eval records: CSV rows out and back in (for resume), and the Markdown summary. */
#include "app/eval/evalres.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "common/text.h"
#include "engine/policy/policy.h"

const char *const evalres_header =
    "task,ctx,tokens,sample,depth,turn,policy,budget,backtrack,correct,control,ppl,answer,expected,answer_tokens,"
    "kv_bytes,kv_peak_bytes,kv_full_bytes,prefill_s,decode_s,seconds,status\n";

void evalres_init(eval_rec *r)
{
    memset(r, 0, sizeof *r);
    r->depth = -1;
    r->correct = -1;
    r->control = -1;
    r->ppl = NAN;
    snprintf(r->budget, sizeof r->budget, "-");
    snprintf(r->status, sizeof r->status, "ok");
}

int evalres_push(eval_recs *rs, const eval_rec *r)
{
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 256;
        eval_rec *v = realloc(rs->v, cap * sizeof *v);
        if (!v) return -1;
        rs->v = v;
        rs->cap = cap;
    }
    rs->v[rs->n++] = *r;
    return 0;
}

void evalres_free(eval_recs *rs)
{
    free(rs->v);
    memset(rs, 0, sizeof *rs);
}

static void csv_text(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
    fputc('"', f);
}

void evalres_write(FILE *f, const eval_rec *r)
{
    fprintf(f, "%s,%lld,%lld,%d,%.4f,%d,", r->task, (long long)r->ctx, (long long)r->tokens, r->sample, r->depth,
            r->turn);
    csv_text(f, r->policy);
    fprintf(f, ",%s,%d,", r->budget, r->backtrack);
    if (r->correct >= 0) fprintf(f, "%d", r->correct);
    fputc(',', f);
    if (r->control >= 0) fprintf(f, "%d", r->control);
    fputc(',', f);
    if (!isnan(r->ppl)) fprintf(f, "%.4f", r->ppl);
    fputc(',', f);
    csv_text(f, r->answer);
    fputc(',', f);
    csv_text(f, r->expected);
    fprintf(f, ",%lld,%llu,%llu,%llu,%.3f,%.3f,%.3f,", (long long)r->answer_tokens, (unsigned long long)r->kv_bytes,
            (unsigned long long)r->kv_peak, (unsigned long long)r->kv_full, r->prefill_s, r->decode_s, r->seconds);
    csv_text(f, r->status);
    fputc('\n', f);
    fflush(f);
}

int evalres_split_csv(char *line, char **fld, int max)
{
    int n = 0;
    char *s = line;
    while (n < max) {
        char *w = s;
        fld[n++] = s;
        if (*s == '"') {
            s++;
            for (;;) {
                if (!*s) break;
                if (*s == '"' && s[1] == '"') {
                    *w++ = '"';
                    s += 2;
                } else if (*s == '"') {
                    s++;
                    break;
                } else {
                    *w++ = *s++;
                }
            }
            while (*s && *s != ',') s++;
        } else {
            while (*s && *s != ',' && *s != '\n' && *s != '\r') *w++ = *s++;
        }
        int more = *s == ',';
        *w = 0;
        if (!more) break;
        s++;
    }
    return n;
}

enum { C_TASK, C_CTX, C_TOKENS, C_SAMPLE, C_DEPTH, C_TURN, C_POLICY, C_BUDGET, C_BT, C_CORRECT, C_CONTROL, C_PPL,
       C_ANSWER, C_EXPECTED, C_ATOK, C_KV, C_KVPEAK, C_KVFULL, C_PREFILL, C_DECODE, C_SECONDS, C_STATUS, C_N };
static const char *const col_names[C_N] = { "task", "ctx", "tokens", "sample", "depth", "turn", "policy", "budget",
                                            "backtrack", "correct", "control", "ppl", "answer", "expected",
                                            "answer_tokens", "kv_bytes", "kv_peak_bytes", "kv_full_bytes",
                                            "prefill_s", "decode_s", "seconds", "status" };

/* A correct/control field as -1, 0 or 1, whatever number a foreign CSV holds (the summary sums them). */
static int tri_state(const char *s)
{
    int v = atoi(s);
    return v < 0 ? -1 : v > 0;
}

int evalres_read(const char *path, eval_recs *rs, char *err, size_t errlen)
{
    FILE *f = files_open_read(path, EVALRES_MAX_BYTES, "an eval CSV", err, errlen);
    if (!f) return errno == ENOENT ? 0 : -1;   /* none yet: a new run */
    char line[4096], *fld[64];
    int col[C_N], ok = 0;
    if (fgets(line, sizeof line, f)) {
        int n = evalres_split_csv(line, fld, 64);
        for (int c = 0; c < C_N; c++) {
            col[c] = -1;
            for (int i = 0; i < n; i++)
                if (!strcmp(fld[i], col_names[c])) col[c] = i;
        }
        ok = col[C_TASK] >= 0 && col[C_CTX] >= 0 && col[C_SAMPLE] >= 0 && col[C_POLICY] >= 0 && col[C_BUDGET] >= 0;
    } else {
        fclose(f);
        return 0;   /* empty: a run that stopped before its first row */
    }
    if (!ok) {
        snprintf(err, errlen, "%s: not a kvchat eval CSV (no task, ctx, sample, policy and budget columns)", path);
        fclose(f);
        return -1;
    }
    long lineno = 1;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(err, errlen, "%s:%ld: line too long", path, lineno);
            fclose(f);
            return -1;
        }
        if (line[0] == '\n' || line[0] == 0) continue;
        if (!strchr(line, '\n')) continue;   /* a last row cut short by an interrupted write: run it again */
        int n = evalres_split_csv(line, fld, 64);
        const char *v[C_N];
        for (int c = 0; c < C_N; c++) v[c] = col[c] >= 0 && col[c] < n ? fld[col[c]] : "";
        eval_rec r;
        evalres_init(&r);
        /* what the summary prints (to a terminal too) arrives with its control bytes made visible */
        text_escape(v[C_TASK], r.task, sizeof r.task, 0);
        r.ctx = atoll(v[C_CTX]);
        r.tokens = atoll(v[C_TOKENS]);
        r.sample = atoi(v[C_SAMPLE]);
        if (*v[C_DEPTH]) r.depth = atof(v[C_DEPTH]);
        r.turn = atoi(v[C_TURN]);
        text_escape(v[C_POLICY], r.policy, sizeof r.policy, 0);
        text_escape(*v[C_BUDGET] ? v[C_BUDGET] : "-", r.budget, sizeof r.budget, 0);
        r.backtrack = atoi(v[C_BT]);
        if (*v[C_CORRECT]) r.correct = tri_state(v[C_CORRECT]);
        if (*v[C_CONTROL]) r.control = tri_state(v[C_CONTROL]);
        if (*v[C_PPL]) r.ppl = atof(v[C_PPL]);
        snprintf(r.answer, sizeof r.answer, "%s", v[C_ANSWER]);
        snprintf(r.expected, sizeof r.expected, "%s", v[C_EXPECTED]);
        r.answer_tokens = atoll(v[C_ATOK]);
        r.kv_bytes = strtoull(v[C_KV], NULL, 10);
        r.kv_peak = strtoull(v[C_KVPEAK], NULL, 10);
        r.kv_full = strtoull(v[C_KVFULL], NULL, 10);
        r.prefill_s = atof(v[C_PREFILL]);
        r.decode_s = atof(v[C_DECODE]);
        r.seconds = atof(v[C_SECONDS]);
        if (*v[C_STATUS]) text_escape(v[C_STATUS], r.status, sizeof r.status, 0);
        if (evalres_push(rs, &r)) {
            snprintf(err, errlen, "out of memory");
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return 0;
}

long evalres_find(const eval_recs *rs, const char *task, int64_t ctx, int sample, int turn, const char *policy,
                  const char *budget, int backtrack)
{
    for (size_t i = rs->n; i-- > 0;) {
        const eval_rec *r = &rs->v[i];
        if (r->ctx == ctx && r->sample == sample && r->turn == turn && r->backtrack == backtrack &&
            !strcmp(r->task, task) && !strcmp(r->policy, policy) && !strcmp(r->budget, budget))
            return (long)i;
    }
    return -1;
}

double evalres_budget_value(const char *budget)
{
    char *end;
    double v = strtod(budget, &end);
    return end == budget ? NAN : v;
}

/* ---- summary --------------------------------------------------------------------------------- */

typedef struct group {
    const eval_rec *first;
    int task_rank, policy_rank;
    int runs, scored, correct, retrieved, refused, ppl_n, dppl_n;
    double ppl_sum, dppl_sum, lratio_sum, kv_sum, peak_sum, tok, dec_s, sec;
} group;

/* Index of s in names (adding it): the order things first appeared in, which is the run's order. */
static int rank_of(const char **names, int *n, int max, const char *s)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(names[i], s)) return i;
    if (*n == max) return max;
    names[*n] = s;
    return (*n)++;
}

static int cmp_group(const void *a, const void *b)
{
    const group *x = a, *y = b;
    if (x->task_rank != y->task_rank) return x->task_rank - y->task_rank;
    if (x->first->ctx != y->first->ctx) return x->first->ctx < y->first->ctx ? -1 : 1;
    if (x->policy_rank != y->policy_rank) return x->policy_rank - y->policy_rank;
    double bx = evalres_budget_value(x->first->budget), by = evalres_budget_value(y->first->budget);
    if (isnan(bx) != isnan(by)) return isnan(bx) ? -1 : 1;
    if (!isnan(bx) && bx != by) return bx < by ? -1 : 1;
    return (x->first->backtrack > y->first->backtrack) - (x->first->backtrack < y->first->backtrack);
}

static int is_retrieved(const eval_rec *r)
{
    return r->correct == 1 && r->control != 1;
}

static const eval_rec *full_of(const eval_recs *rs, const eval_rec *r)
{
    for (size_t i = 0; i < rs->n; i++) {
        const eval_rec *q = &rs->v[i];
        if (q->ctx == r->ctx && q->sample == r->sample && q->turn == r->turn && !strcmp(q->policy, POL_FULL) &&
            !strcmp(q->task, r->task) && !isnan(q->ppl))
            return q;
    }
    return NULL;
}

int evalres_compared(const eval_recs *rs, const char *task, int64_t ctx)
{
    for (size_t i = 0; i < rs->n; i++) {
        const eval_rec *r = &rs->v[i];
        if (r->ctx == ctx && !strcmp(r->task, task) && strcmp(r->policy, POL_FULL) && strcmp(r->policy, "nodoc"))
            return 1;
    }
    return 0;
}

/* A pivot row: one configuration family (policy and backtrack setting) across lengths and budgets. */
typedef struct pivot_row {
    const char *policy;
    int backtrack;
} pivot_row;

static int row_matches(const eval_rec *r, const char *task, int64_t ctx, const pivot_row *pr)
{
    return r->ctx == ctx && r->backtrack == pr->backtrack && !strcmp(r->status, "ok") && !strcmp(r->task, task) &&
           !strcmp(r->policy, pr->policy);
}

/* "5%" for a fraction of the context, "512 tok" for a count, "default budget" for "-". */
static void budget_label(FILE *f, const char *budget)
{
    double v = evalres_budget_value(budget);
    if (!strcmp(budget, "-")) fprintf(f, "default budget");
    else if (isnan(v)) fprintf(f, "%s", budget);
    else if (v < 1) fprintf(f, "%g%%", v * 100);
    else fprintf(f, "%g tok", v);
}

/* The control and the full cache have no budget: their rows stand under every budget column. */
static int budgetless(const char *policy)
{
    return !strcmp(policy, POL_FULL) || !strcmp(policy, "nodoc");
}

/* One cell of a task's pivot: right answers of those scored ("a/n"), or for a scored-by-perplexity
 * task the paired change against the full cache (the full cache's own cell: its mean perplexity).
 * A configuration without a budget (full, nodoc) fills every budget column of its length. */
static void pivot_cell(FILE *f, const eval_recs *rs, const char *task, int64_t ctx, const char *budget,
                       const pivot_row *pr, int is_ppl)
{
    int n = 0, ok = 0, np = 0, nl = 0;
    double ppl = 0, lratio = 0;
    for (size_t i = 0; i < rs->n; i++) {
        const eval_rec *r = &rs->v[i];
        if (!row_matches(r, task, ctx, pr) || (strcmp(r->budget, budget) && !budgetless(r->policy))) continue;
        if (r->correct >= 0) {
            n++;
            ok += r->correct;
        }
        if (!isnan(r->ppl)) {
            np++;
            ppl += r->ppl;
            const eval_rec *fr = strcmp(r->policy, POL_FULL) ? full_of(rs, r) : NULL;
            if (fr) {
                nl++;
                lratio += log(r->ppl / fr->ppl);
            }
        }
    }
    if (is_ppl && nl) fprintf(f, " %+.1f%% |", 100.0 * expm1(lratio / nl));
    else if (is_ppl && np && !strcmp(pr->policy, POL_FULL)) fprintf(f, " %.2f |", ppl / np);
    else if (!is_ppl && n) fprintf(f, " %d/%d |", ok, n);
    else fprintf(f, " |");
}

/* Whether task ran some configuration at this length and budget (a column of its pivot); "-" is a
 * column when a policy other than the control and the full cache ran without a budget (eval with no
 * --budget: each policy at its default). */
static int has_column(const eval_recs *rs, const char *task, int64_t ctx, const char *budget)
{
    for (size_t i = 0; i < rs->n; i++) {
        const eval_rec *r = &rs->v[i];
        if (r->ctx == ctx && !strcmp(r->budget, budget) && !strcmp(r->task, task) && !budgetless(r->policy)) return 1;
    }
    return 0;
}

/* Per task that compared policies: a table of policy x (length, budget), the form a results page
 * quotes (right answers, or perplexity against the full cache). */
static void task_pivots(FILE *f, const eval_recs *rs, const char **tasks, int nt, const int64_t *ctxs, int nc,
                        const char **buds, int nb)
{
    pivot_row *rows = calloc(rs->n ? rs->n : 1, sizeof *rows);
    if (!rows) return;
    for (int t = 0; t < nt; t++) {
        int64_t tc[32], col_ctx[32 * 32];
        const char *col_bud[32 * 32];
        int ntc = 0, is_ppl = 0, nr = 0;
        for (int c = 0; c < nc; c++)
            if (evalres_compared(rs, tasks[t], ctxs[c])) tc[ntc++] = ctxs[c];
        if (!ntc) continue;
        for (size_t i = 0; i < rs->n; i++) {   /* rows in the run's order; the control first */
            const eval_rec *r = &rs->v[i];
            if (strcmp(r->task, tasks[t])) continue;
            is_ppl |= !isnan(r->ppl);
            int k = 0;
            while (k < nr && (strcmp(rows[k].policy, r->policy) || rows[k].backtrack != r->backtrack)) k++;
            if (k < nr) continue;
            rows[nr++] = (pivot_row){ r->policy, r->backtrack };
            for (int b = nr - 1; b > 0 && !strcmp(rows[b].policy, "nodoc") && strcmp(rows[b - 1].policy, "nodoc"); b--) {
                pivot_row x = rows[b];
                rows[b] = rows[b - 1];
                rows[b - 1] = x;
            }
        }
        fprintf(f, "\n%s, %s:\n\n| policy |", tasks[t],
                is_ppl ? "perplexity against the full cache (the geometric mean of each sample's ratio, as a change; "
                         "the full cache's row: its mean perplexity)"
                       : "right answers");
        int cols = 0;   /* the (length, budget) columns, found once for the header and every row */
        for (int c = 0; c < ntc; c++)
            for (int b = 0; b < nb; b++)
                if (has_column(rs, tasks[t], tc[c], buds[b])) {
                    col_ctx[cols] = tc[c];
                    col_bud[cols++] = buds[b];
                    fprintf(f, " %lld, ", (long long)tc[c]);
                    budget_label(f, buds[b]);
                    fprintf(f, " |");
                }
        fprintf(f, "\n| --- |");
        for (int k = 0; k < cols; k++) fprintf(f, " ---: |");
        fputc('\n', f);
        for (int k = 0; k < nr; k++) {
            int variants = 0;
            for (int j = 0; j < nr; j++) variants += !strcmp(rows[j].policy, rows[k].policy);
            fprintf(f, "| %s", rows[k].policy);
            if (variants > 1) fprintf(f, " (backtrack %d)", rows[k].backtrack);
            fprintf(f, " |");
            for (int c = 0; c < cols; c++) pivot_cell(f, rs, tasks[t], col_ctx[c], col_bud[c], &rows[k], is_ppl);
            fputc('\n', f);
        }
    }
    free(rows);
}

void evalres_summary_md(FILE *f, const eval_recs *rs)
{
    const char *tasks[64], *pols[128];
    int nt = 0, np = 0, ng = 0;
    group *g = calloc(rs->n ? rs->n : 1, sizeof *g);
    if (!g) return;
    for (size_t i = 0; i < rs->n; i++) {
        const eval_rec *r = &rs->v[i];
        int k;
        for (k = 0; k < ng; k++) {
            const eval_rec *q = g[k].first;
            if (q->ctx == r->ctx && q->backtrack == r->backtrack && !strcmp(q->task, r->task) &&
                !strcmp(q->policy, r->policy) && !strcmp(q->budget, r->budget))
                break;
        }
        if (k == ng) {
            g[ng].first = r;
            g[ng].task_rank = rank_of(tasks, &nt, 64, r->task);
            g[ng].policy_rank = strcmp(r->policy, "nodoc") ? rank_of(pols, &np, 128, r->policy) + 1 : 0;
            ng++;
        }
        group *G = &g[k];
        if (strcmp(r->status, "ok")) {
            G->refused++;
            continue;
        }
        G->runs++;
        if (r->correct >= 0) {
            G->scored++;
            G->correct += r->correct;
            G->retrieved += is_retrieved(r);
        }
        if (!isnan(r->ppl)) {
            G->ppl_n++;
            G->ppl_sum += r->ppl;
            const eval_rec *fr = strcmp(r->policy, POL_FULL) ? full_of(rs, r) : NULL;
            if (fr) {
                G->dppl_n++;
                G->dppl_sum += r->ppl - fr->ppl;
                G->lratio_sum += log(r->ppl / fr->ppl);
            }
        }
        G->kv_sum += (double)r->kv_bytes;
        G->peak_sum += (double)r->kv_peak;
        G->tok += (double)r->answer_tokens;
        G->dec_s += r->decode_s;
        G->sec += r->seconds;
    }
    qsort(g, (size_t)ng, sizeof *g, cmp_group);
    /* ppl vs full: the geometric mean of each sample's ratio to the full cache's, as a change (the
     * same documents paired, so a hard document does not outweigh the others) */
    fprintf(f, "| task | ctx | policy | budget | bt | runs | answered | retrieved | ppl | ppl - full | ppl vs full | "
               "KV MiB | peak KV MiB | decode tok/s | s/run |\n");
    fprintf(f, "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int k = 0; k < ng; k++) {
        const group *G = &g[k];
        const eval_rec *r = G->first;
        fprintf(f, "| %s | %lld | %s | %s | %d | %d | ", r->task, (long long)r->ctx, r->policy, r->budget, r->backtrack,
                G->runs);
        if (G->runs == 0) {
            fprintf(f, "n/a (%s) | | | | | | | | |\n", strncmp(r->status, "refused", 7) ? r->status : "budget refused");
            continue;
        }
        if (G->scored && G->policy_rank == 0) fprintf(f, "%d/%d | - | ", G->correct, G->scored);   /* the control */
        else if (G->scored) fprintf(f, "%d/%d | %d/%d | ", G->correct, G->scored, G->retrieved, G->scored);
        else fprintf(f, "- | - | ");
        if (G->ppl_n) fprintf(f, "%.3f | ", G->ppl_sum / G->ppl_n);
        else fprintf(f, "- | ");
        if (G->dppl_n) fprintf(f, "%+.3f | %+.1f%% | ", G->dppl_sum / G->dppl_n, 100.0 * expm1(G->lratio_sum / G->dppl_n));
        else fprintf(f, "- | - | ");
        fprintf(f, "%.2f | %.2f | %.1f | %.1f |\n", G->kv_sum / G->runs / 1048576.0, G->peak_sum / G->runs / 1048576.0,
                G->dec_s > 0 ? G->tok / G->dec_s : 0.0, G->sec / G->runs);
    }
    /* retrieval over every question task, per length: policy x budget */
    int64_t ctxs[32];
    int nc = 0;
    const char *buds[32];
    int nb = 0;
    for (size_t i = 0; i < rs->n; i++) {
        const eval_rec *r = &rs->v[i];
        int seen = 0;
        for (int c = 0; c < nc; c++) seen |= ctxs[c] == r->ctx;
        if (!seen && nc < 32) ctxs[nc++] = r->ctx;
        if (strcmp(r->policy, "nodoc")) rank_of(buds, &nb, 32, r->budget);
    }
    for (int a = 1; a < nc; a++)
        for (int b = a; b > 0 && ctxs[b] < ctxs[b - 1]; b--) {
            int64_t t = ctxs[b];
            ctxs[b] = ctxs[b - 1];
            ctxs[b - 1] = t;
        }
    for (int a = 1; a < nb; a++)   /* "-" first, then by value */
        for (int b = a; b > 0; b--) {
            double x = evalres_budget_value(buds[b]), y = evalres_budget_value(buds[b - 1]);
            if (!(isnan(x) && !isnan(y)) && !(!isnan(x) && !isnan(y) && x < y)) break;
            const char *t = buds[b];
            buds[b] = buds[b - 1];
            buds[b - 1] = t;
        }
    task_pivots(f, rs, tasks, nt, ctxs, nc, buds, nb);
    for (int c = 0; c < nc; c++) {
        int any = 0;
        for (size_t i = 0; i < rs->n && !any; i++) any = rs->v[i].ctx == ctxs[c] && rs->v[i].correct >= 0;
        if (!any) continue;
        fprintf(f, "\nRetrieved (right with the document, wrong without it) over the question tasks that compared "
                   "policies, %lld tokens:\n\n",
                (long long)ctxs[c]);
        fprintf(f, "| policy |");
        for (int b = 0; b < nb; b++) fprintf(f, " %s |", strcmp(buds[b], "-") ? buds[b] : "no budget");
        fprintf(f, "\n| --- |");
        for (int b = 0; b < nb; b++) fprintf(f, " ---: |");
        fputc('\n', f);
        for (int p = 0; p < np; p++) {
            fprintf(f, "| %s |", pols[p]);
            for (int b = 0; b < nb; b++) {
                int n = 0, ok = 0;
                for (size_t i = 0; i < rs->n; i++) {
                    const eval_rec *r = &rs->v[i];
                    if (r->ctx != ctxs[c] || r->correct < 0 || strcmp(r->status, "ok") || strcmp(r->policy, pols[p]) ||
                        strcmp(r->budget, buds[b]) || !evalres_compared(rs, r->task, r->ctx))
                        continue;
                    n++;
                    ok += is_retrieved(r);
                }
                if (n) fprintf(f, " %d/%d (%.0f%%) |", ok, n, 100.0 * ok / n);
                else fprintf(f, " |");
            }
            fputc('\n', f);
        }
    }
    free(g);
}
