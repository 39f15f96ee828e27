/* editor.c - the input's text, cursor, readline keys and history (see editor.h). */
#define _XOPEN_SOURCE_EXTENDED 1
#include "ui/editor.h"

#include <errno.h>
#include <ncurses.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <wchar.h>

#include "common/files.h"
#include "common/text.h"

static int cont(unsigned char c) { return (c & 0xC0) == 0x80; }

int ed_cells(const char *s, int *bytes)
{
    mbstate_t st;
    memset(&st, 0, sizeof st);
    wchar_t wc;
    size_t k = mbrtowc(&wc, s, 4, &st);
    if (k == (size_t)-1 || k == (size_t)-2 || k == 0) {
        *bytes = 1;
        return 1;
    }
    *bytes = (int)k;
    if (wc < 0x20 || wc == 0x7f) return 2;   /* the terminal draws a C0 control or DEL as ^X: two cells */
    int w = wcwidth(wc);
    return w < 0 ? 1 : w;
}

static size_t prev_char(const editor *e, size_t at)
{
    while (at > 0 && cont((unsigned char)e->buf[--at])) {}
    return at;
}

static size_t next_char(const editor *e, size_t at)
{
    if (at < e->len) at++;
    while (at < e->len && cont((unsigned char)e->buf[at])) at++;
    return at;
}

static size_t line_start(const editor *e, size_t at)
{
    while (at > 0 && e->buf[at - 1] != '\n') at--;
    return at;
}

static size_t line_end(const editor *e, size_t at)
{
    while (at < e->len && e->buf[at] != '\n') at++;
    return at;
}

static int word_char(char c) { return c != ' ' && c != '\n' && c != '\t'; }

static size_t word_back(const editor *e, size_t at)
{
    while (at > 0 && !word_char(e->buf[at - 1])) at--;
    while (at > 0 && word_char(e->buf[at - 1])) at--;
    return at;
}

static size_t word_forward(const editor *e, size_t at)
{
    while (at < e->len && !word_char(e->buf[at])) at++;
    while (at < e->len && word_char(e->buf[at])) at++;
    return at;
}

/* Remove [a, b), keeping it for Ctrl-Y when kill. */
static void cut(editor *e, size_t a, size_t b, int kill)
{
    if (b <= a) return;
    if (kill) {
        size_t n = b - a < sizeof e->kill - 1 ? b - a : sizeof e->kill - 1;
        memcpy(e->kill, e->buf + a, n);
        e->kill[n] = 0;
    }
    memmove(e->buf + a, e->buf + b, e->len - b + 1);
    e->len -= b - a;
    e->cur = a;
}

void ed_insert(editor *e, const char *s, size_t n)
{
    if (e->len + n >= sizeof e->buf) {   /* what fits, in whole characters */
        n = sizeof e->buf - 1 - e->len;
        while (n > 0 && cont((unsigned char)s[n])) n--;
    }
    memmove(e->buf + e->cur + n, e->buf + e->cur, e->len - e->cur + 1);
    memcpy(e->buf + e->cur, s, n);
    e->cur += n;
    e->len += n;
}

void ed_set(editor *e, const char *s)
{
    e->len = e->cur = 0;
    e->buf[0] = 0;
    ed_insert(e, s ? s : "", s ? strlen(s) : 0);
}

void ed_clear(editor *e)
{
    e->len = e->cur = 0;
    e->buf[0] = 0;
    e->hist_pos = e->n_hist;
}

void ed_history_add(editor *e, const char *s)
{
    if (!*s || (e->n_hist > 0 && !strcmp(e->hist[e->n_hist - 1], s))) {
        e->hist_pos = e->n_hist;
        return;
    }
    char **nh = realloc(e->hist, sizeof *nh * (size_t)(e->n_hist + 1));
    char *d = strdup(s);
    if (!nh || !d) {
        free(d);
        if (nh) e->hist = nh;
        return;
    }
    e->hist = nh;
    e->hist[e->n_hist++] = d;
    if (e->n_hist > ED_HISTORY_MAX) {   /* the oldest goes */
        free(e->hist[0]);
        memmove(e->hist, e->hist + 1, sizeof *e->hist * (size_t)--e->n_hist);
    }
    e->hist_pos = e->n_hist;
}

