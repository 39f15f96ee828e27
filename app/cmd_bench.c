/* cmd_bench.c - `kvchat bench`: prefill speed at several prompt lengths and decode speed at those
 * depths, printed as a table and appended to a CSV with the commit, machine and thread count.
 * A benchmark, not a test: it asserts nothing. Token ids are a fixed pseudo-random sequence, since
 * speed does not depend on what the tokens say. With --out DIR the per-policy figures also go to
 * DIR/bench.csv and DIR/bench.png (prefill and decode speed, time to first token and peak KV memory
 * against context length, a line per policy), the form `kvchat eval --out` uses. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "app/cli.h"
#include "common/files.h"
#include "app/eval/evalplot.h"
#include "app/eval/evalres.h"
#include "engine/snapshot.h"
#include "store/store.h"
#include "app/commands.h"
#include "engine/tokenizer.h"

/* The commit the figures belong to (cli_figures_commit), at most 63 characters. */
static void bench_commit(char *commit, size_t cap)
{
    snprintf(commit, cap, "%.63s", cli_figures_commit());
}

/* Open csv for appending, writing header first when the file is new or empty (an interrupted run);
 * never through a link, never a FIFO or device (common/files.h). NULL after a message: the caller
 * measures nothing (a benchmark whose rows cannot be kept is not run). */
/* The CSV to append rows to (header "": only checked): its header written when it is new, and
 * refused when it has another one (rows of other columns would be misread under it). */
static FILE *open_csv(const char *csv, const char *header)
{
    char err[1200];
    int fresh;
    FILE *out = files_append(csv, &fresh, err, sizeof err);
    if (!out) {
        cli_err("bench: %s (--no-csv measures without it)", err);
        return NULL;
    }
    if (fresh) {
        fputs(header, out);
        return out;
    }
    if (!header[0]) return out;
    char first[1024] = "";
    FILE *in = files_open_read(csv, UINT64_MAX, "bench CSV", err, sizeof err);
    if (!in) {
        cli_err("bench: %s", err);
        fclose(out);
        return NULL;
    }
    if (!fgets(first, sizeof first, in) || strcmp(first, header) != 0) {
        cli_err("bench: %s has other columns than this version writes (its first line is not \"%.*s\"); move it "
                "aside or name another with --csv",
                csv, (int)strcspn(header, "\n"), header);
        fclose(in);
        fclose(out);
        return NULL;
    }
    fclose(in);
    return out;
}

/* Close the CSV, seeing a write error (a full disk): rc, or 1 after a message. */
static int close_csv(FILE *out, const char *csv, int rc)
{
    char err[1200];
    if (!out || files_close(out, csv, err, sizeof err) == 0) return rc;
    cli_err("bench: %s", err);
    return 1;
}

/* Greedy decode steps from the logits there are: n of them, every one through the attached policies
 * (Ctrl-C stops the benchmark after them, not half way). */
static int decode_greedy(run *r, int64_t n, char *err, size_t errlen)
{
    int32_t nv = run_model(r)->hp.n_vocab;
    int rc = 0;
    run_set_abort(r, NULL);
    int32_t next = samp_argmax(run_logits(r), nv);
    for (int64_t g = 0; g < n && !rc; g++) rc = run_decode_greedy(r, next, &next, err, errlen);
    run_set_abort(r, &cli_interrupted);
    return rc ? -1 : 0;
}

/* The listed policies parsed into ps, --budget applied to those that take one (full does not);
 * *any_prefill: one of them acts at prefill. 0, or 1 after a message. */
static int parse_specs(const char *budget, char specs[][256], int n_spec, pol_spec *ps, int *any_prefill)
{
    char err[512];
    *any_prefill = 0;
    for (int i = 0; i < n_spec; i++) {
        if (pol_parse(&ps[i], specs[i], NULL, err, sizeof err)) {
            cli_err("bench: %s", err);
            return 1;
        }
        int takes_budget = 0;
        for (int k = 0; k < ps[i].n; k++) takes_budget |= pol_spec_value(&ps[i], k, "budget", -1) != -1;
        if (takes_budget && budget && pol_parse(&ps[i], specs[i], budget, err, sizeof err)) {
            cli_err("bench: %s", err);
            return 1;
        }
        for (int k = 0; k < ps[i].n; k++) *any_prefill |= ps[i].ops[k]->stage == POL_STAGE_PREFILL;
    }
    return 0;
}

