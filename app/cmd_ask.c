/* cmd_ask.c - `kvchat ask`: answer one question about a document under a KV-cache policy, then print
 * one line of metrics (and, with --show-pages, which pages of the document the answer attended). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "cli.h"
#include "commands.h"
#include "tokenizer.h"

static void usage(void)
{
    printf("usage: kvchat ask -d DOCUMENT -q QUESTION [options]\n"
           "\n"
           "  -d, --doc FILE       the document (UTF-8 text)\n"
           "  -q, --question TEXT  the question, asked after the document in one user turn\n"
           "  -n N                 answer tokens at most (default 128)\n"
           "  --chat / --plain     force the model's chat template / the plain completion format (default:\n"
           "                       the chat template when the model file has one, else plain)\n"
           "  --policy SPEC        KV-cache policy, e.g. chess:preset=aggressive, quest:budget=1024, take+chess\n"
           "  --budget B           fraction of the context (0 < B < 1) or a token count\n"
           "  --page-size P        KV cache page size in tokens (default 32)\n"
           "  --show-pages         print the page map: how often each page of the document was attended\n"
           "  --show-events        print each answer page's entropy statistics and every backtracking event\n"
           "  --backtrack R        regenerate at most R uncertain pages per answer (default 2 with chess, else 0)\n"
           "  --thresholds T       a calibration file, or MEAN_H,VAR_H (default: the model's calibration)\n"
           "  -m MODEL  --ctx N  --threads N  --temp T (default 0: greedy)  --seed S  ...\n\n");
    cli_policy_help();
}

/* One character per document page: how often decode steps attended it, relative to the maximum. */
static void print_page_map(cli_runtime *rt, int64_t doc_tokens)
{
    int64_t n;
    const int64_t *map = pol_set_page_map(rt->ps, &n);
    const pol_step_stats *st = pol_set_stats(rt->ps);
    int P = kv_page_size(fwd_kv(rt->f));
    int64_t doc_pages = (doc_tokens + P - 1) / P;
    int64_t total = (fwd_pos(rt->f) + P - 1) / P;
    int64_t mx = 0, attended = 0;
    for (int64_t i = 0; i < n; i++) {
        if (map[i] > mx) mx = map[i];
        attended += map[i] > 0;
    }
    static const char ramp[] = " .:-=+*#%@";
    printf("page map: %lld pages of %d tokens (%lld hold the prompt), %lld attended at least once over %lld steps; "
           "one character per page, ' ' never .. '@' most\n",
           (long long)total, P, (long long)doc_pages, (long long)attended, (long long)st->steps);
    for (int64_t i = 0; i < total; i += 64) {
        printf("%6lld |", (long long)i);
        for (int64_t j = i; j < i + 64 && j < total; j++) {
            int64_t h = j < n ? map[j] : 0;
            int lvl = h == 0 || mx == 0 ? 0 : 1 + (int)((h * 8) / (mx + 1));
            putchar(ramp[lvl > 9 ? 9 : lvl]);
        }
        printf("|\n");
    }
    int nl;
    const int *last = pol_set_last_pages(rt->ps, &nl);
    printf("last step, first global layer: %d pages:", nl);
    for (int i = 0; i < nl && i < 64; i++) printf(" %d", last[i]);
    printf(nl > 64 ? " ...\n" : "\n");
}

