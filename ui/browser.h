/* browser.h - the session browser: every saved session (title, document, model, policy, messages,
 * last message, date), full-text search as you type, resume, rename, delete and export to
 * Markdown. It reads the database through its own connection, so it works while an answer streams. */
#ifndef KVCHAT_UI_BROWSER_H
#define KVCHAT_UI_BROWSER_H

#include "ui/menu.h"
#include "store/store.h"
#include "ui/worker.h"

typedef struct browser {
    menu m;
    store *db;               /* NULL: nothing is saved (--no-db) */
    store_session *ss;       /* the rows' sessions */
    int n_ss;
    int64_t confirm;         /* a delete waiting for "y" */
    int64_t renaming;
} browser;

/* Open on the database at db_path (NULL: none), listing every session. */
void browser_open(browser *b, const char *db_path);
void browser_close(browser *b);
/* One key. 1 when the browser should close (Esc, or a session was picked: resumed through w). */
int browser_key(browser *b, ui_worker *w, int64_t current_session, int ch, int is_key);
void browser_draw(browser *b, const menu_attrs *a);

#endif
