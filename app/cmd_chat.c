/* cmd_chat.c - `kvchat chat`: a line-oriented chat in the terminal (what `kvchat` runs by default).
 *
 * Every turn the whole conversation is rendered with the model's chat template and tokenized; the
 * KV cache is reused for the longest prefix it already holds, so only the new turn is prefilled.
 * Ctrl-C stops the current answer; Ctrl-D (end of input) or /quit leaves. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/chat.h"
#include "app/cli.h"
#include "common/text.h"
#include "app/commands.h"
#include "engine/tokenizer.h"
#include "ui/config.h"

typedef struct convo {
    chat_msg *msgs;
    size_t n, cap;
} convo;

static int convo_add(convo *c, const char *role, const char *text)
{
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 8;
        chat_msg *nm = realloc(c->msgs, nc * sizeof *nm);
        if (!nm) return -1;
        c->msgs = nm;
        c->cap = nc;
    }
    char *dup = strdup(text);
    if (!dup) return -1;
    c->msgs[c->n++] = (chat_msg){ role, dup };
    return 0;
}

static void convo_free(convo *c)
{
    for (size_t i = 0; i < c->n; i++) free((char *)c->msgs[i].content);
    free(c->msgs);
}

typedef struct chat_opts {
    const char *system;
    int64_t n_predict;
} chat_opts;

#define C(field) offsetof(chat_opts, field)
static const opt_def chat_defs[] = {
    { "--system", NULL, OPT_STR, C(system), 0, 0, NULL, 0, "TEXT", "a system message", NULL },
    { "--n-predict", "-n", OPT_I64, C(n_predict), 1, 1 << 20, NULL, 0, "N", "answer tokens at most (default 512)",
      NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef C

/* One turn: the whole conversation rendered, the cached prefix kept, the rest evaluated, the answer
 * streamed. 0; 1 when the turn did not happen (said on stderr); -1 out of memory. */
static int turn(session *s, convo *cv, int64_t n_predict)
{
    const model *m = run_model(sess_run(s));
    char err[512];
    char *text = chat_render(chat_family_for(m->gguf), cv->msgs, cv->n, 1, err, sizeof err);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!text || tok_encode(m->vocab, text, strlen(text), 0, 1, &ids, &n_ids, err, sizeof err)) {
        cli_err("chat: %s", err);
        free(text);
        return 1;
    }
    free(text);
    int64_t n_ctx = run_n_ctx(sess_run(s));
    if ((int64_t)n_ids + 16 >= n_ctx) {
        cli_err("chat: the conversation (%zu tokens) no longer fits in the context of %lld; start a new one", n_ids,
                (long long)n_ctx);
        free(ids);
        return 1;
    }
    /* Reuse the cached prefix; at least the last token is always evaluated to get logits. */
    int64_t n_cached, common = 0, pos = run_pos(sess_run(s));
    const int32_t *cached = run_tokens(sess_run(s), &n_cached);
    while (common < pos && common < n_cached && common < (int64_t)n_ids - 1 && cached[common] == ids[common]) common++;
    if (sess_rewind(s, common) || sess_feed(s, ids + common, (int64_t)n_ids - common, NULL, NULL)) {
        cli_err("chat: %s", sess_error(s));
        free(ids);
        return 1;
    }
    free(ids);
    gen_result g;
    if (sess_generate(s, n_predict, &g)) {
        cli_err("chat: %s", sess_error(s));
        return 1;
    }
    fputc('\n', stdout);
    return convo_add(cv, "assistant", sess_last_answer(s)->text ? sess_last_answer(s)->text : "") ? -1 : 0;
}

int cmd_chat(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    chat_opts c = { NULL, 512 };
    opt_group g[] = { { chat_defs, &c, NULL }, CLI_MODEL(&o), CLI_POLICY(&o), CLI_SAMPLING(&o) };
    char err[1400];
    if (config_read_answer_settings(g, 4, err, sizeof err)) {   /* the settings file's, then the command line's */
        cli_err("%s", err);
        return 1;
    }
    int r = cli_parse(argc, argv, "kvchat [chat] [-m MODEL] [--system TEXT] [-n MAX_ANSWER_TOKENS] [options]",
                      "A line-oriented chat in the terminal: /quit or Ctrl-D leaves, Ctrl-C stops an answer.", g, 4,
                      NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
    if (cli_finish_common(&o)) return 1;
    session *s = cli_session(&o, c.n_predict, SESS_FORMAT_CHAT);
    if (!s) return 1;
    int show = 0;
    sess_callbacks cb = cli_print_callbacks(&show);
    sess_set_callbacks(s, &cb, &cli_interrupted);
    const model *m = run_model(sess_run(s));
    convo cv = { 0 };
    int rc = 1;
    if (c.system && convo_add(&cv, "system", c.system)) goto oom;
    int tty = isatty(STDIN_FILENO);
    if (tty) {
        char name[800], dev[128];
        text_escape(m->name[0] ? m->name : m->path, name, sizeof name, 0);
        run_device(sess_run(s), dev, sizeof dev);
        fprintf(stderr, "kvchat: %s (%s template, context %lld) on %s. Type a message; /quit or Ctrl-D leaves.\n",
                name, chat_family_name(chat_family_for(m->gguf)), (long long)run_n_ctx(sess_run(s)), dev);
    }
    char *line = NULL;
    size_t lcap = 0;
    cli_catch_stop_signals();
    cli_stop_on_closed_output();
    for (;;) {
        if (tty) fputs("\n> ", stdout);
        fflush(stdout);
        cli_interrupted = 0;
        ssize_t got = getline(&line, &lcap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (tok_utf8_invalid_at(line, (size_t)got) >= 0) {
            cli_err("chat: the message is not valid UTF-8");
            continue;
        }
        if (convo_add(&cv, "user", line)) goto oom;
        int t = turn(s, &cv, c.n_predict);
        if (t < 0) goto oom;
        if (t > 0) free((char *)cv.msgs[--cv.n].content);   /* the turn did not happen */
        if (cli_interrupted && cli_interrupted != SIGINT) break;   /* SIGTERM, SIGHUP: leave, not just stop */
    }
    free(line);
    rc = cli_interrupted && cli_interrupted != SIGINT ? cli_interrupt_status() : 0;
    goto done;
oom:
    cli_err("chat: out of memory");
done:
    convo_free(&cv);
    sess_free(s);
    return rc;
}
