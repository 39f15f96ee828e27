/* cmd_genmodel.c - `kvchat gen-model`: write a random-weight model of a real model's shape as a GGUF
 * file that kvchat and a peer engine both read (engine/genmodel.c does the work; this file parses
 * the options and reports progress). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
#include "common/files.h"
#include "common/text.h"
#include "engine/genmodel.h"

typedef struct gm_opts {
    const char *shape, *type, *out, *vocab;
    uint64_t seed;
    int threads, force, vocab_only;
} gm_opts;

#define G(field) offsetof(gm_opts, field)
static const opt_def gm_defs[] = {
    { "--shape", NULL, OPT_STR, G(shape), 0, 0, NULL, 0, "SHAPE",
      "gemma3-270m, mistral-7b, llama-8b, tiny-llama or tiny-gemma3 (required, except with --vocab-only)", NULL },
    { "--type", NULL, OPT_STR, G(type), 0, 0, NULL, 0, "TYPE", "f16, q8_0 or q4_k_m (required, except with --vocab-only)", NULL },
    { "--out", "-o", OPT_STR, G(out), 0, 0, NULL, 0, "FILE",
      "the GGUF file to write (required); - writes it to standard output when that is a pipe or a file "
      "(never a terminal; ./- names a file called -)", NULL },
    { "--vocab", NULL, OPT_STR, G(vocab), 0, 0, NULL, 0, "GGUF",
      "copy the vocabulary (every tokenizer.* entry) from this file (default: the default model)", NULL },
    { "--vocab-only", NULL, OPT_FLAG, G(vocab_only), 0, 0, NULL, 0, NULL,
      "write only the vocabulary of --vocab (no --shape or --type): a small file that serves as --vocab "
      "where the model itself is too large to carry", NULL },
    { "--seed", NULL, OPT_U64, G(seed), 0, (double)INT64_MAX, NULL, 0, "S", "random seed of the weights (default 0)",
      NULL },
    { "--threads", "-t", OPT_INT, G(threads), 1, 256, NULL, 0, "N", "threads (default: all cores)", NULL },
    { "--force", NULL, OPT_FLAG, G(force), 0, 0, NULL, 0, NULL,
      "replace FILE if it exists (a regular file, or a link, which is replaced, not followed; a directory, "
      "FIFO, device or socket is refused)", NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef G

static void show_progress(void *ud, uint64_t done, uint64_t total)
{
    int *last = ud;
    int pct = total ? (int)(100.0 * (double)done / (double)total) : 100;
    if (pct == *last) return;
    *last = pct;
    fprintf(stderr, "\rgen-model: %3d%% (%.2f of %.2f GB)", pct, (double)done / 1e9, (double)total / 1e9);
    fflush(stderr);
}

/* --vocab-only: the vocabulary of `vocab` to o->out (or standard output, checked by the caller). */
static int write_vocab(const gm_opts *o, const char *vocab, int to_stdout)
{
    char err[600];
    int64_t n = 0;
    int rc = gen_vocab_write(vocab, to_stdout ? "standard output" : o->out, o->force, to_stdout ? stdout : NULL, &n, err,
                             sizeof err);
    if (rc == -2) {
        cli_err("gen-model: %s exists (--force replaces it)", o->out);
        return 1;
    }
    if (rc) {
        cli_err("gen-model: %s", err);
        return 1;
    }
    char out_shown[1100], vocab_shown[1100];
    text_escape(o->out, out_shown, sizeof out_shown, 0);
    text_escape(vocab, vocab_shown, sizeof vocab_shown, 0);
    struct stat st;
    FILE *report = to_stdout ? stderr : stdout;
    if (to_stdout)
        fprintf(report, "gen-model: wrote the vocabulary to standard output: %lld pieces from %s\n", (long long)n,
                vocab_shown);
    else
        fprintf(report, "wrote %s: vocabulary of %lld pieces from %s, %.1f MiB\n", out_shown, (long long)n, vocab_shown,
                stat(o->out, &st) == 0 ? (double)st.st_size / 1048576.0 : 0.0);
    return 0;
}