static int bench_policies(run *r, const char *budget, char specs[][256], int n_spec, const int64_t *depths, int nd,
                          int64_t n_gen, const int32_t *toks, const char *csv, const char *date, const char *commit,
                          const char *machine, const char *base)
{
    pol_spec ps[16];
    char err[512];
    int any_prefill;
    if (parse_specs(budget, specs, n_spec, ps, &any_prefill)) return 1;
    int32_t nv = run_model(r)->hp.n_vocab;
    float *after_prefill = malloc(sizeof(float) * (size_t)nv);
    if (!after_prefill) {
        cli_err("bench: out of memory");
        return 1;
    }
    FILE *out = csv ? open_csv(csv, "date,commit,machine,threads,model,ctx,policy,prefill_tok_s,decode_tok_s,"
                                    "attn_ms_per_step,select_ms_per_step,pages_per_step,pages_total,"
                                    "kv_read_mib_per_step,n_gen,ttft_s,kv_peak_prefill_mib,kv_after_prefill_mib,"
                                    "decode_rest_tok_s,select_first_ms,select_rest_ms\n")
                    : NULL;
    if (csv && !out) {
        free(after_prefill);
        return 1;
    }
    printf("%8s %-36s %9s %9s %9s %9s %12s %9s %9s %10s %10s %10s %10s %11s\n", "ctx", "policy", "prefill/s",
           "decode/s", "attn ms", "select ms", "pages/step", "KV MiB rd", "TTFT s", "KV pk MiB", "KV aft MiB", "dec rest/s",
           "sel 1st ms", "sel rest ms");
    int rc = 0;
    double mib = 1024.0 * 1024.0;
    for (int di = 0; di < nd && !cli_interrupted && rc == 0; di++) {
        int64_t d = depths[di];
        run_figures pre = { 0 };
        for (int pi = 0; pi < n_spec && !cli_interrupted; pi++) {
            if (run_check_policy(r, &ps[pi], d, err, sizeof err)) {
                cli_err("bench: %s", err);
                rc = 1;
                break;
            }
            /* decode-only policies share one prefill per length: rewind to its end and swap policy */
            if (pi == 0 || any_prefill) {
                if (run_set_policy(r, &ps[pi], err, sizeof err) || run_rewind(r, 0, 0, err, sizeof err)) {
                    cli_err("bench: %s", err);
                    rc = 1;
                    break;
                }
                run_set_floor(r, d);
                run_reset_peak(r);
                if (run_feed(r, toks, d, NULL, NULL, err, sizeof err)) {
                    cli_err("bench: %s", err);
                    rc = 1;
                    break;
                }
                /* the first token's logits are ready when the prefill ends */
                run_get_figures(r, &pre);
                memcpy(after_prefill, run_logits(r), sizeof(float) * (size_t)nv);
            } else if (run_rewind(r, d, d, err, sizeof err) || run_set_policy(r, &ps[pi], err, sizeof err)) {
                cli_err("bench: %s", err);
                rc = 1;
                break;
            }
            run_set_logits(r, after_prefill);
            if (decode_greedy(r, n_gen, err, sizeof err)) {
                cli_err("bench: %s", err);
                rc = 1;
                break;
            }
            run_figures fg;
            run_get_figures(r, &fg);
            double ttft = pre.prefill_s, kv_peak = (double)pre.kv_peak / mib, kv_after = (double)pre.kv_held / mib;
            double rd = fg.kv_read_per_step / mib;
            printf("%8lld %-36s %9.1f %9.1f %9.3f %9.3f %7.1f/%-4.0f %9.2f %9.2f %10.2f %10.2f %10.1f %10.3f %11.4f\n",
                   (long long)d, ps[pi].text, pre.prefill_tok_s, fg.decode_tok_s, fg.attn_ms_per_step,
                   fg.select_ms_per_step, fg.pages_per_step, fg.pages_avail_per_step, rd, ttft, kv_peak, kv_after,
                   fg.decode_rest_tok_s, fg.select_ms_first, fg.select_ms_rest);
            fflush(stdout);
            if (out)
                fprintf(out,
                        "%s,%s,\"%s\",%d,%s,%lld,\"%s\",%.2f,%.2f,%.4f,%.4f,%.2f,%.1f,%.3f,%lld,%.3f,%.2f,%.2f,%.2f,%.4f,"
                        "%.5f\n",
                        date, commit, machine, run_threads(r), base, (long long)d, ps[pi].text, pre.prefill_tok_s,
                        fg.decode_tok_s, fg.attn_ms_per_step, fg.select_ms_per_step, fg.pages_per_step,
                        fg.pages_avail_per_step, rd, (long long)n_gen, ttft, kv_peak, kv_after, fg.decode_rest_tok_s,
                        fg.select_ms_first, fg.select_ms_rest);
            if (out) fflush(out);
        }
    }
    rc = close_csv(out, csv, rc);
    free(after_prefill);
    return rc;
}

/* The ids of the n largest of the nv logits, largest first (n at most FWD_BATCH_MAX). */
static void best_tokens(const float *logits, int32_t nv, int n, int32_t *ids)
{
    int k = 0;
    for (int32_t v = 0; v < nv; v++) {
        int at = k < n ? k++ : n;
        while (at > 0 && logits[v] > logits[ids[at - 1]]) {
            if (at < n) ids[at] = ids[at - 1];
            at--;
        }
        if (at < n) ids[at] = v;
    }
}

/* What the first steps of a set of forks asked of the device (run_figures' counters). */
typedef struct first_traffic {
    int has;
    uint64_t waits, up;
} first_traffic;

/* n_gen greedy steps of each fork from its first token first[s], its tokens into ids[s][...]:
 * alone (one fork after another, as a comparison ran before its steps were batched) or as one
 * batch. The seconds, or -1 after a message; *first_s (NULL: not wanted) the seconds of the first
 * steps among them (each fork's alone, the batch's first): what a fork costs once (its lists of
 * every page, its shared last pages copied), apart from the steps that follow; *ft (NULL: not
 * wanted) what those steps asked of the device. */