int ed_history_path(char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(buf, cap, "%s/kvchat/history", xdg);
    else if (home && *home)
        snprintf(buf, cap, "%s/.local/state/kvchat/history", home);
    else
        return -1;
    return 0;
}

/* A history file holds at most ED_HISTORY_MAX entries of at most ED_MAX bytes (escaped: twice). */
#define HISTORY_MAX_BYTES ((size_t)ED_HISTORY_MAX * ED_MAX * 2)

int ed_history_load(editor *e, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) != 0) return 0;   /* nothing yet */
    if (S_ISLNK(st.st_mode)) {
        snprintf(err, errlen, "%s is a link: the input history is not read through it", path);
        return -1;
    }
    size_t len;
    char *all = files_read_all(path, HISTORY_MAX_BYTES, "a history file", &len, err, errlen);
    if (!all) return errno == ENOENT ? 0 : -1;
    /* the entries typed in this session stay the newest */
    char **mine = e->hist;
    int n_mine = e->n_hist;
    e->hist = NULL;
    e->n_hist = 0;
    static char entry[ED_MAX], shown[ED_MAX];
    for (char *line = all, *next; line < all + len; line = next) {
        char *nl = memchr(line, '\n', (size_t)(all + len - line));
        next = nl ? nl + 1 : all + len;
        size_t k = 0;
        for (char *p = line; p < (nl ? nl : all + len) && k + 1 < sizeof entry; p++) {
            if (*p == '\\' && p + 1 < next && (p[1] == 'n' || p[1] == '\\')) {
                entry[k++] = *++p == 'n' ? '\n' : '\\';
            } else {
                entry[k++] = *p;
            }
        }
        entry[k] = 0;
        text_escape(entry, shown, sizeof shown, TEXT_KEEP_NEWLINE | TEXT_KEEP_TAB);
        ed_history_add(e, shown);
    }
    free(all);
    for (int i = 0; i < n_mine; i++) {
        ed_history_add(e, mine[i]);
        free(mine[i]);
    }
    free(mine);
    e->hist_pos = e->n_hist;
    return 0;
}

int ed_history_save(const editor *e, const char *path, char *err, size_t errlen)
{
    if (files_make_parents(path)) {
        snprintf(err, errlen, "cannot create the directory of %s: %s", path, strerror(errno));
        return -1;
    }
    files_atomic fa;
    if (files_atomic_open(&fa, path, err, errlen)) return -1;
    int from = e->n_hist > ED_HISTORY_MAX ? e->n_hist - ED_HISTORY_MAX : 0;
    for (int i = from; i < e->n_hist; i++) {
        for (const char *p = e->hist[i]; *p; p++) {
            if (*p == '\n') fputs("\\n", fa.f);
            else if (*p == '\\') fputs("\\\\", fa.f);
            else fputc(*p, fa.f);
        }
        fputc('\n', fa.f);
    }
    return files_atomic_commit(&fa, err, errlen);
}

int ed_utf8_feed(ed_utf8 *d, int byte, unsigned out[2])
{
    int n = 0;
    unsigned b = (unsigned)byte & 0xFF;
    if (d->need > 0) {
        if ((b & 0xC0) == 0x80) {
            d->cp = d->cp << 6 | (b & 0x3F);
            if (--d->need > 0) return 0;
            int bad = d->cp < d->min || d->cp > 0x10FFFF || (d->cp >= 0xD800 && d->cp <= 0xDFFF);
            out[0] = bad ? 0xFFFD : d->cp;
            return 1;
        }
        d->need = 0;   /* cut short: the sequence so far is one invalid character, b starts afresh */
        out[n++] = 0xFFFD;
    }
    if (b < 0x80) {
        out[n++] = b;
    } else if (b >= 0xC2 && b <= 0xF4) {
        d->need = b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
        d->cp = b & (b < 0xE0 ? 0x1F : b < 0xF0 ? 0x0F : 0x07);
        d->min = d->need == 1 ? 0x80 : d->need == 2 ? 0x800 : 0x10000;
    } else {
        out[n++] = 0xFFFD;   /* a stray continuation byte, C0, C1 or F5..FF */
    }
    return n;
}

