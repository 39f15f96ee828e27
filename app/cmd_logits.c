/* cmd_logits.c - `kvchat logits`: print the reference format of ../shared/testdata/README.md
 * (n_vocab, prompt ids, top-5 logits after every prompt position, a 32-token greedy continuation and
 * the top-5 after each step) so any reference file can be compared with a script. --feed replaces
 * the engine's own greedy choices by given ids (teacher forcing). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "app/commands.h"
#include "engine/tokenizer.h"

/* Top-5 ids by logit, ties broken by the lower id. */
static void top5(const float *l, int32_t n, int32_t *ids)
{
    for (int k = 0; k < 5; k++) ids[k] = -1;
    for (int32_t i = 0; i < n; i++) {
        float v = l[i];
        if (ids[4] >= 0 && !(v > l[ids[4]])) continue;
        int k = 4;
        while (k > 0 && (ids[k - 1] < 0 || v > l[ids[k - 1]])) {
            ids[k] = ids[k - 1];
            k--;
        }
        ids[k] = i;
    }
}

static void print_top5(FILE *out, const char *tag, int64_t i, const float *l, int32_t n)
{
    int32_t t[5];
    top5(l, n, t);
    fprintf(out, "%s %lld top5", tag, (long long)i);
    for (int k = 0; k < 5 && t[k] >= 0; k++) fprintf(out, " %d:%.6f", t[k], l[t[k]]);
    fputc('\n', out);
}

typedef struct pos_printer {
    int32_t n_vocab;
} pos_printer;

static void on_logits(void *ud, int64_t pos, const float *l)
{
    pos_printer *p = ud;
    print_top5(stdout, "pos", pos, l, p->n_vocab);
}