static double compare_steps(run *r, run *const *fk, int n, int batch, const int32_t *first, int64_t n_gen,
                            int32_t *ids, double *first_s, first_traffic *ft, char *err, size_t errlen)
{
    int32_t cur[FWD_BATCH_MAX];
    for (int s = 0; s < n; s++) cur[s] = first[s];
    double t0 = run_clock_s(), firsts = 0;
    if (ft) memset(ft, 0, sizeof *ft);
    for (int s = 0; s < (batch ? 1 : n); s++)
        for (int64_t g = 0; g < n_gen; g++) {
            if (cli_interrupted) {
                snprintf(err, errlen, "interrupted");
                return -1;
            }
            double ts = g == 0 ? run_clock_s() : 0;
            run_figures f0, f1;
            if (ft && g == 0) run_get_figures(r, &f0);
            int rc = batch ? run_decode_greedy_batch(r, fk, n, cur, err, errlen)
                           : run_decode_greedy(fk[s], cur[s], &cur[s], err, errlen);
            if (rc) return -1;
            if (g == 0) firsts += run_clock_s() - ts;
            if (ft && g == 0) {   /* the forks share r's backend: its counters are theirs */
                run_get_figures(r, &f1);
                ft->has = f1.has_counters;
                ft->waits += f1.dev_waits - f0.dev_waits;
                ft->up += f1.dev_bytes_up - f0.dev_bytes_up;
            }
            for (int j = 0; j < n; j++)
                if (batch || j == s) ids[j * n_gen + g] = cur[j];
        }
    if (first_s) *first_s = firsts;
    return run_clock_s() - t0;
}

/* n forks of r, fork s under specs[s] from first[s], each taking n_gen greedy steps alone or in one
 * batch (compare_steps), then freed. The seconds, or -1 with err. */
static double forked_steps(run *r, const pol_spec *const *specs, int n, int batch, const int32_t *first,
                           int64_t n_gen, int32_t *ids, double *first_s, first_traffic *ft, char *err, size_t errlen)
{
    run *fk[FWD_BATCH_MAX] = { 0 };
    double t = -1;
    int s = 0;
    while (s < n && (fk[s] = run_fork(r, specs[s], err, errlen))) s++;
    if (s == n) t = compare_steps(r, fk, n, batch, first, n_gen, ids, first_s, ft, err, errlen);
    for (s = 0; s < n; s++) run_free(fk[s]);
    return t;
}

/* The forks' steps alone, then as one batch (forked_steps twice, tokens into alone and both): the
 * seconds of each in t, of their first steps in t1 (NULL: not wanted), and whether every fork
 * chose the same tokens both ways in *same. 0, or 1 after a message. */
static int alone_then_batch(run *r, const pol_spec *const *each, int n, const int32_t *first, int64_t n_gen,
                            int32_t *alone, int32_t *both, double t[2], double *t1, first_traffic *ft, int *same)
{
    char err[512];
    for (int batch = 0; batch < 2; batch++)
        if ((t[batch] = forked_steps(r, each, n, batch, first, n_gen, batch ? both : alone, t1 ? &t1[batch] : NULL,
                                     batch ? ft : NULL, err, sizeof err)) < 0) {
            cli_err("bench: %s", err);
            return 1;
        }
    *same = !memcmp(alone, both, sizeof(int32_t) * (size_t)(n * n_gen));
    return 0;
}

/* r prefilled with the first d tokens of toks, from an empty cache: 0, or 1 after a message. */
static int prefill_to(run *r, const int32_t *toks, int64_t d)
{
    char err[512];
    if (run_rewind(r, 0, 0, err, sizeof err) == 0 && run_feed(r, toks, d, NULL, NULL, err, sizeof err) == 0) return 0;
    cli_err("bench: %s", err);
    return 1;
}

/* --compare: the listed decode-time policies answered from one prefill per length, as /compare
 * does: each fork's steps alone one after another, then all of them as one batch (fwd_decode_batch);
 * the batch's time against one answer's, and whether every fork chose the same tokens both ways. */
static int bench_compare(run *r, const char *budget, char specs[][256], int n_spec, const int64_t *depths, int nd,
                         int64_t n_gen, const int32_t *toks, const char *csv, const char *date, const char *commit,
                         const char *machine, const char *base)
{
    pol_spec ps[16];
    char names[1024] = "";
    int any_prefill;
    if (parse_specs(budget, specs, n_spec, ps, &any_prefill)) return 1;
    if (any_prefill || n_spec < 2 || n_spec > FWD_BATCH_MAX) {
        cli_err("bench: --compare decodes 2 to %d decode-time policies from one prefill", FWD_BATCH_MAX);
        return 1;
    }
    for (int i = 0; i < n_spec; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? " " : "", ps[i].text);
    int32_t *alone = malloc(sizeof(int32_t) * (size_t)(n_spec * n_gen)),
            *both = malloc(sizeof(int32_t) * (size_t)(n_spec * n_gen));
    FILE *out = alone && both && csv ? open_csv(csv, "date,commit,machine,threads,model,ctx,policies,n,n_gen,"
                                                      "one_answer_s,one_after_another_s,batch_s,batch_over_one,"
                                                      "same_tokens\n")
                                     : NULL;
    int rc = !alone || !both ? (cli_err("bench: out of memory"), 1) : csv && !out ? 1 : 0;
    if (!rc)
        printf("%8s %3s %12s %12s %12s %14s %6s   %s\n", "ctx", "n", "one answer s", "in turn s", "batch s",
               "batch / one", "same", "policies");
    const pol_spec *each[FWD_BATCH_MAX];
    for (int s = 0; s < n_spec; s++) each[s] = &ps[s];
    for (int di = 0; di < nd && !cli_interrupted && !rc; di++) {
        int64_t d = depths[di];
        if ((rc = prefill_to(r, toks, d))) break;
        int32_t first[FWD_BATCH_MAX], top = samp_argmax(run_logits(r), run_model(r)->hp.n_vocab);
        for (int s = 0; s < n_spec; s++) first[s] = top;   /* every policy answers the same question */
        double t[2];
        int same;
        if ((rc = alone_then_batch(r, each, n_spec, first, n_gen, alone, both, t, NULL, NULL, &same))) break;
        double one = t[0] / n_spec;
        printf("%8lld %3d %12.3f %12.3f %12.3f %14.2f %6s   %s\n", (long long)d, n_spec, one, t[0], t[1], t[1] / one,
               same ? "yes" : "NO", names);
        fflush(stdout);
        if (out) {
            fprintf(out, "%s,%s,\"%s\",%d,%s,%lld,\"%s\",%d,%lld,%.4f,%.4f,%.4f,%.3f,%d\n", date, commit, machine,
                    run_threads(r), base, (long long)d, names, n_spec, (long long)n_gen, one, t[0], t[1], t[1] / one,
                    same);
            fflush(out);
        }
    }
    free(alone);
    free(both);
    return out ? close_csv(out, csv, rc) : rc;
}