void ed_free(editor *e)
{
    for (int i = 0; i < e->n_hist; i++) free(e->hist[i]);
    free(e->hist);
    e->hist = NULL;
    e->n_hist = e->hist_pos = 0;
}

static void history_step(editor *e, int dir)
{
    int to = e->hist_pos + dir;
    if (to < 0 || to > e->n_hist) return;
    if (e->hist_pos == e->n_hist) snprintf(e->draft, sizeof e->draft, "%s", e->buf);
    e->hist_pos = to;
    ed_set(e, to == e->n_hist ? e->draft : e->hist[to]);
}

/* The newest history entry before 'from' containing pat (-1: none). */
static int search_from(const editor *e, int from)
{
    for (int i = from; i >= 0; i--)
        if (strstr(e->hist[i], e->pat)) return i;
    return -1;
}

static void search_show(editor *e)
{
    e->match = e->pat[0] ? search_from(e, e->n_hist - 1) : -1;
    ed_set(e, e->match >= 0 ? e->hist[e->match] : e->before_search);
}

/* Ctrl-R mode: typed characters narrow the match; Ctrl-R goes further back; Enter takes it and
 * submits; Esc or Ctrl-G go back to the text before; any other key takes it and acts as usual. */
static int search_key(editor *e, int ch, int is_key, int alt)
{
    if (!is_key && !alt && ch == 18) {
        int m = e->match > 0 ? search_from(e, e->match - 1) : -1;
        if (m >= 0) {
            e->match = m;
            ed_set(e, e->hist[m]);
        }
        return ED_NONE;
    }
    if (!is_key && !alt && (ch == 27 || ch == 7)) {
        e->searching = 0;
        ed_set(e, e->before_search);
        return ED_NONE;
    }
    if (!is_key && !alt && ch == 21) {   /* Ctrl-U: the pattern from its start */
        e->pat[0] = 0;
        search_show(e);
        return ED_NONE;
    }
    if ((!is_key && (ch == 127 || ch == 8)) || (is_key && ch == KEY_BACKSPACE)) {
        size_t n = strlen(e->pat);
        while (n > 0 && cont((unsigned char)e->pat[--n])) {}
        e->pat[n] = 0;
        search_show(e);
        return ED_NONE;
    }
    if (!is_key && !alt && ch >= 32 && ch != 127) {
        char mb[8];
        mbstate_t st;
        memset(&st, 0, sizeof st);
        size_t k = wcrtomb(mb, (wchar_t)ch, &st), n = strlen(e->pat);
        if (k != (size_t)-1 && n + k < sizeof e->pat) {
            memcpy(e->pat + n, mb, k);
            e->pat[n + k] = 0;
        }
        search_show(e);
        return ED_NONE;
    }
    e->searching = 0;   /* the match stays as the text; the key acts on it */
    e->hist_pos = e->n_hist;
    return ed_key(e, ch, is_key, alt);
}

