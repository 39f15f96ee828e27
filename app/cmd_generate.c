/* cmd_generate.c - `kvchat generate`: complete a prompt (or answer it as a chat turn), streaming the
 * text as it is produced, then one line of figures: prompt tokens, prefill and decode speed, peak RSS. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "app/commands.h"
#include "engine/chat.h"
#include "engine/tokenizer.h"

typedef struct gen_cmd_opts {
    const char *prompt, *file, *system;
    int64_t n_predict;
    int chat, special;
} gen_cmd_opts;

#define G(field) offsetof(gen_cmd_opts, field)
static const opt_def gen_defs[] = {
    { "--prompt", "-p", OPT_STR, G(prompt), 0, 0, NULL, 0, "TEXT", "the prompt", NULL },
    { "--file", "-f", OPT_STR, G(file), 0, 0, NULL, 0, "FILE", "the prompt from a file (UTF-8 text)", NULL },
    { "--n-predict", "-n", OPT_I64, G(n_predict), 0, 1 << 24, NULL, 0, "N", "tokens to generate (default 256)", NULL },
    { "--chat", NULL, OPT_FLAG, G(chat), 0, 0, NULL, 0, NULL, "wrap the prompt in the model's chat template", NULL },
    { "--system", NULL, OPT_STR, G(system), 0, 0, NULL, 0, "TEXT", "a system message (with --chat)", NULL },
    { "--special", NULL, OPT_FLAG, G(special), 0, 0, NULL, 0, NULL, "parse special-token texts in the prompt", NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef G

/* The prompt's ids: the text, or a chat turn (with an optional system message). 0, or -1 after printing. */
static int prompt_ids(const model *m, const gen_cmd_opts *g, const char *text, size_t tlen, int32_t **ids, size_t *n)
{
    char err[512];
    if (g->chat) {
        chat_msg msgs[2];
        size_t nm = 0;
        if (g->system) msgs[nm++] = (chat_msg){ "system", g->system };
        msgs[nm++] = (chat_msg){ "user", text };
        char *rendered = chat_render(chat_family_for(m->gguf), msgs, nm, 1, err, sizeof err);
        int bad = !rendered || tok_encode(m->vocab, rendered, strlen(rendered), 0, 1, ids, n, err, sizeof err);
        free(rendered);
        if (bad) cli_err("generate: %s", err);
        return bad ? -1 : 0;
    }
    if (tok_encode(m->vocab, text, tlen, tok_add_bos(m->vocab), g->special, ids, n, err, sizeof err)) {
        cli_err("generate: %s", err);
        return -1;
    }
    return 0;
}

int cmd_generate(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    gen_cmd_opts g = { NULL, NULL, NULL, 256, 0, 0 };
    opt_group gr_[] = { { gen_defs, &g, NULL }, CLI_MODEL(&o), CLI_POLICY(&o), CLI_SAMPLING(&o) };
    int r = cli_parse(argc, argv, "kvchat generate [-m MODEL] (-p TEXT | -f FILE) [options]",
                      "Complete a prompt (or answer it as a chat turn), streaming the text, then one line of figures.",
                      gr_, 4, NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
    if (!!g.prompt == !!g.file) {
        cli_err("generate: give exactly one of -p TEXT or -f FILE");
        return 1;
    }
    if (cli_finish_common(&o)) return 1;
    char *text = NULL;
    size_t tlen = 0;
    if (g.file) {
        if (!(text = cli_read_text_file(g.file, &tlen))) return 1;
    } else {
        tlen = strlen(g.prompt);
        if (tok_utf8_invalid_at(g.prompt, tlen) >= 0) {
            cli_err("generate: the prompt is not valid UTF-8 (byte %lld)", (long long)tok_utf8_invalid_at(g.prompt, tlen));
            return 1;
        }
        text = strdup(g.prompt);
    }
    if (tlen == 0) {
        cli_err("generate: the prompt is empty");
        free(text);
        return 1;
    }
    session *s = cli_session(&o, g.n_predict, SESS_FORMAT_AUTO);
    if (!s) {
        free(text);
        return 1;
    }
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const model *m = run_model(sess_run(s));
    if (prompt_ids(m, &g, text, tlen, &ids, &n_ids)) goto done;
    if (n_ids == 0) {
        cli_err("generate: the prompt is empty");
        goto done;
    }
    if ((int64_t)n_ids >= run_n_ctx(sess_run(s))) {
        cli_err("generate: the prompt is %zu tokens, longer than the context of %lld (raise --ctx, up to %d)", n_ids,
                (long long)run_n_ctx(sess_run(s)), m->hp.n_ctx_train);
        goto done;
    }
    sess_callbacks cb = cli_print_callbacks(&o.show_events);
    sess_set_callbacks(s, &cb, &cli_interrupted);
    cli_catch_stop_signals();
    int st = sess_feed(s, ids, (int64_t)n_ids, NULL, NULL);
    if (st) {
        cli_err("generate: %s", st == SESS_ECANCELLED ? "interrupted during prefill" : sess_error(s));
        if (st == SESS_ECANCELLED) rc = cli_interrupt_status();
        goto done;
    }
    if (o.show_events) cli_print_event_header(s);
    gen_result gres = { 0 };
    if (g.n_predict > 0 && sess_generate(s, g.n_predict, &gres)) {
        cli_err("generate: %s", sess_error(s));
        goto done;
    }
    cli_print_answer_end(s, o.show_events);
    /* Decode speed counts the forward passes of generated tokens (the last sampled one is not run). */
    run_figures fg;
    run_get_figures(sess_run(s), &fg);
    fprintf(stderr, "prompt %zu tokens | prefill %.1f tok/s | decode %.1f tok/s (%lld tokens)%s | peak RSS %.1f MiB\n",
            n_ids, fg.prefill_tok_s, fg.decode_tok_s, (long long)gres.n_gen, cli_stop_note(&gres), fg.rss_peak_mib);
    rc = cli_interrupted ? cli_interrupt_status() : 0;
done:
    free(ids);
    free(text);
    sess_free(s);
    return rc;
}