/* --seqs N: per length and listed decode-time policy, N sequences decoding together from one
 * prefill (forks of it, fwd_decode_batch) against each alone, one after another: the batch's tokens
 * a second over one sequence's, and whether every sequence chose the tokens it chose alone. Fork s
 * starts from the prefill's s-th likeliest token, so the sequences differ from their first step
 * and a batch that mixed up their rows would not give each its own answer. The forks share the
 * prefix's pages, so N sequences hold one copy of the context, but each attends its own page list:
 * a step reads the context's K/V once per sequence, as N separate conversations' would. */
static int bench_seqs(run *r, const char *budget, char specs[][256], int n_spec, int n_seq, const int64_t *depths,
                      int nd, int64_t n_gen, const int32_t *toks, const char *csv, const char *date, const char *commit,
                      const char *machine, const char *base)
{
    pol_spec ps[16];
    int any_prefill;
    if (parse_specs(budget, specs, n_spec, ps, &any_prefill)) return 1;
    if (any_prefill) {
        cli_err("bench: --seqs decodes forks of one prefill: give decode-time policies only");
        return 1;
    }
    int32_t *alone = malloc(sizeof(int32_t) * (size_t)(n_seq * n_gen)),
            *both = malloc(sizeof(int32_t) * (size_t)(n_seq * n_gen));
    FILE *out = alone && both && csv ? open_csv(csv, "date,commit,machine,threads,model,ctx,policy,seqs,n_gen,"
                                                      "alone_tok_s,batch_tok_s,batch_step_ms,batch_over_alone,"
                                                      "alone_rest_tok_s,batch_rest_tok_s,batch_first_ms,same_tokens\n")
                                     : NULL;
    int rc = !alone || !both ? (cli_err("bench: out of memory"), 1) : csv && !out ? 1 : 0;
    if (!rc)
        printf("%8s %4s %14s %14s %14s %12s %14s %14s %14s %6s   %s\n", "ctx", "seqs", "alone tok/s", "batch tok/s",
               "batch step ms", "batch/alone", "alone rest/s", "batch rest/s", "batch 1st ms", "same", "policy");
    for (int di = 0; di < nd && !cli_interrupted && !rc; di++) {
        int64_t d = depths[di];
        if ((rc = prefill_to(r, toks, d))) break;
        int32_t first[FWD_BATCH_MAX];
        best_tokens(run_logits(r), run_model(r)->hp.n_vocab, n_seq, first);
        for (int i = 0; i < n_spec && !cli_interrupted && !rc; i++) {
            const pol_spec *each[FWD_BATCH_MAX];
            for (int s = 0; s < n_seq; s++) each[s] = &ps[i];
            double t[2], t1[2];
            first_traffic ft;
            int same;
            if ((rc = alone_then_batch(r, each, n_seq, first, n_gen, alone, both, t, t1, &ft, &same))) break;
            double one = (double)(n_seq * n_gen) / t[0], all = (double)(n_seq * n_gen) / t[1];
            /* the steps after each fork's first: a batch's decode rate, without what a fork costs once */
            double rest = (double)(n_seq * (n_gen - 1)), one_r = n_gen > 1 ? rest / (t[0] - t1[0]) : one,
                   all_r = n_gen > 1 ? rest / (t[1] - t1[1]) : all;
            printf("%8lld %4d %14.1f %14.1f %14.3f %12.2f %14.1f %14.1f %14.3f %6s   %s\n", (long long)d, n_seq, one, all,
                   1e3 * t[1] / (double)n_gen, all / one, one_r, all_r, 1e3 * t1[1], same ? "yes" : "NO", ps[i].text);
            if (ft.has)   /* what the forks' first step asked of the device (their lists, their first pages) */
                printf("%8s batch's first step: %llu waits, %.1f MiB up\n", "", (unsigned long long)ft.waits,
                       (double)ft.up / 1048576.0);
            fflush(stdout);
            if (out) {
                fprintf(out, "%s,%s,\"%s\",%d,%s,%lld,\"%s\",%d,%lld,%.2f,%.2f,%.4f,%.3f,%.2f,%.2f,%.3f,%d\n", date, commit,
                        machine, run_threads(r), base, (long long)d, ps[i].text, n_seq, (long long)n_gen, one, all,
                        1e3 * t[1] / (double)n_gen, all / one, one_r, all_r, 1e3 * t1[1], same);
                fflush(out);
            }
        }
    }
    free(alone);
    free(both);
    return out ? close_csv(out, csv, rc) : rc;
}

