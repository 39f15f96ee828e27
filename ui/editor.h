/* editor.h - the interface's input: multi-line text with a cursor, the readline keys, history.
 *
 * Keys follow readline: Ctrl-A/E the line's start and end, Ctrl-K/U kill to its end and start,
 * Ctrl-W and Alt-Backspace the word before, Alt-D the word after, Ctrl-Y yanks, Alt-B/F move by
 * words, Up/Down move between lines and through the history at the first and last line, Ctrl-R
 * searches the history backwards. Alt-Enter and Ctrl-J insert a newline; Enter submits. Pasted text
 * is inserted as it is (the caller feeds it with ed_insert). No drawing here: ed_layout says where
 * each character goes, so the screen draws it (and tests can check it without a terminal). */
#ifndef KVCHAT_UI_EDITOR_H
#define KVCHAT_UI_EDITOR_H

#include <stddef.h>

#define ED_MAX 8192
#define ED_HISTORY_MAX 1000      /* entries kept, in memory and in the history file */

typedef struct editor {
    char buf[ED_MAX];
    size_t len, cur;             /* bytes of text, the cursor's byte offset */
    char **hist;                 /* submitted texts, oldest first */
    int n_hist, hist_pos;        /* hist_pos == n_hist: the text being typed */
    char draft[ED_MAX];          /* the text being typed, while the history is browsed */
    char kill[ED_MAX];           /* the last killed text (Ctrl-Y) */
    int searching;               /* Ctrl-R: the pattern is typed, the match shown */
    char pat[256];
    int match;                   /* the history entry matching pat (-1: none) */
    char before_search[ED_MAX];
} editor;

enum { ED_NONE, ED_SUBMIT, ED_UNHANDLED };

/* Keys: ch is a character (is_key 0) or an ncurses key code (is_key 1); alt: Escape came first. */
int ed_key(editor *e, int ch, int is_key, int alt);
/* Insert text at the cursor as typed (a paste: newlines stay newlines). */
void ed_insert(editor *e, const char *s, size_t n);
void ed_set(editor *e, const char *s);
void ed_clear(editor *e);
void ed_history_add(editor *e, const char *s);
void ed_free(editor *e);

/* The history file: $XDG_STATE_HOME/kvchat/history (~/.local/state/kvchat/history), one entry a
 * line, a newline in an entry written \n and a backslash \\. 0, or -1 when neither XDG_STATE_HOME
 * nor HOME is set. */
int ed_history_path(char *buf, size_t cap);
/* Add the file's entries (the newest ED_HISTORY_MAX) before this session's, escaped as everywhere
 * kvchat prints (a control character in the file is shown as \xNN, never sent to the terminal). A
 * missing file is no error; a link, FIFO or device there is refused unread. 0, or -1 with a message. */
int ed_history_load(editor *e, const char *path, char *err, size_t errlen);
/* Write the newest ED_HISTORY_MAX entries to path whole (a temporary file renamed over it: a link
 * there is replaced, never followed), making its directory. 0, or -1 with a message. */
int ed_history_save(const editor *e, const char *path, char *err, size_t errlen);

/* Typed bytes into characters. The terminal sends UTF-8; an invalid byte becomes U+FFFD on its
 * own and never takes the bytes after it with it (a broken sequence ends where a byte cannot
 * continue it, and that byte starts afresh). */
typedef struct ed_utf8 {
    unsigned cp;                 /* the character so far */
    int need;                    /* continuation bytes still to come */
    unsigned min;                /* the smallest character of this length (longer forms are invalid) */
} ed_utf8;
/* Feed one byte (0..255): the characters it completes go to out (0, 1 or 2 of them). */
int ed_utf8_feed(ed_utf8 *d, int byte, unsigned out[2]);

/* The rows text takes at width cells (a row holds width - 1, its last cell is the cursor's), and
 * the row and column of the cursor. row_start (may be NULL) gets each row's first byte, up to
 * max_rows of them. */
int ed_layout(const char *text, size_t len, size_t cur, int width, size_t *row_start, int max_rows, int *cur_row,
              int *cur_col);
/* Display cells of the UTF-8 character at s (0 for a combining mark, 2 for a wide one). */
int ed_cells(const char *s, int *bytes);

#endif
