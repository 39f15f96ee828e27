/* cmd_perplexity.c - `kvchat perplexity`: the model's perplexity on a text, measured the way
 * llama.cpp's perplexity tool measures it, so the two can be compared on one file: the text's
 * tokens cut into chunks of --chunk tokens, each chunk evaluated alone with its first token replaced
 * by BOS, and the second half of every chunk scored (each of its tokens predicted from the logits
 * of the position before, with at least half a chunk of context). Full attention: this measures the
 * kernels and the model, not a policy. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "app/commands.h"
#include "common/text.h"
#include "engine/tokenizer.h"

typedef struct ppl_opts {
    const char *file;
    int64_t chunk, max_chunks;
} ppl_opts;

#define L(field) offsetof(ppl_opts, field)
static const opt_def ppl_defs[] = {
    { "--file", "-f", OPT_STR, L(file), 0, 0, NULL, 0, "TEXT_FILE", "the text (required)", NULL },
    { "--chunk", NULL, OPT_I64, L(chunk), 16, 1 << 20, NULL, 0, "N", "tokens per chunk (default 512)", NULL },
    { "--chunks", NULL, OPT_I64, L(max_chunks), 1, 1 << 30, NULL, 0, "N", "score at most N chunks (default: all)",
      NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef L

/* What the logits callback accumulates over one chunk. */
typedef struct ppl_acc {
    const int32_t *ids;      /* the chunk's tokens */
    int64_t n, first;        /* chunk length; the first position whose prediction is scored */
    int32_t n_vocab;
    double nll, nll2;        /* sums of -log p and its square */
    int64_t count;
} ppl_acc;

/* The logits at pos predict the token at pos + 1. */
static void on_logits(void *ud, int64_t pos, const float *l)
{
    ppl_acc *a = ud;
    if (pos < a->first - 1 || pos + 1 >= a->n) return;
    float mx = l[0];
    for (int32_t i = 1; i < a->n_vocab; i++)
        if (l[i] > mx) mx = l[i];
    double z = 0;
    for (int32_t i = 0; i < a->n_vocab; i++) z += exp((double)l[i] - mx);
    double nll = log(z) + mx - (double)l[a->ids[pos + 1]];
    a->nll += nll;
    a->nll2 += nll * nll;
    a->count++;
}

int cmd_perplexity(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    ppl_opts po = { NULL, 512, 0 };
    opt_group g[] = { { ppl_defs, &po, NULL }, CLI_MODEL(&o) };
    int pr = cli_parse(argc, argv, "kvchat perplexity [-m MODEL] -f TEXT_FILE [--chunk N] [--chunks N]",
                       "Perplexity of the model on a text: chunks of N tokens, each from BOS, the second half of each "
                       "scored (as llama.cpp's perplexity tool does).",
                       g, 2, NULL, 0, NULL);
    if (pr) return pr > 0 ? 0 : 1;
    if (!po.file) {
        cli_err("perplexity: -f TEXT_FILE is required (see kvchat perplexity --help)");
        return 1;
    }
    size_t tlen;
    char *text = cli_read_text_file(po.file, &tlen);
    if (!text) return 1;
    run *r = NULL;
    int rc = 1;
    char err[512];
    int32_t *ids = NULL, *chunk = NULL;
    size_t n_ids = 0;
    if (cli_finish_common(&o) || !(r = cli_run(&o))) goto done;
    const model *m = run_model(r);
    if (tok_encode(m->vocab, text, tlen, 0, 0, &ids, &n_ids, err, sizeof err)) {
        cli_err("perplexity: %s", err);
        goto done;
    }
    int64_t C = po.chunk, n_chunks = (int64_t)n_ids / C;
    if (po.max_chunks > 0 && n_chunks > po.max_chunks) n_chunks = po.max_chunks;
    if (n_chunks < 1) {
        cli_err("perplexity: %s: %zu tokens, fewer than one chunk of %lld (a longer text, or a smaller --chunk)",
                po.file, n_ids, (long long)C);
        goto done;
    }
    if (C > run_n_ctx(r)) {
        cli_err("perplexity: --chunk %lld is longer than the context of %lld tokens", (long long)C,
                (long long)run_n_ctx(r));
        goto done;
    }
    if (!(chunk = malloc(sizeof(int32_t) * (size_t)C))) {
        cli_err("perplexity: out of memory");
        goto done;
    }
    cli_catch_stop_signals();
    run_set_abort(r, &cli_interrupted);
    text_put(stdout, po.file, 0);   /* a path may hold control characters */
    printf(": %zu tokens, %lld chunks of %lld, the last %lld of each scored\n", n_ids, (long long)n_chunks, (long long)C,
           (long long)(C - C / 2));
    ppl_acc a = { chunk, C, C / 2, m->hp.n_vocab, 0, 0, 0 };
    for (int64_t c = 0; c < n_chunks; c++) {
        memcpy(chunk, ids + c * C, sizeof(int32_t) * (size_t)C);
        if (tok_add_bos(m->vocab)) chunk[0] = tok_bos(m->vocab);
        /* the first half only as context (no logits: the vocabulary product is most of a token's
         * cost on a small model), the rest with every position's logits; prefill chunking leaves
         * the bits unchanged */
        if (run_rewind(r, 0, 0, err, sizeof err) || run_feed(r, chunk, a.first - 1, NULL, NULL, err, sizeof err) ||
            run_feed(r, chunk + a.first - 1, C - a.first + 1, on_logits, &a, err, sizeof err)) {
            cli_err("perplexity: %s", err);
            goto done;
        }
        printf("[%lld]%.4f%s", (long long)(c + 1), exp(a.nll / (double)a.count), c + 1 < n_chunks ? "," : "\n");
        fflush(stdout);
    }
    double mean = a.nll / (double)a.count, var = a.nll2 / (double)a.count - mean * mean;
    double se = var > 0 && a.count > 1 ? sqrt(var / (double)(a.count - 1)) : 0;
    printf("perplexity %.4f +/- %.4f over %lld tokens (mean -log p %.6f)\n", exp(mean), exp(mean) * se,
           (long long)a.count, mean);
    rc = cli_stdout_done("perplexity");
done:
    free(chunk);
    free(ids);
    free(text);
    run_free(r);
    return rc;
}
