/* cmd_generate.c - `kvchat generate`: complete a prompt (or answer it as a chat turn), streaming the
 * text as it is produced, then one line of figures: prompt tokens, prefill and decode speed, peak RSS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "app/cli.h"
#include "app/commands.h"
#include "engine/tokenizer.h"

static void usage(void)
{
    fputs("usage: kvchat generate [-m MODEL] (-p TEXT | -f FILE) [-n N] [--chat] [--system TEXT] [--special]\n"
          "                       [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N]\n"
          "                       [--seed S] [--threads T] [--ctx N] [--batch N] [--tokenizer FILE.model]\n",
          stderr);
}

int cmd_generate(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    const char *prompt = NULL, *file = NULL, *system = NULL;
    int64_t n_predict = 256;
    int chat = 0, special = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_common(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            const char *v = cli_need_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 0, 1 << 24, &n_predict)) return 1;
        } else if (!strcmp(a, "--chat")) {
            chat = 1;
        } else if (!strcmp(a, "--system")) {
            if (!(system = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--special")) {
            special = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            cli_err("generate: unknown option %s", a);
            usage();
            return 1;
        }
    }
    if (!!prompt == !!file) {
        cli_err("generate: give exactly one of -p TEXT or -f FILE");
        return 1;
    }
    char *text = NULL;
    size_t tlen = 0;
    if (file) {
        if (!(text = cli_read_text_file(file, &tlen))) return 1;
    } else {
        tlen = strlen(prompt);
        if (tok_utf8_invalid_at(prompt, tlen) >= 0) {
            cli_err("generate: the prompt is not valid UTF-8 (byte %lld)", (long long)tok_utf8_invalid_at(prompt, tlen));
            return 1;
        }
        text = strdup(prompt);
    }
    if (tlen == 0) {
        cli_err("generate: the prompt is empty");
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
    if (chat) {
        chat_msg msgs[2];
        size_t nm = 0;
        if (system) msgs[nm++] = (chat_msg){ "system", system };
        msgs[nm++] = (chat_msg){ "user", text };
        char *rendered = chat_render(chat_family_for(rt.m->gguf), msgs, nm, 1, err, sizeof err);
        if (!rendered) {
            cli_err("generate: %s", err);
            goto done;
        }
        int e = tok_encode(rt.m->vocab, rendered, strlen(rendered), 0, 1, &ids, &n_ids, err, sizeof err);
        free(rendered);
        if (e) {
            cli_err("generate: %s", err);
            goto done;
        }
    } else if (tok_encode(rt.m->vocab, text, tlen, tok_add_bos(rt.m->vocab), special, &ids, &n_ids, err,
                          sizeof err)) {
        cli_err("generate: %s", err);
        goto done;
    }
    if (n_ids == 0) {
        cli_err("generate: the prompt is empty");
        goto done;
    }
    if ((int64_t)n_ids >= fwd_n_ctx(rt.f)) {
        cli_err("generate: the prompt is %zu tokens, longer than the context of %lld (raise --ctx, up to %d)", n_ids,
                (long long)fwd_n_ctx(rt.f), rt.m->hp.n_ctx_train);
        goto done;
    }
    int32_t nv = rt.m->hp.n_vocab;
    logits = malloc(sizeof(float) * (size_t)nv);
    s = samp_create(&o.sp, nv);
    if (!logits || !s) {
        cli_err("generate: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_ids; i++) samp_accept(s, ids[i]);
    cli_install_sigint();
    double t0 = cli_now();
    if (fwd_eval(rt.f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, &cli_interrupted, err, sizeof err)) {
        cli_err("generate: %s", cli_interrupted ? "interrupted during prefill" : err);
        if (cli_interrupted) rc = 130;
        goto done;
    }
    double t1 = cli_now();
    gen_result gr;
    const char *stop_note;
    if (cli_stream_answer(&rt, s, logits, ids[n_ids - 1], n_predict, o.show_events, &gr, &stop_note, NULL, err,
                          sizeof err)) {
        cli_err("generate: %s", err);
        goto done;
    }
    double t2 = cli_now();
    fflush(stdout);
    /* Decode speed counts the forward passes of generated tokens (the last sampled one is not run). */
    int64_t n_dec = gr.n_decoded;
    fprintf(stderr, "prompt %zu tokens | prefill %.1f tok/s | decode %.1f tok/s (%lld tokens)%s | peak RSS %.1f MiB\n",
            n_ids, (double)n_ids / (t1 - t0), n_dec > 0 ? (double)n_dec / (t2 - t1) : 0.0, (long long)gr.n_gen,
            stop_note, cli_peak_rss_mib());
    rc = cli_interrupted ? 130 : 0;
done:
    samp_free(s);
    free(logits);
    free(ids);
    free(text);
    cli_close(&rt);
    return rc;
}
