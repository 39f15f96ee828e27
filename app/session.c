/* session.c - sessions in the store, for ask (and the TUI). */
#include "app/session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/chat.h"
#include "engine/snapshot.h"
#include "engine/tokenizer.h"

store *sess_db_open(const char *path)
{
    char def[1024], err[1200];
    if (!path) {
        if (store_default_path(def, sizeof def, 1)) {
            cli_err("no place for the session database (set HOME or XDG_DATA_HOME, or give --db PATH)");
            return NULL;
        }
        path = def;
    }
    store *db = store_open(path, err, sizeof err);
    if (!db) cli_err("%s", err);
    return db;
}

/* sha256 over every vocabulary piece: two files with the same tokenizer share it */
static void tokenizer_hash(const model *m, char out[65])
{
    int32_t n = tok_n_vocab(m->vocab);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (int32_t i = 0; buf && i < n; i++) {
        const char *p = tok_piece(m->vocab, i);
        size_t k = p ? strlen(p) + 1 : 1;
        if (len + k > cap) {
            char *nb = realloc(buf, cap * 2 + k);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap = cap * 2 + k;
        }
        memcpy(buf + len, p ? p : "", k);
        len += k;
    }
    snap_sha256_bytes(buf ? buf : "", buf ? len : 0, out);
    free(buf);
}

int sess_model(store *db, const char *model_path, const model *m, int64_t *id, char sha[65])
{
    struct stat st;
    char err[600];
    if (stat(model_path, &st) != 0) {
        cli_err("cannot stat %s", model_path);
        return -1;
    }
    int rc = store_model_cached_sha(db, model_path, (int64_t)st.st_size, (int64_t)st.st_mtime, sha);
    if (rc < 0) {
        cli_err("%s", store_error(db));
        return -1;
    }
    if (rc == 1 && snap_sha256_file(model_path, sha, err, sizeof err)) {
        cli_err("%s", err);
        return -1;
    }
    char tk[65];
    tokenizer_hash(m, tk);
    if (store_model_put(db, model_path, (int64_t)st.st_size, (int64_t)st.st_mtime, sha, m->arch_name, tk, m->name, id)) {
        cli_err("%s", store_error(db));
        return -1;
    }
    return 0;
}

int sess_document(store *db, int64_t model_id, const char *path, const char *text, size_t len, int64_t n_tokens,
                  int64_t *id)
{
    char sha[65];
    snap_sha256_bytes(text, len, sha);
    const char *base = strrchr(path, '/');
    if (store_document_put(db, model_id, path, sha, base ? base + 1 : path, n_tokens, id)) {
        cli_err("%s", store_error(db));
        return -1;
    }
    return 0;
}

void sess_prefill_key(const pol_spec *spec, char *buf, size_t cap)
{
    /* the spec text lists the prefill policy first when there is one: "take:...+chess" */
    snprintf(buf, cap, "full");
    for (int i = 0; i < spec->n; i++) {
        if (spec->ops[i]->stage != POL_STAGE_PREFILL) continue;
        const char *plus = strchr(spec->text, '+');
        size_t n = plus ? (size_t)(plus - spec->text) : strlen(spec->text);
        snprintf(buf, cap, "%.*s", (int)n, spec->text);
    }
}

int sess_continue_tokens(const cli_runtime *rt, int chat, const char *question, int32_t **ids, size_t *n, char *err,
                         size_t errlen)
{
    char *text;
    if (chat) {
        text = chat_continue(chat_family_for(rt->m->gguf), question);
    } else {
        size_t L = strlen(question) + 32;
        text = malloc(L);
        if (text) snprintf(text, L, "\nQuestion: %s\nAnswer:", question);
    }
    if (!text) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = tok_encode(rt->m->vocab, text, strlen(text), 0, chat, ids, n, err, errlen) ? -1 : 0;
    free(text);
    return rc;
}

int sess_full_tokens(const cli_runtime *rt, int chat, const char *doc, const store_message *path, int n_path,
                     const char *question, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    /* the turns along path: user, assistant, user, ... (a trailing unanswered question is skipped) */
    int turns = n_path - (n_path % 2);
    if (chat) {
        chat_msg *msgs = calloc((size_t)turns + 1, sizeof *msgs);
        char *first = NULL;
        if (!msgs) goto oom;
        for (int i = 0; i < turns; i++) msgs[i] = (chat_msg){ path[i].role, path[i].text };
        const char *q0 = turns ? path[0].text : question;
        size_t L = strlen(doc) + strlen(q0) + 3;
        if (!(first = malloc(L))) {
            free(msgs);
            goto oom;
        }
        snprintf(first, L, "%s\n\n%s", doc, q0);
        msgs[0] = (chat_msg){ "user", first };
        if (turns) msgs[turns] = (chat_msg){ "user", question };
        char *r = chat_render(chat_family_for(rt->m->gguf), msgs, (size_t)turns + (turns ? 1 : 1), 1, err, errlen);
        free(msgs);
        free(first);
        if (!r) return -1;
        int rc = tok_encode(rt->m->vocab, r, strlen(r), 0, 1, ids, n, err, errlen) ? -1 : 0;
        free(r);
        return rc;
    }
    size_t L = strlen(doc) + strlen(question) + 64;
    for (int i = 0; i < turns; i++) L += strlen(path[i].text) + 32;
    char *t = malloc(L);
    if (!t) goto oom;
    size_t o = (size_t)snprintf(t, L, "%s\n", doc);
    for (int i = 0; i < turns; i += 2)
        o += (size_t)snprintf(t + o, L - o, "%sQuestion: %s\nAnswer:%s", i ? "\n" : "\n", path[i].text, path[i + 1].text);
    snprintf(t + o, L - o, "%sQuestion: %s\nAnswer:", turns ? "\n" : "\n", question);
    int rc = tok_encode(rt->m->vocab, t, strlen(t), tok_add_bos(rt->m->vocab), 0, ids, n, err, errlen) ? -1 : 0;
    free(t);
    return rc;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

int sess_export_md(store *db, const store_session *ss, FILE *f, char *err, size_t errlen)
{
    int64_t leaf;
    store_message *m = NULL;
    int n = 0;
    if (store_latest_message(db, ss->id, &leaf) || (leaf && store_message_path(db, leaf, &m, &n))) {
        snprintf(err, errlen, "%s", store_error(db));
        return -1;
    }
    fprintf(f, "# %s\n\n- model: `%s`\n- document: %s (`%s`)\n- policy: `%s`%s%s%s\n\n", ss->title,
            base_name(ss->model_path), ss->doc_title, ss->doc_path, ss->policy, ss->budget[0] ? ", budget `" : "",
            ss->budget, ss->budget[0] ? "`" : "");
    for (int i = 0; i < n; i++)
        fprintf(f, "## %s\n\n%s\n\n", !strcmp(m[i].role, "user") ? "Question" : "Answer", m[i].text);
    store_messages_free(m, n);
    if (fflush(f) || ferror(f)) {
        snprintf(err, errlen, "writing the export failed: %s", strerror(errno));
        return -1;
    }
    return 0;
}