int ed_key(editor *e, int ch, int is_key, int alt)
{
    if (e->searching) return search_key(e, ch, is_key, alt);
    if (alt && !is_key) {
        switch (ch) {
        case '\r':
        case '\n': ed_insert(e, "\n", 1); return ED_NONE;
        case 'b': e->cur = word_back(e, e->cur); return ED_NONE;
        case 'f': e->cur = word_forward(e, e->cur); return ED_NONE;
        case 'd': cut(e, e->cur, word_forward(e, e->cur), 1); return ED_NONE;
        case 127:
        case 8: cut(e, word_back(e, e->cur), e->cur, 1); return ED_NONE;
        default: return ED_UNHANDLED;
        }
    }
    if (is_key) {
        switch (ch) {
        case KEY_LEFT: e->cur = prev_char(e, e->cur); return ED_NONE;
        case KEY_RIGHT: e->cur = next_char(e, e->cur); return ED_NONE;
        case KEY_BACKSPACE: cut(e, prev_char(e, e->cur), e->cur, 0); return ED_NONE;
        case KEY_DC: cut(e, e->cur, next_char(e, e->cur), 0); return ED_NONE;
        case KEY_ENTER: return ED_SUBMIT;
        case KEY_UP:
        case KEY_DOWN: {
            /* within the text first; the history from its first or last line */
            size_t ls = line_start(e, e->cur), col = e->cur - ls;
            if (ch == KEY_UP && ls > 0) {
                size_t ps = line_start(e, ls - 1), pe = ls - 1;
                e->cur = ps + col < pe ? ps + col : pe;
                while (e->cur > ps && cont((unsigned char)e->buf[e->cur])) e->cur--;
            } else if (ch == KEY_DOWN && line_end(e, e->cur) < e->len) {
                size_t ns = line_end(e, e->cur) + 1, ne = line_end(e, ns);
                e->cur = ns + col < ne ? ns + col : ne;
                while (e->cur > ns && cont((unsigned char)e->buf[e->cur])) e->cur--;
            } else {
                history_step(e, ch == KEY_UP ? -1 : 1);
            }
            return ED_NONE;
        }
        default: return ED_UNHANDLED;
        }
    }
    switch (ch) {
    case '\r': return ED_SUBMIT;
    case '\n': ed_insert(e, "\n", 1); return ED_NONE;   /* Ctrl-J */
    case 127:
    case 8: return ed_key(e, KEY_BACKSPACE, 1, 0);
    case 1: e->cur = line_start(e, e->cur); return ED_NONE;
    case 5: e->cur = line_end(e, e->cur); return ED_NONE;
    case 11: cut(e, e->cur, line_end(e, e->cur) > e->cur ? line_end(e, e->cur) : next_char(e, e->cur), 1); return ED_NONE;
    case 21: cut(e, line_start(e, e->cur), e->cur, 1); return ED_NONE;
    case 23: cut(e, word_back(e, e->cur), e->cur, 1); return ED_NONE;
    case 25: ed_insert(e, e->kill, strlen(e->kill)); return ED_NONE;
    case 18:
        e->searching = 1;
        e->pat[0] = 0;
        e->match = -1;
        snprintf(e->before_search, sizeof e->before_search, "%s", e->buf);
        return ED_NONE;
    default: break;
    }
    if (ch < 32) return ED_UNHANDLED;
    char mb[8];
    mbstate_t st;
    memset(&st, 0, sizeof st);
    size_t k = wcrtomb(mb, (wchar_t)ch, &st);
    if (k != (size_t)-1) ed_insert(e, mb, k);
    return ED_NONE;
}

int ed_layout(const char *text, size_t len, size_t cur, int width, size_t *row_start, int max_rows, int *cur_row,
              int *cur_col)
{
    if (width < 2) width = 2;
    int row = 0, col = 0;
    if (row_start && max_rows > 0) row_start[0] = 0;
    *cur_row = *cur_col = 0;
    for (size_t i = 0; i <= len;) {
        if (i == cur) {
            *cur_row = row;
            *cur_col = col;
        }
        if (i == len) break;
        int bytes, w = text[i] == '\n' ? 0 : ed_cells(text + i, &bytes);
        if (text[i] == '\n') bytes = 1;
        if (text[i] == '\n' || col + w > width - 1) {
            row++;
            col = 0;
            size_t at = text[i] == '\n' ? i + 1 : i;
            if (row_start && row < max_rows) row_start[row] = at;
            if (text[i] == '\n') {
                i++;
                continue;
            }
            if (i == cur) {
                *cur_row = row;
                *cur_col = 0;
            }
        }
        col += w;
        i += (size_t)bytes;
    }
    return row + 1;   /* a full row leaves its last cell to the cursor */
}
