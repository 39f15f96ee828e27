/* browser.c - the session browser (see browser.h). */
#include "ui/browser.h"

#include <errno.h>
#include <inttypes.h>
#include <ncurses.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/files.h"
#include "common/text.h"
#include "store/persist.h"
#include "ui/pickers.h"

static const char *base(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void add_session(void *ud, const store_session *ss)
{
    browser *b = ud;
    store_session *n = realloc(b->ss, sizeof *n * (size_t)(b->n_ss + 1));
    if (!n) return;
    b->ss = n;
    b->ss[b->n_ss++] = *ss;
}

/* A search hit: its session, once. */
static void add_hit(void *ud, int64_t sid, int64_t message, const char *snippet)
{
    (void)message;
    (void)snippet;
    browser *b = ud;
    for (int i = 0; i < b->n_ss; i++)
        if (b->ss[i].id == sid) return;
    store_session ss;
    if (store_session_get(b->db, sid, &ss) == 0) add_session(b, &ss);
}

static void count_session(void *ud, const store_session *ss)
{
    (void)ss;
    (*(int *)ud)++;
}

/* The title: how many sessions the list shows (of how many, under a search), and the database's
 * size against its limit with what the limit pruned. */
static void set_title(browser *b, int total)
{
    char count[300], usage[200] = "";
    if (b->m.filter[0]) {
        char q[200];
        text_escape(b->m.filter, q, sizeof q, 0);
        snprintf(count, sizeof count, "%d of %d session%s match '%s'", b->n_ss, total, total == 1 ? "" : "s", q);
    } else {
        snprintf(count, sizeof count, "%d session%s", b->n_ss, b->n_ss == 1 ? "" : "s");
    }
    store_usage u;
    if (b->db && store_usage_get(b->db, &u) == 0) {
        char used[32], lim[32];
        human_size(u.used, used, sizeof used);
        human_size(u.limit, lim, sizeof lim);
        snprintf(usage, sizeof usage, " | db %s of %s%s, %" PRId64 " pruned", used, u.limit ? lim : "no",
                 " limit", u.pruned);
    }
    snprintf(b->m.title, sizeof b->m.title, "Sessions: %.90s%.58s", count, usage);   /* 160 bytes at most */
}

/* The rows again, for the current search text. */
static void fill(browser *b)
{
    int64_t keep = menu_tag(&b->m);
    menu_clear(&b->m);
    free(b->ss);
    b->ss = NULL;
    b->n_ss = 0;
    if (!b->db) return;
    int total = 0;
    int rc = store_session_list(b->db, b->m.filter[0] ? count_session : add_session, b->m.filter[0] ? (void *)&total : b);
    if (!rc && b->m.filter[0]) rc = store_search(b->db, b->m.filter, add_hit, b);
    if (rc) menu_say(&b->m, 1, "%s", store_error(b->db));
    if (b->n_ss > 0)   /* a heading (tag < 0: never selected) over the columns below */
        menu_add(&b->m, -1, "%5s  %-20s  %-16s  %-14s  %-18s %4s %10s  %s", "id", "title", "document", "model",
                 "policy", "msgs", "stored", "updated");
    for (int i = 0; i < b->n_ss; i++) {
        const store_session *s = &b->ss[i];
        char when[32];
        time_t tt = (time_t)s->updated;
        struct tm tm;
        localtime_r(&tt, &tm);
        strftime(when, sizeof when, "%b %d %H:%M", &tm);
        /* columns by display width, control characters shown escaped */
        char title[96], doc[80], mod[64], pol[80];
        text_fit(s->title, 20, title, sizeof title);
        text_fit(s->doc_title[0] ? s->doc_title : "-", 16, doc, sizeof doc);
        text_fit(base(s->model_path), 14, mod, sizeof mod);
        text_fit(s->policy, 18, pol, sizeof pol);
        menu_add(&b->m, s->id, "%5" PRId64 "  %s  %s  %s  %s %4" PRId64 " %6.1f MiB  %s", s->id, title, doc, mod,
                 pol, s->n_messages, (double)s->snapshot_bytes / (1 << 20), when);
    }
    menu_select_tag(&b->m, keep >= 0 ? keep : -2);   /* -2: no row's tag, so the first session */
    set_title(b, b->m.filter[0] ? total : b->n_ss);
}

void browser_open(browser *b, const char *db_path)
{
    browser_close(b);
    menu_init(&b->m, "Sessions",   /* set_title says how many, and the database's size */
              "Enter resume   type to search   ^R rename   ^E export Markdown   Del delete   Esc close", 1);
    if (db_path) {
        char err[1200];
        b->db = store_open(db_path, err, sizeof err);
        if (!b->db) menu_say(&b->m, 1, "%s", err);
    } else {
        menu_say(&b->m, 1, "no session database: nothing is saved (--no-db)");
    }
    fill(b);
}

void browser_close(browser *b)
{
    menu_free(&b->m);
    store_close(b->db);
    free(b->ss);
    memset(b, 0, sizeof *b);
}

static const store_session *selected(const browser *b)
{
    int64_t id = menu_tag(&b->m);
    for (int i = 0; i < b->n_ss; i++)
        if (b->ss[i].id == id) return &b->ss[i];
    return NULL;
}

/* The session as Markdown in the current directory (or the data directory when that is not
 * writable), replacing an earlier export through a temporary file (a link there is replaced, never
 * followed); says the full path. */
static void export(browser *b, const store_session *s)
{
    char path[1024], dir[1024], err[1400], shown[2100];
    files_atomic fa;
    snprintf(path, sizeof path, "kvchat-session-%" PRId64 ".md", s->id);
    int bad = files_atomic_open(&fa, path, err, sizeof err);
    if (bad && store_data_dir(dir, sizeof dir, 1) == 0) {
        snprintf(path, sizeof path, "%.900s/kvchat-session-%" PRId64 ".md", dir, s->id);
        bad = files_atomic_open(&fa, path, err, sizeof err);
    }
    if (bad) {
        menu_say(&b->m, 1, "cannot export: %s", err);
        return;
    }
    if (store_export_md(b->db, s, fa.f, err, sizeof err)) {
        files_atomic_abort(&fa);
        menu_say(&b->m, 1, "export failed: %s", err);
        return;
    }
    if (files_atomic_commit(&fa, err, sizeof err)) {
        menu_say(&b->m, 1, "export failed: %s", err);
        return;
    }
    files_absolute(path, shown, sizeof shown);
    menu_say(&b->m, 0, "session %" PRId64 " exported to %s", s->id, shown);
}

/* A delete waiting for its answer: y deletes, n or Esc keeps, each at once (no Enter); other keys
 * wait. */
static void confirm_key(browser *b, int ch, int is_key)
{
    if (is_key || ch <= 0 || ch > 127 || !strchr("yYnN\033", ch)) return;
    int64_t id = b->confirm;
    b->confirm = 0;
    b->m.editing = 0;
    if (ch != 'y' && ch != 'Y') {
        menu_say(&b->m, 0, "not deleted");
    } else if (store_session_delete(b->db, id)) {
        menu_say(&b->m, 1, "%s", store_error(b->db));
    } else {
        menu_say(&b->m, 0, "session %" PRId64 " deleted", id);
        fill(b);
    }
}

int browser_key(browser *b, ui_worker *w, int64_t current_session, int ch, int is_key)
{
    if (b->confirm) {
        confirm_key(b, ch, is_key);
        return 0;
    }
    int r = menu_key(&b->m, ch, is_key);
    const store_session *s = selected(b);
    switch (r) {
    case MENU_CLOSE: return 1;
    case MENU_FILTER: fill(b); return 0;
    case MENU_PICK: {
        if (!s) return 0;
        char key[32];
        snprintf(key, sizeof key, "%" PRId64, s->id);
        if (s->id == current_session) return 1;   /* already the open one */
        if (uw_resume(w, key)) {
            menu_say(&b->m, 1, "busy: wait for the current job or press Ctrl-C");
            return 0;
        }
        return 1;
    }
    case MENU_EDIT_DONE:
        if (b->renaming) {
            if (!b->m.edit[0]) {
                menu_say(&b->m, 1, "a title cannot be empty");
            } else if (store_session_rename(b->db, b->renaming, b->m.edit)) {
                menu_say(&b->m, 1, "%s", store_error(b->db));
            } else {
                menu_say(&b->m, 0, "session %" PRId64 " renamed", b->renaming);
                fill(b);
            }
        }
        b->renaming = 0;
        return 0;
    case MENU_UNHANDLED:
        if (!s || !b->db) return 0;
        if (!is_key && ch == 18) {   /* ^R */
            b->renaming = s->id;
            menu_prompt(&b->m, "new title", s->title);
        } else if (!is_key && ch == 5) {   /* ^E */
            export(b, s);
        } else if ((is_key && ch == KEY_DC) || (!is_key && ch == 24)) {   /* Del or ^X */
            if (s->id == current_session) {
                menu_say(&b->m, 1, "session %" PRId64 " is the open conversation: open another before deleting it",
                         s->id);
            } else {
                b->confirm = s->id;
                char label[96];
                snprintf(label, sizeof label, "delete session %" PRId64 " with its messages and snapshots? y/n", s->id);
                menu_prompt(&b->m, label, "");   /* answered by one key: confirm_key */
            }
        }
        return 0;
    default: return 0;
    }
}

void browser_draw(browser *b, const menu_attrs *a)
{
    const store_session *s = selected(b);
    if (s) {
        char name[200], path[400], last[400];
        text_escape(s->name, name, sizeof name, 0);
        text_escape(s->doc_path[0] ? s->doc_path : "(no document)", path, sizeof path, 0);
        text_escape(s->last_message[0] ? s->last_message : "-", last, sizeof last, 0);
        snprintf(b->m.detail, sizeof b->m.detail, "%s%.60s%s%.200s | last: %.160s", s->name[0] ? "name " : "", name,
                 s->name[0] ? " | " : "", path, last);
    }
    else
        b->m.detail[0] = 0;
    menu_draw(&b->m, a);
}
