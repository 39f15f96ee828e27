/* cmd_sessions.c - `kvchat sessions`: list, search, show, export, rename and delete the saved
 * sessions of the store. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "app/cli.h"
#include "app/commands.h"
#include "common/text.h"
#include "store/persist.h"
#include "store/store.h"

typedef struct sessions_opts {
    const char *db;
    int format;                  /* export: 0 md, 1 json */
} sessions_opts;

#define O(field) offsetof(sessions_opts, field)
static const opt_def sessions_defs[] = {
    { "--db", NULL, OPT_STR, O(db), 0, 0, NULL, 0, "PATH", "the session database (default ~/.local/share/kvchat/kvchat.db)",
      NULL },
    { "--format", NULL, OPT_CHOICE, O(format), 0, 0, "md|json", 0, NULL,
      "export: Markdown (the newest branch) or JSON (every message)", NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef O

static void fmt_time(int64_t t, char *buf, size_t cap)
{
    time_t tt = (time_t)t;
    struct tm tm;
    localtime_r(&tt, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M", &tm);
}

static const char *base(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void human_bytes(int64_t b, char *buf, size_t cap)
{
    if (b < 1024)
        snprintf(buf, cap, "%lld B", (long long)b);
    else if (b < (1 << 20))
        snprintf(buf, cap, "%.1f KiB", (double)b / 1024);
    else if (b < (1LL << 30))
        snprintf(buf, cap, "%.1f MiB", (double)b / (1 << 20));
    else
        snprintf(buf, cap, "%.2f GiB", (double)b / (1LL << 30));
}

static void list_one(void *ud, const store_session *ss)
{
    int *n = ud;
    char when[32];
    fmt_time(ss->updated, when, sizeof when);
    if ((*n)++ == 0)
        printf("%5s  %-16s  %-32s  %-24s  %-20s  %-22s  %4s  %8s  %s\n", "id", "name", "title", "document", "model",
               "policy", "msgs", "stored", "updated");
    /* columns by display width, control characters shown escaped */
    char name[80], title[140], doc[100], mod[90], pol[90], last[400];
    text_fit(ss->name[0] ? ss->name : "-", 16, name, sizeof name);
    text_fit(ss->title, 32, title, sizeof title);
    text_fit(ss->doc_title[0] ? ss->doc_title : "-", 24, doc, sizeof doc);
    text_fit(base(ss->model_path), 20, mod, sizeof mod);
    text_fit(ss->policy, 22, pol, sizeof pol);
    char size[32];
    human_bytes(ss->snapshot_bytes, size, sizeof size);
    printf("%5lld  %s  %s  %s  %s  %s  %4lld  %8s  %s\n", (long long)ss->id, name, title, doc, mod, pol,
           (long long)ss->n_messages, size, when);
    if (ss->last_message[0]) {
        text_fit(ss->last_message, 100, last, sizeof last);
        printf("       last: %s\n", last);
    }
}

/* The database's size against its limit, and what the limit pruned: one line under the list. */
static void usage_line(store *db)
{
    store_usage u;
    if (store_usage_get(db, &u)) {
        cli_err("sessions: %s", store_error(db));
        return;
    }
    char used[32], lim[32], file[32];
    human_bytes(u.used, used, sizeof used);
    human_bytes(u.limit, lim, sizeof lim);
    human_bytes(u.file, file, sizeof file);
    printf("db %s of %s%s, %lld snapshot%s, %lld pruned by the limit", used, u.limit ? lim : "no", " limit",
           (long long)u.n_snapshots, u.n_snapshots == 1 ? "" : "s", (long long)u.pruned);
    if (u.file > u.used) printf(" (file %s: the free pages are reused)", file);
    printf("\n");
}

static void search_one(void *ud, int64_t sid, int64_t message, const char *snippet)
{
    int *n = ud;
    (*n)++;
    if (message)
        printf("session %lld, message %lld: ", (long long)sid, (long long)message);
    else
        printf("session %lld (title): ", (long long)sid);
    text_put(stdout, snippet, 0);
    putchar('\n');
}

/* JSON string with the escapes RFC 8259 requires. */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\r')
            fputs("\\r", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else if (*p == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F)   /* a C1 control: escaped, not passed to the terminal */
            fprintf(f, "\\u%04x", *++p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static int find(store *db, const char *key, store_session *ss)
{
    int f = store_session_find(db, key, ss);
    if (f < 0) cli_err("sessions: %s", store_error(db));
    if (f == 1) cli_err("sessions: no session '%s' (kvchat sessions list shows them)", key);
    return f == 0 ? 0 : -1;
}

/* Whether a message replies to message id: a question without one was asked by a process that died
 * (kill -9, a crash) before its answer could be saved. */
static int has_reply(const store_message *m, int n, int64_t id)
{
    for (int i = 0; i < n; i++)
        if (m[i].parent == id) return 1;
    return 0;
}

static int show(store *db, const store_session *ss)
{
    store_message *m;
    int n;
    if (store_session_messages(db, ss->id, &m, &n)) {
        cli_err("sessions: %s", store_error(db));
        return -1;
    }
    char when[32];
    fmt_time(ss->created, when, sizeof when);
    char name[400], title[800], mpath[3100], dtitle[800], dpath[3100], pol[800], bud[100];
    text_escape(ss->name, name, sizeof name, 0);
    text_escape(ss->title, title, sizeof title, 0);
    text_escape(ss->model_path, mpath, sizeof mpath, 0);
    text_escape(ss->doc_title, dtitle, sizeof dtitle, 0);
    text_escape(ss->doc_path, dpath, sizeof dpath, 0);
    text_escape(ss->policy, pol, sizeof pol, 0);
    text_escape(ss->budget, bud, sizeof bud, 0);
    printf("session %lld%s%s%s: %s\nmodel %s\ndocument %s (%s)\npolicy %s%s%s, %s format, created %s, %d messages\n",
           (long long)ss->id, ss->name[0] ? " (" : "", name, ss->name[0] ? ")" : "", title, mpath, dtitle, dpath, pol,
           ss->budget[0] ? ", budget " : "", bud, ss->format, when, n);
    for (int i = 0; i < n; i++) {
        /* a message whose parent is not the one printed just before it starts another branch */
        int branch = i > 0 && m[i].parent != m[i - 1].id;
        char re[48] = "";
        if (m[i].parent) snprintf(re, sizeof re, ", reply to %lld", (long long)m[i].parent);
        char under[300] = "";
        if (!strcmp(m[i].role, "assistant") && m[i].policy[0])
            snprintf(under, sizeof under, ", policy %.256s", m[i].policy);
        printf("\n[%lld%s", (long long)m[i].id, re);
        text_put(stdout, under, 0);
        /* an answer stopped part way (Ctrl-C, SIGTERM, SIGHUP, a closed pipe) says so in its metrics */
        int cut = !strcmp(m[i].role, "assistant") && strstr(m[i].metrics, "\"interrupted\": true");
        printf("] %s%s%s:\n", m[i].role, cut ? " (interrupted)" : "", branch ? " (another branch)" : "");
        text_put(stdout, m[i].text, TEXT_KEEP_NEWLINE | TEXT_KEEP_TAB);
        putchar('\n');
        if (!strcmp(m[i].role, "user") && !has_reply(m, n, m[i].id)) printf("(no answer: interrupted)\n");
    }
    store_messages_free(m, n);
    return 0;
}

static int export_md(store *db, const store_session *ss)
{
    char err[600];
    if (store_export_md(db, ss, stdout, err, sizeof err)) {
        cli_err("sessions: %s", err);
        return -1;
    }
    return 0;
}

static int export_json(store *db, const store_session *ss)
{
    store_message *m;
    int n;
    if (store_session_messages(db, ss->id, &m, &n)) {
        cli_err("sessions: %s", store_error(db));
        return -1;
    }
    printf("{\"id\": %lld, \"name\": ", (long long)ss->id);
    json_str(stdout, ss->name);
    printf(", \"title\": ");
    json_str(stdout, ss->title);
    printf(", \"model\": ");
    json_str(stdout, ss->model_path);
    printf(", \"model_sha256\": ");
    json_str(stdout, ss->model_sha);
    printf(", \"document\": ");
    json_str(stdout, ss->doc_path);
    printf(", \"document_sha256\": ");
    json_str(stdout, ss->doc_sha);
    printf(", \"policy\": ");
    json_str(stdout, ss->policy);
    printf(", \"budget\": ");
    json_str(stdout, ss->budget);
    printf(", \"created\": %lld, \"updated\": %lld, \"messages\": [", (long long)ss->created, (long long)ss->updated);
    for (int i = 0; i < n; i++) {
        printf("%s\n  {\"id\": %lld, \"parent\": ", i ? "," : "", (long long)m[i].id);
        if (m[i].parent)
            printf("%lld", (long long)m[i].parent);
        else
            printf("null");
        printf(", \"role\": ");
        json_str(stdout, m[i].role);
        printf(", \"text\": ");
        json_str(stdout, m[i].text);
        printf(", \"policy\": ");
        json_str(stdout, m[i].policy);
        printf(", \"metrics\": %s, \"created\": %lld}", m[i].metrics[0] ? m[i].metrics : "null", (long long)m[i].created);
    }
    printf("\n]}\n");
    store_messages_free(m, n);
    return 0;
}

int cmd_sessions(int argc, char **argv)
{
    sessions_opts so = { NULL, 0 };
    opt_group g[] = { { sessions_defs, &so, NULL } };
    const char *pos[32];
    int npos = 0;
    int r = cli_parse(argc, argv, "kvchat sessions [--db PATH] COMMAND",
                      "  list                      every session, newest first\n"
                      "  search TEXT               full-text search over messages and session titles\n"
                      "  show ID                   the conversation (every branch, in order)\n"
                      "  export ID [--format md|json]\n"
                      "                            the conversation as Markdown (the newest branch) or JSON\n"
                      "  rename ID TITLE           give a session a new title\n"
                      "  delete ID                 delete a session with its messages and snapshots\n"
                      "  prune [ID]                keep only the snapshots at the end of each branch (of one session)\n"
                      "  vacuum                    give the space of deleted sessions and pruned snapshots back to the disk\n"
                      "  limit [SIZE]              the database's size limit (1G by default; 800M, 2G, off): after each\n"
                      "                            snapshot saved, the oldest snapshots go until it fits (never messages)\n"
                      "\n"
                      "ID is a session's number or its name (kvchat ask --session NAME).",
                      g, 1, pos, 32, &npos);
    if (r) return r > 0 ? 0 : 1;
    const char *db_path = so.db;
    const char *cmd = npos > 0 ? pos[0] : "list";
    int nargs = npos > 0 ? npos - 1 : 0;
    const char **args = pos + 1;
    char default_db[1024] = "";
    if (db_path && cli_check_db_path(db_path)) return 1;
    if (!db_path) store_default_path(default_db, sizeof default_db, 0);
    /* looking at sessions never creates a database: a missing one has none */
    const char *look = db_path ? db_path : default_db[0] ? default_db : NULL;
    struct stat st;
    if (look && stat(look, &st) != 0) {
        if (strcmp(cmd, "list") != 0 && strcmp(cmd, "search") != 0) {
            cli_err("sessions: no session database at %s (kvchat ask --session NAME or kvchat tui makes one)", look);
            return 1;
        }
        printf("no sessions yet: there is no session database at %s\n", look);
        return 0;
    }
    store *db = cli_open_db(db_path);
    if (!db) return 1;
    int rc = 1;
    store_session ss;
    if (!strcmp(cmd, "list")) {
        int n = 0;
        if (store_session_list(db, list_one, &n) == 0) {
            if (n == 0) printf("no sessions yet (kvchat ask -d DOC -q QUESTION --session NAME starts one)\n");
            usage_line(db);
            rc = 0;
        } else {
            cli_err("sessions: %s", store_error(db));
        }
    } else if (!strcmp(cmd, "search")) {
        if (nargs < 1) {
            cli_err("sessions: search needs the text to look for");
        } else {
            char q[1024] = "";
            for (int k = 0; k < nargs; k++) {
                strncat(q, args[k], sizeof q - strlen(q) - 2);
                strncat(q, " ", sizeof q - strlen(q) - 1);
            }
            int n = 0;
            if (store_search(db, q, search_one, &n) == 0) {
                if (n == 0) printf("no matches\n");
                rc = 0;
            } else {
                cli_err("sessions: %s", store_error(db));
            }
        }
    } else if (!strcmp(cmd, "show") || !strcmp(cmd, "export") || !strcmp(cmd, "delete") || !strcmp(cmd, "rename")) {
        if (nargs < 1) {
            cli_err("sessions: %s needs a session id or name", cmd);
        } else if (find(db, args[0], &ss) == 0) {
            if (!strcmp(cmd, "show")) {
                rc = show(db, &ss) ? 1 : 0;
            } else if (!strcmp(cmd, "export")) {
                rc = (so.format == 0 ? export_md(db, &ss) : export_json(db, &ss)) ? 1 : 0;
            } else if (!strcmp(cmd, "delete")) {
                if (store_session_delete(db, ss.id) == 0) {
                    printf("deleted session %lld (", (long long)ss.id);
                    text_put(stdout, ss.title, 0);
                    printf(")\n");
                    rc = 0;
                } else {
                    cli_err("sessions: %s", store_error(db));
                }
            } else if (nargs < 2 || !*args[1]) {
                cli_err("sessions: rename needs the new title");
            } else if (store_session_rename(db, ss.id, args[1]) == 0) {
                printf("session %lld is now '", (long long)ss.id);
                text_put(stdout, args[1], 0);
                printf("'\n");
                rc = 0;
            } else {
                cli_err("sessions: %s", store_error(db));
            }
        }
    } else if (!strcmp(cmd, "prune")) {
        int64_t removed, sid = 0;
        if (nargs >= 1 && find(db, args[0], &ss)) goto out;
        if (nargs >= 1) sid = ss.id;
        if (store_prune(db, sid, &removed) == 0) {
            printf("pruned %lld snapshot%s (each branch keeps the one after its last answer)\n", (long long)removed,
                   removed == 1 ? "" : "s");
            rc = 0;
        } else {
            cli_err("sessions: %s", store_error(db));
        }
    } else if (!strcmp(cmd, "limit")) {
        int64_t bytes;
        char err[300];
        if (nargs < 1) {
            usage_line(db);
            rc = 0;
        } else if (store_size_parse(args[0], &bytes, err, sizeof err)) {
            cli_err("sessions: limit: %s", err);
        } else if (store_limit_set(db, bytes)) {
            cli_err("sessions: %s", store_error(db));
        } else {
            char lim[32];
            human_bytes(bytes, lim, sizeof lim);
            printf("the size limit is now %s%s\n", bytes ? lim : "off",
                   bytes ? " (the oldest snapshots go first after each save; messages are kept)" : "");
            usage_line(db);
            rc = 0;
        }
    } else if (!strcmp(cmd, "vacuum")) {
        struct stat a, b;
        int have = stat(db_path ? db_path : default_db, &a) == 0;
        if (store_vacuum(db) == 0) {
            if (have && stat(db_path ? db_path : default_db, &b) == 0)
                printf("the database went from %.1f MiB to %.1f MiB\n", (double)a.st_size / (1 << 20),
                       (double)b.st_size / (1 << 20));
            rc = 0;
        } else {
            cli_err("sessions: %s", store_error(db));
        }
    } else {
        cli_err("sessions: unknown command '%s' (list, search, show, export, rename, delete, prune, vacuum, limit)", cmd);
    }
out:
    store_close(db);
    return rc;
}