/* Snapshot size and speed against prefill: per length and policy, prefill (timed), serialize,
 * write to a scratch database, read back and restore into a fresh sequence (each timed), and check
 * that the restored sequence's next logits equal the original's. */
static int bench_snapshots(run *r, const char *budget, char specs[][256], int n_spec, const int64_t *depths, int nd,
                           const int32_t *toks, const char *csv, const char *date, const char *commit,
                           const char *machine, const char *base)
{
    static const char sha[] = "0000000000000000000000000000000000000000000000000000000000000000";
    char err[1024], dbpath[] = "/tmp/kvchat-bench-snap-XXXXXX";
    int fd = mkstemp(dbpath);
    if (fd < 0) {
        cli_err("bench: cannot create a scratch database");
        return 1;
    }
    close(fd);
    const model *m = run_model(r);
    store *db = store_open(dbpath, err, sizeof err);
    int64_t mid, did, sid, msg;
    if (!db || store_model_put(db, m->path, 0, 0, "bench", m->arch_name, "bench", NULL, &mid) ||
        store_document_put(db, mid, "bench", "bench", "bench", 0, &did) ||
        store_session_create(db, NULL, "bench", mid, did, "full", NULL, "plain", &sid) ||
        store_message_add(db, sid, 0, "user", "bench", NULL, NULL, &msg)) {
        cli_err("bench: %s", db ? store_error(db) : err);
        store_close(db);
        unlink(dbpath);
        return 1;
    }
    int32_t nv = m->hp.n_vocab;
    FILE *out = csv ? open_csv(csv, "date,commit,machine,threads,model,ctx,policy,prefill_s,snapshot_bytes,kv_bytes,"
                                    "serialize_ms,write_ms,read_ms,restore_ms,prefill_over_resume,identical\n")
                    : NULL;
    printf("%7s %-22s %10s %12s %10s %10s %9s %9s %11s %16s %9s\n", "ctx", "policy", "prefill s", "snapshot MiB",
           "KV MiB", "save ms", "write ms", "read ms", "restore ms", "prefill/resume", "same");
    int rc = 0;
    for (int di = 0; di < nd && !rc && !cli_interrupted; di++) {
        for (int pi = 0; pi < n_spec && !rc && !cli_interrupted; pi++) {
            int64_t d = depths[di];
            pol_spec spec;
            /* the snapshot is restored into a second sequence over the same model and backend */
            run *r2 = NULL;
            if (pol_parse(&spec, specs[pi], budget, err, sizeof err) || run_set_policy(r, &spec, err, sizeof err) ||
                !(r2 = run_sibling(r, err, sizeof err)) || run_set_policy(r2, &spec, err, sizeof err) ||
                run_rewind(r, 0, 0, err, sizeof err)) {
                cli_err("bench: %s", err);
                run_free(r2);
                rc = 1;
                break;
            }
            double t0 = cli_now();
            int bad = run_feed(r, toks, d, NULL, NULL, err, sizeof err);
            double t1 = cli_now();
            void *data = NULL, *back = NULL;
            size_t len = 0, blen = 0;
            double t2 = 0, t3 = 0, t4 = 0, t5 = 0;
            int64_t snap_id, n2 = 0;
            if (!bad) {
                /* the next token, sampled and not evaluated, is in the snapshot as after an answer */
                int32_t next = samp_argmax(run_logits(r), nv);
                bad = run_append(r, &next, 1, err, sizeof err) || run_snapshot(r, sha, &data, &len, err, sizeof err);
                t2 = cli_now();
                if (!bad && store_snapshot_put(db, sid, msg, specs[pi], d + 1, data, len, &snap_id)) {
                    snprintf(err, sizeof err, "%s", store_error(db));
                    bad = 1;
                }
                t3 = cli_now();
                if (!bad && store_snapshot_get(db, msg, specs[pi], &back, &blen) != 0) {
                    snprintf(err, sizeof err, "%s", store_error(db));
                    bad = 1;
                }
                t4 = cli_now();
                if (!bad) bad = run_restore(r2, back, blen, sha, err, sizeof err);
                if (!bad) run_place(r2);   /* a resume's cost on a GPU: the cache placed there */
                t5 = cli_now();
                /* the next step from both sequences must agree exactly: the waiting token evaluated */
                if (!bad) {
                    const int32_t *ids2 = run_tokens(r2, &n2);
                    bad = run_rewind(r, d, d, err, sizeof err) || run_decode(r, next, err, sizeof err) ||
                          run_rewind(r2, d, d, err, sizeof err) || run_decode(r2, ids2[n2 - 1], err, sizeof err);
                }
            }
            if (bad) {
                cli_err("bench: %s", err);
                rc = 1;
            } else {
                run_figures fg;
                run_get_figures(r2, &fg);
                int same = !memcmp(run_logits(r), run_logits(r2), sizeof(float) * (size_t)nv);
                double resume = (t4 - t3) + (t5 - t4);
                printf("%7lld %-22.22s %10.2f %12.2f %10.2f %10.1f %9.1f %9.1f %11.1f %15.0fx %9s\n", (long long)d,
                       specs[pi], t1 - t0, (double)len / (1 << 20), (double)fg.kv_held / (1 << 20), (t2 - t1) * 1e3,
                       (t3 - t2) * 1e3, (t4 - t3) * 1e3, (t5 - t4) * 1e3, (t1 - t0) / resume, same ? "yes" : "NO");
                fflush(stdout);
                if (out)
                    fprintf(out, "%s,%s,\"%s\",%d,%s,%lld,%s,%.3f,%zu,%llu,%.1f,%.1f,%.1f,%.1f,%.1f,%d\n", date, commit,
                            machine, run_threads(r), base, (long long)d, specs[pi], t1 - t0, len,
                            (unsigned long long)fg.kv_held, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3,
                            (t5 - t4) * 1e3, (t1 - t0) / resume, same);
                if (!same) rc = 1;
            }
            free(data);
            free(back);
            run_free(r2);
        }
    }
    rc = close_csv(out, csv, rc);
    store_close(db);
    unlink(dbpath);
    char side[600];
    snprintf(side, sizeof side, "%s-wal", dbpath);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", dbpath);
    unlink(side);
    return rc;
}