int cmd_genmodel(int argc, char **argv)
{
    gm_opts o = { 0 };
    opt_group g[] = { { gm_defs, &o, NULL } };
    int r = cli_parse(argc, argv, "kvchat gen-model --shape SHAPE --type f16|q8_0|q4_k_m -o FILE [--vocab GGUF] [--seed S]\n"
                      "       kvchat gen-model --vocab-only -o FILE [--vocab GGUF] [--force]",
                      "A random-weight model of a real model's shape, as a GGUF file kvchat and llama.cpp both read.",
                      g, 1, NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
    if (o.vocab_only && (o.shape || o.type)) {
        cli_err("gen-model: --vocab-only writes a vocabulary, not a model: drop --shape and --type");
        return 1;
    }
    if (o.vocab_only && !o.out) {
        cli_err("gen-model: --vocab-only needs -o FILE");
        return 1;
    }
    if (!o.vocab_only && (!o.shape || !o.type || !o.out)) {
        cli_err("gen-model: --shape, --type and -o are required (see kvchat gen-model --help)");
        return 1;
    }
    const gen_shape *shape = o.vocab_only ? NULL : gen_find_shape(o.shape);
    enum gen_mix mix = GEN_F16;
    if (!o.vocab_only && !shape) {
        cli_err("gen-model: unknown shape '%s' (see kvchat gen-model --help)", o.shape);
        return 1;
    }
    if (!o.vocab_only && gen_parse_mix(o.type, &mix)) {
        cli_err("gen-model: unknown type '%s' (f16, q8_0 or q4_k_m)", o.type);
        return 1;
    }
    char vocab_buf[1024];
    const char *vocab = o.vocab ? o.vocab : cli_default_model_path(vocab_buf, sizeof vocab_buf);
    struct stat st;
    if (!o.vocab && stat(vocab, &st) != 0) {
        cli_err("gen-model: the default model, whose vocabulary is used, is not at %s (run `make model`, or pass "
                "--vocab GGUF)", vocab);
        return 1;
    }
    /* -o -: the writer never seeks, so a pipe works; a terminal would get binary garbage, and a
     * device is no place for a model or vocabulary file */
    int to_stdout = !strcmp(o.out, "-");
    if (to_stdout && (isatty(STDOUT_FILENO) || fstat(STDOUT_FILENO, &st) != 0 ||
                      !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))) {
        cli_err("gen-model: -o - writes the %s to standard output, which is %s; redirect it to a file or a pipe",
                o.vocab_only ? "vocabulary" : "model",
                isatty(STDOUT_FILENO) ? "a terminal" : fstat(STDOUT_FILENO, &st) != 0 ? "closed" : files_kind(st.st_mode));
        return 1;
    }
    if (o.vocab_only) return write_vocab(&o, vocab, to_stdout);
    gen_request req = { shape, mix, vocab, to_stdout ? "standard output" : o.out, o.seed, o.force, o.threads,
                        &cli_interrupted, to_stdout ? stdout : NULL };
    cli_catch_stop_signals();
    char err[600];
    int last = -1;
    double t0 = cli_now();
    int rc = gen_model_write(&req, isatty(STDERR_FILENO) ? show_progress : NULL, &last, err, sizeof err);
    if (last >= 0) fputc('\n', stderr);
    if (rc == -3) {
        cli_err(to_stdout ? "gen-model: interrupted; standard output holds part of a model"
                          : "gen-model: interrupted; nothing was written");
        return cli_interrupt_status();
    }
    if (rc == -2) {
        cli_err("gen-model: %s exists (--force replaces it)", o.out);
        return 1;
    }
    if (rc) {
        cli_err("gen-model: %s", err);
        return 1;
    }
    char out_shown[1100], vocab_shown[1100];   /* file names are shown, never executed by a terminal */
    text_escape(o.out, out_shown, sizeof out_shown, 0);
    text_escape(vocab, vocab_shown, sizeof vocab_shown, 0);
    if (to_stdout) {   /* standard output holds the model: the report goes to stderr */
        fprintf(stderr, "gen-model: wrote the model to standard output: %s shape, %s, vocabulary of %s, seed %llu, "
                "%.1f s\n", shape->name, gen_mix_name(mix), vocab_shown, (unsigned long long)o.seed, cli_now() - t0);
        return 0;
    }
    double mib = stat(o.out, &st) == 0 ? (double)st.st_size / 1048576.0 : 0;
    printf("wrote %s: %s shape, %s, %.1f MiB, vocabulary of %s, seed %llu, %.1f s\n", out_shown, shape->name,
           gen_mix_name(mix), mib, vocab_shown, (unsigned long long)o.seed, cli_now() - t0);
    return 0;
}