int cmd_ask(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;   /* answers are reproducible unless --temp asks otherwise */
    const char *doc = NULL, *question = NULL;
    int64_t n_predict = 128;
    int show_pages = 0, format = -1;   /* 1 chat template, 0 plain, -1 decide from the file */
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_common(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "-d") || !strcmp(a, "--doc")) {
            if (!(doc = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--question")) {
            if (!(question = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            const char *v = cli_need_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 1 << 20, &n_predict)) return 1;
        } else if (!strcmp(a, "--chat")) {
            format = 1;
        } else if (!strcmp(a, "--plain")) {
            format = 0;
        } else if (!strcmp(a, "--show-pages")) {
            show_pages = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            cli_err("ask: unknown option %s (see kvchat ask --help)", a);
            return 1;
        }
    }
    if (!doc || !question) {
        cli_err("ask: give both -d DOCUMENT and -q QUESTION");
        return 1;
    }
    if (!*question || tok_utf8_invalid_at(question, strlen(question)) >= 0) {
        cli_err("ask: the question is %s", *question ? "not valid UTF-8" : "empty");
        return 1;
    }
    if (cli_finish_common(&o)) return 1;
    size_t dlen;
    char *text = cli_read_text_file(doc, &dlen);
    if (!text) return 1;
    if (dlen == 0) {
        cli_err("ask: %s is empty", doc);
        free(text);
        return 1;
    }
    cli_runtime rt;
    if (cli_open(&rt, &o, 1) != 0) {
        free(text);
        return 1;
    }
    int rc = 1;
    char err[512];
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    samp *s = NULL;
    if (cli_doc_prompt(&rt, text, question, format, &ids, &n_ids, err, sizeof err)) {
        cli_err("ask: %s", err);
        goto done;
    }
    if ((int64_t)n_ids + 1 > fwd_n_ctx(rt.f)) {
        cli_err("ask: the document and question are %zu tokens, longer than the context of %lld tokens", n_ids,
                (long long)fwd_n_ctx(rt.f));
        goto done;
    }
    if (pol_set_check(rt.ps, (int64_t)n_ids, err, sizeof err)) {
        cli_err("ask: %s", err);
        goto done;
    }
    int32_t nv = rt.m->hp.n_vocab;
    logits = malloc(sizeof(float) * (size_t)nv);
    s = samp_create(&o.sp, nv);
    if (!logits || !s) {
        cli_err("ask: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_ids; i++) samp_accept(s, ids[i]);
    pol_set_probe_is_question(rt.ps, 1);   /* document and question are prefilled together */
    cli_install_sigint();
    double t0 = cli_now();
    if (fwd_eval(rt.f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, &cli_interrupted, err, sizeof err)) {
        cli_err("ask: %s", cli_interrupted ? "interrupted during prefill" : err);
        if (cli_interrupted) rc = 130;
        goto done;
    }
    double t1 = cli_now();
    gen_result gr;
    const char *stop_note;
    if (cli_stream_answer(&rt, s, logits, ids[n_ids - 1], n_predict, o.show_events, &gr, &stop_note, err,
                          sizeof err)) {
        cli_err("ask: %s", err);
        goto done;
    }
    double t2 = cli_now();
    if (show_pages) print_page_map(&rt, (int64_t)n_ids);
    fflush(stdout);
    kv_stats ks;
    kv_get_stats(fwd_kv(rt.f), &ks);
    const pol_step_stats *st = pol_set_stats(rt.ps);
    int64_t steps = st->steps;
    double mib = 1024.0 * 1024.0;
    int64_t n_glob = pol_set_env(rt.ps)->n_global;
    /* pages a step attends, per global layer and KV head, averaged over the steps */
    double denom = (double)steps * (double)n_glob * rt.m->hp.n_head_kv;
    double per = denom > 0 ? (double)st->pages_sum / denom : 0;
    double avail = denom > 0 ? (double)st->pages_total_sum / denom : 0;
    int64_t peak_layer = 0;
    for (int i = 0; i < n_glob; i++) {
        int64_t t = kv_peak_layer_tokens(fwd_kv(rt.f), pol_set_env(rt.ps)->global[i]);
        if (t > peak_layer) peak_layer = t;
    }
    fprintf(stderr,
            "policy %s | context %lld tokens | KV held %.2f MiB vs full %.2f MiB (peak %.2f MiB, %s; peak per global "
            "layer and KV head %lld tokens) | pages/step "
            "%.1f of %.0f | KV read/step %.2f MiB | prefill %.1f tok/s | decode %.1f tok/s (%lld tokens)%s\n",
            pol_set_spec(rt.ps)->text, (long long)ks.positions, (double)ks.bytes_resident / mib,
            (double)ks.bytes_full / mib, (double)ks.bytes_peak / mib,
            pol_set_saves_memory(rt.ps) ? "tokens dropped" : "selection keeps every page", (long long)peak_layer, per, avail,
            steps > 0 ? (double)st->bytes_touched_total / (double)steps / mib : 0.0, (double)n_ids / (t1 - t0),
            steps > 0 ? (double)steps / (t2 - t1) : 0.0, (long long)gr.n_gen, stop_note);
    char desc[1024];
    pol_set_describe(rt.ps, desc, sizeof desc);
    if (desc[0]) fprintf(stderr, "%s\n", desc);
    rc = cli_interrupted ? 130 : 0;
done:
    samp_free(s);
    free(logits);
    free(ids);
    free(text);
    cli_close(&rt);
    return rc;
}