/* DIR/bench.png from the rows of this run (its date) in DIR/bench.csv. */
static int bench_plot(const char *csv, const char *date, const char *png)
{
    char e[1200];
    FILE *f = files_open_read(csv, (uint64_t)1 << 30, "a bench CSV", e, sizeof e);
    if (!f) {
        cli_err("bench: %s", e);
        return 1;
    }
    enum { DATE, CTX, POLICY, PREFILL, DECODE, TTFT, PEAK, NCOL };
    static const char *const want[NCOL] = { "date", "ctx", "policy", "prefill_tok_s", "decode_tok_s", "ttft_s",
                                            "kv_peak_prefill_mib" };
    int col[NCOL];
    char line[4096], *fld[64];
    int n = fgets(line, sizeof line, f) ? evalres_split_csv(line, fld, 64) : 0;
    for (int c = 0; c < NCOL; c++) {
        col[c] = -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(fld[i], want[c])) col[c] = i;
    }
    enum { MAXS = 16 };
    plot_series *s = calloc(4 * MAXS, sizeof *s);
    int ns[4] = { 0 };
    while (s && col[POLICY] >= 0 && col[PEAK] >= 0 && fgets(line, sizeof line, f)) {
        n = evalres_split_csv(line, fld, 64);
        if (n <= col[PEAK] || n <= col[POLICY] || strcmp(fld[col[DATE]], date)) continue;
        double x = atof(fld[col[CTX]]);
        const int metric[4] = { PREFILL, DECODE, TTFT, PEAK };
        for (int m = 0; m < 4; m++)
            evalplot_add(s + m * MAXS, &ns[m], MAXS, fld[col[POLICY]], x, atof(fld[col[metric[m]]]));
    }
    fclose(f);
    if (!s) {
        cli_err("bench: out of memory");
        return 1;
    }
    plot_panel p[4];
    const char *titles[4] = { "prefill speed", "decode speed", "time to first token", "peak KV memory (prefill)" };
    const char *ylab[4] = { "tokens/s", "tokens/s", "s", "MiB" };
    for (int m = 0; m < 4; m++) {
        memset(&p[m], 0, sizeof p[m]);
        snprintf(p[m].title, sizeof p[m].title, "%s", titles[m]);
        snprintf(p[m].xlabel, sizeof p[m].xlabel, "context tokens");
        snprintf(p[m].ylabel, sizeof p[m].ylabel, "%s", ylab[m]);
        p[m].logx = 1;
        p[m].tics_at_points = 1;   /* the lengths measured, not only the powers of ten */
        p[m].s = s + m * MAXS;
        p[m].ns = ns[m];
    }
    char err[600];
    int rc = evalplot_lines(png, p, 4, 2, err, sizeof err);
    free(s);
    if (rc) {
        cli_err("bench: %s", err);
        return 1;
    }
    fprintf(stderr, "bench: wrote %s\n", png);
    return 0;
}

