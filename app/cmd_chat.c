/* cmd_chat.c - `kvchat chat`: a line-oriented chat in the terminal (what `kvchat` runs by default).
 *
 * Every turn the whole conversation is rendered with the model's chat template and tokenized; the
 * KV cache is reused for the longest prefix it already holds, so only the new turn is prefilled.
 * Ctrl-C stops the current answer; Ctrl-D (end of input) or /quit leaves. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/chat.h"
#include "app/cli.h"
#include "app/commands.h"
#include "engine/tokenizer.h"

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

int cmd_chat(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    const char *system = NULL;
    int64_t n_predict = 512;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_common(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--system")) {
            if (!(system = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-n")) {
            const char *v = cli_need_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 1 << 20, &n_predict)) return 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs("usage: kvchat [chat] [-m MODEL] [--system TEXT] [-n MAX_ANSWER_TOKENS] [--temp T] [--top-k K]\n"
                  "                   [--top-p P] [--min-p P] [--seed S] [--threads T] [--ctx N]\n",
                  stderr);
            return 0;
        } else {
            cli_err("chat: unknown option %s", a);
            return 1;
        }
    }
    cli_runtime rt;
    if (cli_open(&rt, &o, 1) != 0) return 1;
    int32_t nv = rt.m->hp.n_vocab;
    enum chat_family fam = chat_family_for(rt.m->gguf);
    float *logits = malloc(sizeof(float) * (size_t)nv);
    int32_t *cached = malloc(sizeof(int32_t) * (size_t)fwd_n_ctx(rt.f));
    samp *s = samp_create(&o.sp, nv);
    convo cv = { 0 };
    int rc = 1;
    if (!logits || !cached || !s) {
        cli_err("chat: out of memory");
        goto done;
    }
    if (system && convo_add(&cv, "system", system)) goto oom;
    int tty = isatty(STDIN_FILENO);
    if (tty)
        fprintf(stderr, "kvchat: %s (%s template, context %lld). Type a message; /quit or Ctrl-D leaves.\n",
                rt.m->name[0] ? rt.m->name : rt.m->path, chat_family_name(fam), (long long)fwd_n_ctx(rt.f));
    int64_t n_cached = 0;
    char *line = NULL;
    size_t lcap = 0;
    cli_install_sigint();
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
        char err[512];
        char *text = chat_render(fam, cv.msgs, cv.n, 1, err, sizeof err);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (!text || tok_encode(rt.m->vocab, text, strlen(text), 0, 1, &ids, &n_ids, err, sizeof err)) {
            cli_err("chat: %s", err);
            free(text);
            free((char *)cv.msgs[--cv.n].content);
            continue;
        }
        free(text);
        if ((int64_t)n_ids + 16 >= fwd_n_ctx(rt.f)) {
            cli_err("chat: the conversation (%zu tokens) no longer fits in the context of %lld; start a new one",
                    n_ids, (long long)fwd_n_ctx(rt.f));
            free(ids);
            free((char *)cv.msgs[--cv.n].content);
            continue;
        }
        /* Reuse the cached prefix; at least the last token is always evaluated to get logits. */
        int64_t common = 0;
        while (common < n_cached && common < (int64_t)n_ids - 1 && cached[common] == ids[common]) common++;
        /* sliding-window layers keep what a rewind to this turn's start needs; a rewind further
         * back than that restarts from an earlier position, and the cached ids replay from there */
        common = fwd_rewind(rt.f, common);
        fwd_set_floor(rt.f, common);
        if (fwd_eval(rt.f, ids + common, (int64_t)n_ids - common, logits, NULL, NULL, NULL, NULL, &cli_interrupted,
                     err, sizeof err)) {
            cli_err("chat: %s", err);
            n_cached = fwd_pos(rt.f);
            free(ids);
            free((char *)cv.msgs[--cv.n].content);
            continue;
        }
        memcpy(cached, ids, n_ids * sizeof *ids);
        n_cached = (int64_t)n_ids;
        free(ids);
        /* Generate the answer. */
        size_t acap = 1024, alen = 0;
        char *answer = malloc(acap);
        if (!answer) goto oom;
        tok_stream ts;
        tok_stream_init(&ts, rt.m->vocab);
        char piece[512];
        for (int64_t g = 0; g < n_predict && !cli_interrupted; g++) {
            int32_t id = samp_sample(s, logits);
            if (tok_is_eog(rt.m->vocab, id)) break;
            samp_accept(s, id);
            size_t w = tok_stream_feed(&ts, id, piece, sizeof piece);
            fwrite(piece, 1, w, stdout);
            fflush(stdout);
            if (alen + w + 1 > acap) {
                acap = (alen + w + 1) * 2;
                char *na = realloc(answer, acap);
                if (!na) {
                    free(answer);
                    goto oom;
                }
                answer = na;
            }
            memcpy(answer + alen, piece, w);
            alen += w;
            if (fwd_pos(rt.f) + 1 >= fwd_n_ctx(rt.f)) break;
            if (fwd_decode(rt.f, id, logits, NULL, err, sizeof err)) break;
            cached[n_cached++] = id;
        }
        size_t w = tok_stream_flush(&ts, piece, sizeof piece);
        fwrite(piece, 1, w, stdout);
        memcpy(answer + alen, piece, w < acap - alen - 1 ? w : 0);
        alen += w < acap - alen - 1 ? w : 0;
        answer[alen] = 0;
        fputc('\n', stdout);
        if (convo_add(&cv, "assistant", answer)) {
            free(answer);
            goto oom;
        }
        free(answer);
    }
    free(line);
    rc = 0;
    goto done;
oom:
    cli_err("chat: out of memory");
done:
    convo_free(&cv);
    samp_free(s);
    free(cached);
    free(logits);
    cli_close(&rt);
    return rc;
}
