/* cmd_eval.c - `kvchat eval`: how often policies answer a generated retrieval question.
 *
 * Task `passkey`: a seeded filler document of about --ctx tokens with "The pass key is NNNNN." at a
 * random depth, asked "What is the pass key?"; an answer is correct when the key's digits appear in
 * it. Each sample is prefilled once with the full cache when every policy listed is a decode-time
 * selection (they all see the same cache), and each (policy, budget, backtrack) configuration then
 * answers from that prefill: the cache is rolled back to the prompt's last token, which is evaluated
 * again (so every configuration starts from the same logits), and the configuration's policies are
 * attached. Prefill policies get their own prefill per configuration. Per run: one CSV row; at the
 * end a table of accuracy and backtracking rates per configuration. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "docgen.h"

static void usage(void)
{
    printf("usage: kvchat eval --task passkey [options]\n"
           "\n"
           "  --task passkey     the generated retrieval task (see docs/calibration.md)\n"
           "  --ctx N            document length in tokens, about (default 4000)\n"
           "  --samples N        documents (default 8)\n"
           "  --seed S           seed of the documents (default 1)\n"
           "  --policy LIST      policies, e.g. chess:every=0,chess:every=6,quest (default full)\n"
           "  --budget LIST      budgets, e.g. 0.01,0.05,0.1 (each policy runs at each)\n"
           "  --backtrack LIST   regenerations per answer, e.g. 0,2 (default: the policy's default)\n"
           "  -n N               answer tokens (default 64: two generated pages)\n"
           "  --csv FILE         one row per run\n"
           "  -m MODEL  --threads N  --thresholds T  --page-size P\n");
}

typedef struct eval_row {
    char policy[256], budget[32];
    int backtrack;
    int64_t runs, correct, tokens, events, regenerated;
    double seconds;
} eval_row;

static int split_list(const char *list, char out[][32], int max)
{
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == max) return -1;
        snprintf(out[n++], 32, "%s", t);
    }
    return n;
}

typedef struct answer_buf {
    tok_stream ts;
    char text[2048];
    size_t n;
} answer_buf;

static void on_token(void *ud, int32_t id)
{
    answer_buf *a = ud;
    char piece[512];
    size_t w = tok_stream_feed(&a->ts, id, piece, sizeof piece);
    if (w > sizeof a->text - 1 - a->n) w = sizeof a->text - 1 - a->n;
    memcpy(a->text + a->n, piece, w);
    a->n += w;
    a->text[a->n] = 0;
}

static void csv_text(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s == '\n' ? ' ' : *s, f);
    }
    fputc('"', f);
}

int cmd_eval(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;
    const char *task = NULL, *policies = "full", *budgets = NULL, *backtracks = NULL, *csv = NULL;
    int64_t ctx_tokens = 4000, n_samples = 8, n_predict = 64, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--policy")) {
            if (!(policies = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--budget")) {
            if (!(budgets = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--backtrack")) {
            if (!(backtracks = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = cli_need_value(argc, argv, &i)) || cli_parse_int(a, v, 64, 1 << 20, &ctx_tokens)) return 1;
        } else if (!strcmp(a, "--task")) {
            if (!(task = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--samples")) {
            if (!(v = cli_need_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 100000, &n_samples)) return 1;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = cli_need_value(argc, argv, &i)) || cli_parse_int(a, v, 0, INT64_MAX, &seed)) return 1;
        } else if (!strcmp(a, "-n")) {
            if (!(v = cli_need_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 4096, &n_predict)) return 1;
        } else if (!strcmp(a, "--csv")) {
            if (!(csv = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            int r = cli_parse_common(&o, argc, argv, &i);
            if (r < 0) return 1;
            if (r == 0) {
                cli_err("eval: unknown option %s (see kvchat eval --help)", a);
                return 1;
            }
        }
    }
    if (!task || strcmp(task, "passkey")) {
        cli_err("eval: give --task passkey (the task this version generates)");
        return 1;
    }
    char specs[16][256], blist[8][32], rlist[8][32];
    int n_spec = cli_split_policies(policies, specs, 16);
    int n_bud = budgets ? split_list(budgets, blist, 8) : 1;
    int n_bt = backtracks ? split_list(backtracks, rlist, 8) : 1;
    if (!budgets) blist[0][0] = 0;
    if (!backtracks) snprintf(rlist[0], 32, "-1");
    if (n_spec < 1 || n_bud < 1 || n_bt < 1) {
        cli_err("eval: --policy takes 1 to 16 policies, --budget and --backtrack 1 to 8 values");
        return 1;
    }
    /* parse every configuration up front: a bad spec fails before any work. A policy without a
     * budget (full) runs once, not once per budget. */
    int n_cfg = 0, cap_cfg = n_spec * n_bud * n_bt;
    pol_spec *cfg = calloc((size_t)cap_cfg, sizeof *cfg);
    eval_row *rows = calloc((size_t)cap_cfg, sizeof *rows);
    if (!cfg || !rows) {
        cli_err("eval: out of memory");
        free(cfg);
        free(rows);
        return 1;
    }
    char err[600] = "";
    for (int p = 0; p < n_spec; p++) {
        pol_spec plain;
        if (pol_parse(&plain, specs[p], NULL, err, sizeof err)) {
            cli_err("eval: %s", err);
            free(cfg);
            free(rows);
            return 1;
        }
        int has_budget = 0;
        for (int k = 0; k < plain.n; k++)
            for (int q = 0; q < plain.ops[k]->n_params; q++) has_budget |= !strcmp(plain.ops[k]->params[q].name, "budget");
        for (int b = 0; b < (has_budget ? n_bud : 1); b++)
            for (int r = 0; r < n_bt; r++) {
                int64_t rv;
                const char *bud = has_budget && blist[b][0] ? blist[b] : NULL;
                if (pol_parse(&cfg[n_cfg], specs[p], bud, err, sizeof err) ||
                    cli_parse_int("--backtrack", rlist[r], -1, 1 << 20, &rv)) {
                    if (err[0]) cli_err("eval: %s", err);
                    free(cfg);
                    free(rows);
                    return 1;
                }
                snprintf(rows[n_cfg].policy, sizeof rows[n_cfg].policy, "%s", specs[p]);
                snprintf(rows[n_cfg].budget, sizeof rows[n_cfg].budget, "%.31s", bud ? bud : "-");
                rows[n_cfg].backtrack = (int)rv;
                n_cfg++;
            }
    }
    if (cli_finish_common(&o)) {
        free(cfg);
        free(rows);
        return 1;
    }
    cli_runtime rt;
    if (cli_open(&rt, &o, 1) != 0) {
        free(cfg);
        free(rows);
        return 1;
    }
    int rc = 1;
    FILE *out = NULL;
    int32_t nv = rt.m->hp.n_vocab, *ids = NULL;
    float *logits = malloc(sizeof(float) * (size_t)nv);
    samp *s = samp_create(&o.sp, nv);
    pol_set *attached = NULL;
    if (!logits || !s) {
        cli_err("eval: out of memory");
        goto done;
    }
    if (csv && !(out = fopen(csv, "w"))) {
        cli_err("eval: cannot write %s", csv);
        goto done;
    }
    if (out) fputs("task,ctx,sample,depth,policy,budget,backtrack,correct,answer,answer_tokens,events,regenerated,"
                   "kv_bytes,seconds\n", out);
    pol_set_free(rt.ps);   /* each configuration attaches its own */
    rt.ps = NULL;
    fwd_set_policy(rt.f, NULL);
    cli_install_sigint();
    pol_env env;
    fwd_policy_env(rt.f, &env);
    for (int64_t k = 0; k < n_samples && !cli_interrupted; k++) {
        /* about 11 tokens per filler sentence */
        uint64_t x = (uint64_t)seed * 2654435761ull + (uint64_t)k * 40503ull + 1;
        docgen_opts d;
        d.seed = x;
        d.n_sentences = (int)(ctx_tokens / 11);
        d.key_at = (int)(((x >> 7) % 1000) * (uint64_t)d.n_sentences / 1000);
        d.key = 10000 + (int)((x >> 17) % 90000);
        char key[16];
        snprintf(key, sizeof key, "%d", d.key);
        size_t dlen, n_ids = 0;
        char *doc = docgen_passkey(&d, &dlen);
        free(ids);
        ids = NULL;
        if (!doc || cli_doc_prompt(&rt, doc, "What is the pass key?", -1, &ids, &n_ids, err, sizeof err)) {
            cli_err("eval: %s", doc ? err : "out of memory");
            free(doc);
            goto done;
        }
        free(doc);
        if ((int64_t)n_ids + n_predict > fwd_n_ctx(rt.f)) {
            cli_err("eval: %zu prompt tokens and %lld answer tokens do not fit the context of %lld", n_ids,
                    (long long)n_predict, (long long)fwd_n_ctx(rt.f));
            goto done;
        }
        int shared = 0;   /* the full-cache prefill of this sample is in the cache */
        for (int c = 0; c < n_cfg && !cli_interrupted; c++) {
            int has_prefill = 0;
            for (int q = 0; q < cfg[c].n; q++) has_prefill |= cfg[c].ops[q]->stage == POL_STAGE_PREFILL;
            fwd_set_policy(rt.f, NULL);
            pol_set_free(attached);
            attached = pol_set_create(&cfg[c], &env, err, sizeof err);
            pol_set_probe_is_question(attached, 1);
            if (!attached || pol_set_check(attached, (int64_t)n_ids, err, sizeof err)) {
                cli_err("eval: %s", err);
                goto done;
            }
            double t0 = cli_now();
            /* the shared prefill, its last token evaluated again (a previous configuration may have
             * re-decoded it under its selection while backtracking); a full prefill when the cache
             * cannot roll back exactly */
            if (!has_prefill && shared && fwd_rewind(rt.f, (int64_t)n_ids - 1) != (int64_t)n_ids - 1) shared = 0;
            fwd_set_policy(rt.f, attached);   /* decode policies see the prompt's tokens too (SentKV) */
            if (has_prefill || !shared) {
                fwd_rewind(rt.f, 0);
                if (fwd_eval(rt.f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, &cli_interrupted, err,
                             sizeof err))
                    goto failed;
                fwd_set_floor(rt.f, (int64_t)n_ids - 1);
                shared = !has_prefill;
            } else {
                /* a new decode policy meets a prefilled cache: it gets the prompt's tokens as if it had
                 * run, and the last token's eval ends the prefill for it */
                pol_set_on_tokens(attached, ids, (int64_t)n_ids - 1, 0);
                if (fwd_eval(rt.f, ids + n_ids - 1, 1, logits, NULL, NULL, NULL, NULL, &cli_interrupted, err,
                             sizeof err))
                    goto failed;
            }
            samp_reset(s);
            for (size_t i = 0; i < n_ids; i++) samp_accept(s, ids[i]);
            int R = rows[c].backtrack >= 0 ? rows[c].backtrack : pol_set_can_reselect(attached) ? 2 : 0;
            gen_opts go = { n_predict, ids[n_ids - 1], &rt.thr, R, samp_temperature(s), 0 };
            answer_buf ab = { 0 };
            tok_stream_init(&ab.ts, rt.m->vocab);
            gen_callbacks cb = { &ab, on_token, NULL, NULL };
            gen_result gr;
            if (gen_answer(rt.f, s, rt.m->vocab, rt.mon, logits, nv, &go, &cb, &cli_interrupted, &gr, err, sizeof err))
                goto failed;
            double dt = cli_now() - t0;
            int ok = strstr(ab.text, key) != NULL;
            kv_stats ks;
            kv_get_stats(fwd_kv(rt.f), &ks);
            eval_row *r = &rows[c];
            r->runs++;
            r->correct += ok;
            r->tokens += gr.n_gen;
            r->events += gr.events;
            r->regenerated += gr.regenerated;
            r->seconds += dt;
            if (out) {
                fprintf(out, "passkey,%lld,%lld,%.3f,", (long long)n_ids, (long long)k,
                        (double)d.key_at / d.n_sentences);
                csv_text(out, rows[c].policy);
                fprintf(out, ",%s,%d,%d,", r->budget, R, ok);
                csv_text(out, ab.text);
                fprintf(out, ",%lld,%d,%d,%llu,%.2f\n", (long long)gr.n_gen, gr.events, gr.regenerated,
                        (unsigned long long)ks.bytes_resident, dt);
                fflush(out);
            }
            if (has_prefill) shared = 0;
            fprintf(stderr, "\reval: sample %lld/%lld, configuration %d/%d   ", (long long)k + 1, (long long)n_samples,
                    c + 1, n_cfg);
            continue;
        failed:
            cli_err("eval: %s", cli_interrupted ? "interrupted" : err);
            if (cli_interrupted) break;
            goto done;
        }
    }
    fputc('\n', stderr);
    printf("passkey, about %lld tokens, %lld samples, %lld answer tokens, thresholds %s\n", (long long)ctx_tokens,
           (long long)n_samples, (long long)n_predict, rt.thr.valid ? rt.thr.source : "none");
    printf("%-32s %7s %9s %9s %14s %14s %8s\n", "policy", "budget", "backtrack", "accuracy", "events/100 tok",
           "regen/100 tok", "s/run");
    for (int c = 0; c < n_cfg; c++) {
        eval_row *r = &rows[c];
        double per = r->tokens > 0 ? 100.0 / (double)r->tokens : 0;
        char bt[16];
        snprintf(bt, sizeof bt, r->backtrack < 0 ? "default" : "%d", r->backtrack);
        printf("%-32s %7s %9s %4lld/%-4lld %14.2f %14.2f %8.1f\n", r->policy, r->budget, bt, (long long)r->correct,
               (long long)r->runs, (double)r->events * per, (double)r->regenerated * per,
               r->runs ? r->seconds / (double)r->runs : 0.0);
    }
    rc = cli_interrupted ? 130 : 0;
done:
    fwd_set_policy(rt.f, NULL);
    pol_set_free(attached);
    if (out) fclose(out);
    free(ids);
    free(logits);
    samp_free(s);
    cli_close(&rt);
    free(cfg);
    free(rows);
    return rc;
}