static int32_t argmax(const float *l, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

typedef struct logits_opts {
    const char *file, *feed;
    int64_t n_gen;
} logits_opts;

#define L(field) offsetof(logits_opts, field)
static const opt_def logits_defs[] = {
    { "--file", "-f", OPT_STR, L(file), 0, 0, NULL, 0, "PROMPT_FILE", "the prompt (required)", NULL },
    { "--gen", NULL, OPT_I64, L(n_gen), 0, 1 << 20, NULL, 0, "N", "greedy steps after the prompt (default 32)", NULL },
    { "--feed", NULL, OPT_STR, L(feed), 0, 0, NULL, 0, "\"ID ID ...\"",
      "decode these ids one at a time instead of the greedy ones (teacher forcing)", NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef L

int cmd_logits(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    logits_opts lo = { NULL, NULL, 32 };
    opt_group g[] = { { logits_defs, &lo, NULL }, CLI_MODEL(&o) };
    int pr = cli_parse(argc, argv, "kvchat logits [-m MODEL] -f PROMPT_FILE [--gen N | --feed \"ID ID ...\"]",
                      "The reference format of the test data: prompt ids, top-5 logits after every position, greedy "
                      "steps.", g, 2, NULL, 0, NULL);
    if (pr) return pr > 0 ? 0 : 1;
    const char *file = lo.file, *feed = lo.feed;
    int64_t n_gen = lo.n_gen;
    if (!file) {
        cli_err("logits: -f PROMPT_FILE is required (see kvchat logits --help)");
        return 1;
    }
    size_t tlen;
    char *text = cli_read_text_file(file, &tlen);
    if (!text) return 1;
    int32_t *fed = NULL;
    size_t n_fed = 0;
    if (feed) {
        size_t cap = 64;
        fed = malloc(cap * sizeof *fed);
        const char *p = feed;
        while (fed) {
            while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
            if (!*p) break;
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v > INT32_MAX) {
                cli_err("logits: --feed: '%.20s' is not a token id", p);
                free(fed);
                free(text);
                return 1;
            }
            if (n_fed == cap) {
                cap *= 2;
                int32_t *nf = realloc(fed, cap * sizeof *fed);
                if (!nf) free(fed);
                fed = nf;
                if (!fed) break;
            }
            fed[n_fed++] = (int32_t)v;
            p = end;
        }
        if (!fed) {
            cli_err("logits: out of memory");
            free(text);
            return 1;
        }
        n_gen = (int64_t)n_fed;
    }
    run *r = NULL;
    int rc = 1;
    char err[512];
    int32_t *ids = NULL, *gen = NULL;
    size_t n_ids = 0;
    float *logits = NULL, *top_val = NULL;
    int32_t *top_id = NULL;
    if (cli_finish_common(&o) || !(r = cli_run(&o))) goto done;
    const model *m = run_model(r);
    int32_t nv = m->hp.n_vocab;
    for (size_t i = 0; i < n_fed; i++)
        if (fed[i] >= nv) {
            cli_err("logits: --feed: token id %d out of range (vocabulary has %d)", fed[i], nv);
            goto done;
        }
    if (tok_encode(m->vocab, text, tlen, tok_add_bos(m->vocab), 0, &ids, &n_ids, err, sizeof err)) {
        cli_err("logits: %s", err);
        goto done;
    }
    if (n_ids == 0) {
        cli_err("logits: %s: the prompt is empty", file);
        goto done;
    }
    if ((int64_t)(n_ids + (size_t)n_gen) > run_n_ctx(r)) {
        cli_err("logits: the prompt (%zu tokens) plus %lld steps does not fit in the context of %lld (raise --ctx)",
                n_ids, (long long)n_gen, (long long)run_n_ctx(r));
        goto done;
    }
    logits = malloc(sizeof(float) * (size_t)nv);
    size_t ng = (size_t)(n_gen > 0 ? n_gen : 1);
    gen = malloc(sizeof(int32_t) * ng);
    top_id = malloc(sizeof(int32_t) * 5 * ng);
    top_val = malloc(sizeof(float) * 5 * ng);
    if (!logits || !gen || !top_id || !top_val) {
        cli_err("logits: out of memory");
        goto done;
    }
    cli_catch_stop_signals();
    printf("n_vocab %d\nprompt_tokens %zu\nids", nv, n_ids);
    for (size_t i = 0; i < n_ids; i++) printf(" %d", ids[i]);
    putchar('\n');
    pos_printer pp = { nv };
    run_set_abort(r, &cli_interrupted);
    if (run_feed(r, ids, (int64_t)n_ids, on_logits, &pp, err, sizeof err)) {
        cli_err("logits: %s", err);
        goto done;
    }
    memcpy(logits, run_logits(r), sizeof(float) * (size_t)nv);
    /* Steps are computed before printing because the greedy line comes first in the format. */
    for (int64_t t = 0; t < n_gen; t++) {
        gen[t] = fed ? fed[t] : argmax(logits, nv);
        if (run_decode(r, gen[t], err, sizeof err)) {
            cli_err("logits: %s", err);
            goto done;
        }
        memcpy(logits, run_logits(r), sizeof(float) * (size_t)nv);
        top5(logits, nv, top_id + 5 * t);
        for (int k = 0; k < 5; k++) top_val[5 * t + k] = top_id[5 * t + k] >= 0 ? logits[top_id[5 * t + k]] : 0;
    }
    printf("greedy");
    for (int64_t t = 0; t < n_gen; t++) printf(" %d", gen[t]);
    putchar('\n');
    for (int64_t t = 0; t < n_gen; t++) {
        printf("step %lld top5", (long long)t);
        for (int k = 0; k < 5 && top_id[5 * t + k] >= 0; k++) printf(" %d:%.6f", top_id[5 * t + k], top_val[5 * t + k]);
        putchar('\n');
    }
    rc = cli_stdout_done("logits");
done:
    free(gen);
    free(top_id);
    free(top_val);
    free(logits);
    free(ids);
    free(fed);
    free(text);
    run_free(r);
    return rc;
}