/* parses "A,B,C" of positive ints into v (at most cap); the count, or -1 after a message */
static int parse_int_list(const char *opt, const char *arg, int *v, int cap, int lo, int hi)
{
    int n = 0;
    for (const char *p = arg; *p;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < lo || x > hi || (*end && *end != ',') || n == cap) {
            cli_err("bench: %s: bad list '%s' (up to %d numbers in %d..%d, comma-separated)", opt, arg, cap, lo, hi);
            return -1;
        }
        v[n++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (n == 0) cli_err("bench: %s: empty list", opt);
    return n ? n : -1;
}

/* Prefill speed at each depth, then decode speed there (greedy steps through the full cache). */
static int bench_speed(run *r, const int64_t *depths, int nd, int64_t n_gen, const int32_t *toks, const char *csv,
                       const char *date, const char *commit, const char *machine, const char *base)
{
    printf("%8s %14s %14s\n", "depth", "prefill tok/s", "decode tok/s");
    FILE *out = csv ? open_csv(csv, "date,commit,machine,threads,model,depth,prefill_tok_s,decode_tok_s,n_gen\n") : NULL;
    if (csv && !out) return 1;
    int rc = 0;
    char err[512];
    for (int di = 0; di < nd && !cli_interrupted; di++) {
        int64_t d = depths[di];
        run_figures start, before, fg;
        run_get_figures(r, &start);
        if ((rc = prefill_to(r, toks, d))) break;
        run_get_figures(r, &before);
        if (decode_greedy(r, n_gen, err, sizeof err)) {
            cli_err("bench: %s", err);
            rc = 1;
            break;
        }
        run_get_figures(r, &fg);
        printf("%8lld %14.1f %14.1f", (long long)d, fg.prefill_tok_s, fg.decode_tok_s);
        if (fg.has_counters)   /* what the prompt asked of the device (the first prompt's one-off costs show) */
            printf("   prefill: %llu waits, %.1f MiB up, %.1f MiB down",
                   (unsigned long long)(before.dev_waits - start.dev_waits),
                   (double)(before.dev_bytes_up - start.dev_bytes_up) / 1048576.0,
                   (double)(before.dev_bytes_down - start.dev_bytes_down) / 1048576.0);
        if (fg.has_counters && n_gen > 0)   /* what each decode step asked of the device: waits and copies */
            printf("   per step: %.1f waits, %.1f KiB up, %.1f KiB down",
                   (double)(fg.dev_waits - before.dev_waits) / (double)n_gen,
                   (double)(fg.dev_bytes_up - before.dev_bytes_up) / 1024.0 / (double)n_gen,
                   (double)(fg.dev_bytes_down - before.dev_bytes_down) / 1024.0 / (double)n_gen);
        printf("\n");
        fflush(stdout);
        if (out)
            fprintf(out, "%s,%s,\"%s\",%d,%s,%lld,%.2f,%.2f,%lld\n", date, commit, machine, run_threads(r), base,
                    (long long)d, fg.prefill_tok_s, fg.decode_tok_s, (long long)n_gen);
    }
    return close_csv(out, csv, rc);
}

typedef struct bench_opts {
    const char *depths, *csv, *policy, *budget, *out;
    int64_t n_gen;
    int snapshot, no_csv, page_size, compare, seqs;
} bench_opts;

#define B(field) offsetof(bench_opts, field)
static const opt_def bench_defs[] = {
    { "--ctx", "--depths", OPT_STR, B(depths), 0, 0, NULL, 0, "LIST", "prompt lengths (default 512,2048,8192)", NULL },
    { "--gen", NULL, OPT_I64, B(n_gen), 1, 4096, NULL, 0, "N", "decoded tokens at each depth (default 32)", NULL },
    { "--policy", NULL, OPT_STR, B(policy), 0, 0, NULL, 0, "LIST",
      "per policy: decode speed, attention and selection time, pages and KV read per step (all: every policy)", NULL },
    { "--budget", NULL, OPT_STR, B(budget), 0, 0, NULL, 0, "B", "the budget of the listed policies that take one", NULL },
    { "--page-size", NULL, OPT_INT, B(page_size), 1, 4096, NULL, 0, "P", "KV cache page size (default 32)", NULL },
    { "--snapshot", NULL, OPT_FLAG, B(snapshot), 0, 0, NULL, 0, NULL,
      "snapshot bytes and save / write / read / restore times against the prefill time", NULL },
    { "--compare", NULL, OPT_FLAG, B(compare), 0, 0, NULL, 0, NULL,
      "the --policy list (2 to 8 decode-time policies) decoded from one prefill as /compare does: one after "
      "another, then in one batch (bench/compare_results.csv)", NULL },
    { "--seqs", NULL, OPT_INT, B(seqs), 2, FWD_BATCH_MAX, NULL, 0, "N",
      "per --policy: N sequences decoded together from one prefill against each alone (bench/batch_results.csv)",
      NULL },
    { "--csv", NULL, OPT_STR, B(csv), 0, 0, NULL, 0, "FILE", "rows appended here (default bench/results.csv, "
      "bench/policy_results.csv, bench/snapshot_results.csv, bench/compare_results.csv or "
      "bench/batch_results.csv)", NULL },
    { "--no-csv", NULL, OPT_FLAG, B(no_csv), 0, 0, NULL, 0, NULL, "no CSV", NULL },
    { "--out", NULL, OPT_STR, B(out), 0, 0, NULL, 0, "DIR", "the per-policy figures in DIR/bench.csv and DIR/bench.png",
      NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef B

int cmd_bench(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    bench_opts bo = { "512,2048,8192", "bench/results.csv", NULL, NULL, NULL, 32, 0, 0, 0, 0, 0 };
    opt_group grp[] = { { bench_defs, &bo, NULL }, CLI_MODEL(&o) };
    int pr = cli_parse(argc, argv, "kvchat bench [-m MODEL] [--ctx 512,2048,8192] [--gen N] [--policy LIST [--budget B]] "
                      "[options]",
                      "Without --policy: prefill and decode speed at each length (bench/results.csv). A benchmark, not\n"
                      "a test: it asserts nothing. Model shapes without a file: kvchat gen-model.",
                      grp, 2, NULL, 0, NULL);
    if (pr) return pr > 0 ? 0 : 1;
    const char *depths_arg = bo.depths, *csv = bo.no_csv ? NULL : bo.csv, *policy_list = bo.policy, *out_dir = bo.out;
    int64_t n_gen = bo.n_gen;
    int snapshot = bo.snapshot;
    o.page_size = bo.page_size;
    char out_csv[1024], out_png[1024];
    int64_t depths[16];
    int dl[16], nd = parse_int_list("--depths", depths_arg, dl, 16, 1, 1 << 22);
    if (nd < 0) return 1;
    for (int i = 0; i < nd; i++) depths[i] = dl[i];
    int64_t maxd = 0;
    for (int i = 0; i < nd; i++)
        if (depths[i] > maxd) maxd = depths[i];
    if (o.n_ctx <= 0) o.n_ctx = maxd + n_gen;
    char specs[16][256];   /* every registered policy fits */
    int n_spec = 0;
    if (snapshot && !policy_list) policy_list = "full";
    if (bo.compare && (!policy_list || snapshot || out_dir)) {
        cli_err("bench: --compare needs --policy LIST (2 to 8 decode-time policies), without --snapshot or --out");
        return 1;
    }
    if (bo.seqs && (!policy_list || snapshot || out_dir || bo.compare)) {
        cli_err("bench: --seqs needs --policy LIST (decode-time policies), without --snapshot, --out or --compare");
        return 1;
    }
    if (out_dir) {
        if (snapshot) {
            cli_err("bench: --out draws the per-policy figures; --snapshot writes its own CSV (--csv)");
            return 1;
        }
        if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
            cli_err("bench: cannot create %s: %s", out_dir, strerror(errno));
            return 1;
        }
        snprintf(out_csv, sizeof out_csv, "%s/bench.csv", out_dir);
        snprintf(out_png, sizeof out_png, "%s/bench.png", out_dir);
        csv = out_csv;
        if (!policy_list) policy_list = "full";
    }
    if (policy_list) {
        if (!strcmp(policy_list, "all"))   /* every registered policy with its defaults */
            for (const pol_ops *const *p = pol_registry(); *p && n_spec < 16; p++)
                snprintf(specs[n_spec++], sizeof specs[0], "%s", (*p)->name);
        else n_spec = pol_split_list(policy_list, specs, 16);
        if (n_spec <= 0) {
            cli_err("bench: --policy: give 1 to 16 policies, e.g. full,chess:preset=aggressive,quest");
            return 1;
        }
        if (csv && !strcmp(csv, "bench/results.csv"))
            csv = snapshot       ? "bench/snapshot_results.csv"
                  : bo.compare ? "bench/compare_results.csv"
                  : bo.seqs    ? "bench/batch_results.csv"
                               : "bench/policy_results.csv";
    }
    /* the budget belongs to the listed policies, not to the session's own (full) one */
    const char *budget = bo.budget;
    if (cli_finish_common(&o)) return 1;
    if (csv) {   /* checked before the model loads: a benchmark whose rows cannot be kept is not run */
        struct stat st;
        int existed = lstat(csv, &st) == 0;
        FILE *probe = open_csv(csv, "");
        if (!probe) return 1;
        fclose(probe);
        if (!existed) unlink(csv);   /* made again with its header when the first row is there */
    }
    run *r = cli_run(&o);
    if (!r) return 1;
    if (maxd + n_gen > run_n_ctx(r)) {
        cli_err("bench: depth %lld + %lld generated tokens exceed the context %lld", (long long)maxd, (long long)n_gen,
                (long long)run_n_ctx(r));
        run_free(r);
        return 1;
    }
    const model *m = run_model(r);
    int32_t nv = m->hp.n_vocab;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)maxd);
    if (!toks) {
        cli_err("bench: out of memory");
        run_free(r);
        return 1;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    toks[0] = tok_bos(m->vocab) >= 0 ? tok_bos(m->vocab) : 1;
    for (int64_t i = 1; i < maxd; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(300 + (x >> 33) % (uint64_t)(nv - 600));
    }
    char commit[64], machine[640], date[32];
    bench_commit(commit, sizeof commit);
    be_cpu_model(machine, sizeof machine);
    size_t ml = strlen(machine);
    if (run_on_device(r)) {   /* the GPU that ran the model, beside the host CPU */
        char dev[384];   /* the GPU's name and the settings it runs under */
        run_device(r, dev, sizeof dev);
        snprintf(machine + ml, sizeof machine - ml, " + %s", dev);
    } else {   /* the kernels that ran on it */
        snprintf(machine + ml, sizeof machine - ml, " [%s]", be_cpu_kernels());
    }
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    const char *base = strrchr(m->path, '/') ? strrchr(m->path, '/') + 1 : m->path;
    printf("kvchat bench: %s, %d threads, %s kernels, batch %d, commit %s\n", base, run_threads(r), be_cpu_kernels(),
           o.n_batch > 0 ? o.n_batch : 512, commit);
    cli_catch_stop_signals();
    run_set_abort(r, &cli_interrupted);
    int rc;
    if (bo.seqs) {
        rc = bench_seqs(r, budget, specs, n_spec, bo.seqs, depths, nd, n_gen, toks, csv, date, commit, machine, base);
    } else if (bo.compare) {
        rc = bench_compare(r, budget, specs, n_spec, depths, nd, n_gen, toks, csv, date, commit, machine, base);
    } else if (snapshot) {
        rc = bench_snapshots(r, budget, specs, n_spec, depths, nd, toks, csv, date, commit, machine, base);
    } else if (n_spec > 0) {
        rc = bench_policies(r, budget, specs, n_spec, depths, nd, n_gen, toks, csv, date, commit, machine, base);
    } else {
        rc = bench_speed(r, depths, nd, n_gen, toks, csv, date, commit, machine, base);
    }
    run_figures fg;
    run_get_figures(r, &fg);
    if (fg.warm_up_s > 0)   /* the one-off costs a device paid at load, outside every figure above */
        printf("warm-up at load %.1f ms\n", 1e3 * fg.warm_up_s);
    printf("peak RSS %.1f MiB\n", cli_peak_rss_mib());
    if (rc == 0 && n_spec > 0 && !snapshot && out_dir && !cli_interrupted) rc = bench_plot(out_csv, date, out_png);
    if (rc == 0 && cli_interrupted) rc = cli_interrupt_status();   /* a benchmark cut short is not a success */
    free(toks);
    run_free(r);
    return rc;
}
