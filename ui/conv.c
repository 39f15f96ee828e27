/* conv.c - the conversation pane (see conv.h). */
#define _XOPEN_SOURCE_EXTENDED 1
#include "ui/conv.h"

#include <ncurses.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
#include "ui/editor.h"

/* s (n bytes) as the pane shows it, malloc'd: a control character (which the terminal would draw as
 * ^X, in two cells the wrapping did not count, or act on, or take for an event mark) and a byte of
 * no valid UTF-8 as \xNN, like every other text kvchat prints; a tab as four spaces; newlines kept. */
static char *shown(const char *s, size_t n)
{
    char *t = malloc(4 * n + 1), *out = malloc(16 * n + 1);
    if (!t || !out) {
        free(t);
        free(out);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\t') {
            memcpy(t + k, "    ", 4);
            k += 4;
        } else {
            t[k++] = s[i];
        }
    }
    t[k] = 0;
    text_escape(t, out, 16 * n + 1, TEXT_KEEP_NEWLINE);
    free(t);
    return out;
}

/* Text onto entry x as it is shown (marks: s holds MARK_ON/MARK_OFF of its own, kept). */
static void put(conv_entry *x, const char *s, size_t k)
{
    if (x->len + k + 1 > x->cap) {
        size_t nc = (x->len + k + 1) * 2;
        char *nt = realloc(x->text, nc);
        if (!nt) return;
        x->text = nt;
        x->cap = nc;
    }
    memcpy(x->text + x->len, s, k);
    x->len += k;
    x->text[x->len] = 0;
}

/* The bytes an answer entry holds back (the start of a character the next piece completes) go
 * onto it escaped: nothing will complete them. */
static void flush_pending(conv *c)
{
    if (c->n_pend == 0 || c->n == 0) return;
    char *e = shown(c->pend, (size_t)c->n_pend);
    if (e) put(&c->e[c->n - 1], e, strlen(e));
    free(e);
    c->n_pend = 0;
}

static void add_shown(conv *c, int kind, const char *text, int raw)
{
    flush_pending(c);
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 64;
        conv_entry *ne = realloc(c->e, sizeof *ne * (size_t)nc);
        if (!ne) return;
        c->e = ne;
        c->cap = nc;
    }
    conv_entry *x = &c->e[c->n];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    if (!(x->text = raw ? strdup(text) : shown(text, strlen(text)))) return;
    x->len = strlen(x->text);
    x->cap = x->len + 1;
    c->n++;
}

void conv_add(conv *c, int kind, const char *text) { add_shown(c, kind, text, 0); }

/* The length of s's last bytes that begin a UTF-8 character they do not finish (0 to 3). */
static size_t unfinished_tail(const char *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char b = (unsigned char)s[n - back];
        if ((b & 0xC0) == 0x80) continue;   /* a continuation byte: look further back */
        size_t need = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

static void open_answer(conv *c)
{
    if (!c->answering || c->n == 0) {
        add_shown(c, E_ANSWER, "", 1);
        c->answering = 1;
    }
}

void conv_append(conv *c, const char *s)
{
    open_answer(c);
    /* a character may come in two pieces (a token of its first bytes): held back until it is whole */
    size_t k = strlen(s), n = (size_t)c->n_pend + k;
    char *all = malloc(n + 1);
    if (!all) return;
    memcpy(all, c->pend, (size_t)c->n_pend);
    memcpy(all + c->n_pend, s, k + 1);
    size_t tail = unfinished_tail(all, n);
    memcpy(c->pend, all + n - tail, tail);
    c->n_pend = (int)tail;
    char *e = shown(all, n - tail);
    free(all);
    if (e) put(&c->e[c->n - 1], e, strlen(e));
    free(e);
}

void conv_append_mark(conv *c, const char *s)
{
    open_answer(c);
    flush_pending(c);
    char *e = shown(s, strlen(s));
    if (!e) return;
    size_t k = strlen(e);
    char *m = malloc(k + 3);
    if (m) {
        m[0] = MARK_ON;
        memcpy(m + 1, e, k);
        m[k + 1] = MARK_OFF;
        m[k + 2] = 0;
        put(&c->e[c->n - 1], m, k + 2);
    }
    free(m);
    free(e);
}

/* The word (1-based) where b first differs from a, or 0 when they are the same. */
static int first_difference(const char *a, const char *b)
{
    int word = 1;
    for (;;) {
        while (*a == ' ' || *a == '\n') a++;
        while (*b == ' ' || *b == '\n') b++;
        if (!*a && !*b) return 0;
        size_t la = strcspn(a, " \n"), lb = strcspn(b, " \n");
        if (la != lb || memcmp(a, b, la)) return word;
        a += la;
        b += lb;
        word++;
    }
}

void conv_add_compare(conv *c, uw_compared *cmp, int n)
{
    conv_add(c, E_COMPARE, "");
    if (c->n == 0 || c->e[c->n - 1].kind != E_COMPARE) return;
    conv_entry *x = &c->e[c->n - 1];
    x->n_cols = n;
    for (int i = 0; i < n; i++) {
        char head[700], diff[64];
        int d = i ? first_difference(cmp[0].text, cmp[i].text) : 0;
        if (i == 0)
            snprintf(diff, sizeof diff, "the conversation's policy");
        else if (d == 0)
            snprintf(diff, sizeof diff, "same answer as the first");
        else
            snprintf(diff, sizeof diff, "differs from the first at word %d", d);
        snprintf(head, sizeof head, "[%.250s] %.150s; %.60s", cmp[i].policy, cmp[i].figures, diff);
        x->head[i] = shown(head, strlen(head));
        char *t = shown(cmp[i].text, strlen(cmp[i].text));
        if (t) {   /* shown as every answer is */
            free(cmp[i].text);
            cmp[i].text = t;
        }
        x->col[i] = cmp[i].text;   /* taken over */
        if (d > 0) {   /* mark this answer from its first different word on */
            const char *p = cmp[i].text;
            for (int word = 1;; word++) {
                while (*p == ' ' || *p == '\n') p++;
                if (word == d || !*p) break;
                p += strcspn(p, " \n");
            }
            size_t off = (size_t)(p - cmp[i].text), L = strlen(cmp[i].text);
            char *m = malloc(L + 2);
            if (m) {
                memcpy(m, cmp[i].text, off);
                m[off] = MARK_ON;
                memcpy(m + off + 1, cmp[i].text + off, L - off + 1);
                free(cmp[i].text);
                x->col[i] = m;
            }
        }
    }
}

void conv_free(conv *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].text);
        for (int k = 0; k < c->e[i].n_cols; k++) {
            free(c->e[i].head[k]);
            free(c->e[i].col[k]);
        }
    }
    free(c->e);
    memset(c, 0, sizeof *c);
}

const char *conv_answer(const conv *c, int n)
{
    int k = 0, last = -1;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].kind == E_ANSWER) {
            last = i;
            if (++k == n) return c->e[i].text;
        }
    return n == 0 && last >= 0 ? c->e[last].text : NULL;
}

/* ---- wrapping */

int conv_wrap(const char *s, int width, void (*fn)(void *ud, const char *p, int bytes), void *ud)
{
    if (width < 1) width = 1;
    int rows = 0;
    while (*s) {
        const char *p = s, *brk = NULL;
        int cells = 0;
        while (*p && *p != '\n') {
            int bytes, w = (*p == MARK_ON || *p == MARK_OFF) ? 0 : ed_cells(p, &bytes);
            if (*p == MARK_ON || *p == MARK_OFF) bytes = 1;
            if (cells + w > width) break;
            if (*p == ' ') brk = p;
            cells += w;
            p += bytes;
        }
        const char *end = p, *next = p;
        if (*p == ' ') {                      /* the row ends just before a space: break there */
            next = p + 1 + (p[1] == '\n');
        } else if (*p && *p != '\n' && brk) {  /* inside a word: back to the last space */
            end = brk;
            next = brk + 1;
        }
        if (next == p && *p == '\n') next = p + 1;
        if (end == s && next == s) next = s + 1;   /* never stall (a width below one character) */
        if (fn) fn(ud, s, (int)(end - s));
        rows++;
        s = next;
    }
    return rows;
}

static const char *prefix(int kind)
{
    switch (kind) {
    case E_USER: return "you> ";
    case E_ANSWER: return "";
    case E_INFO: return "-- ";
    case E_ERROR: return "!! ";
    default: return "~~ ";
    }
}

/* The entry as shown: its prefix and text (malloc'd). */
static char *composed(const conv_entry *x)
{
    size_t L = strlen(prefix(x->kind)) + x->len + 1;
    char *s = malloc(L);
    if (s) snprintf(s, L, "%s%s", prefix(x->kind), x->text);
    return s;
}

typedef struct draw_ctx {
    int line;                /* the row being placed, counted from the conversation's first */
    int first, top, bottom;  /* the first row shown (a line number) and the screen rows */
    int attr, event_attr, in_event;
    const char *base;        /* the entry's shown text */
    size_t hl_from, hl_to;   /* a search match in it to highlight (from == to: none) */
    int hl_attr;
} draw_ctx;

/* bytes of p at (y, x) in attr, the runs between MARK_ON and MARK_OFF in marked; *in_mark carries
 * the state from row to row (also for rows not shown). */
static void draw_marked(int y, int x, const char *p, int bytes, int attr, int marked, int *in_mark, int show)
{
    for (int i = 0; i < bytes;) {
        if (p[i] == MARK_ON || p[i] == MARK_OFF) {
            *in_mark = p[i] == MARK_ON;
            i++;
            continue;
        }
        int j = i, cells = 0;
        while (j < bytes && p[j] != MARK_ON && p[j] != MARK_OFF) {
            int b, w = ed_cells(p + j, &b);
            cells += w;
            j += b;
        }
        if (j > bytes) j = bytes;
        if (show) {
            int a = *in_mark ? marked : attr;
            attron(a);
            mvaddnstr(y, x, p + i, j - i);
            attroff(a);
        }
        x += cells;
        i = j;
    }
}

static int cells_of(const char *p, int bytes)
{
    int n = 0;
    for (int i = 0; i < bytes;) {
        int b, w = (p[i] == MARK_ON || p[i] == MARK_OFF) ? 0 : ed_cells(p + i, &b);
        if (p[i] == MARK_ON || p[i] == MARK_OFF) b = 1;
        n += w;
        i += b;
    }
    return n;
}

/* A separator: a rule across the pane with its text on it, cut by the cells the pane has (a
 * newline shown as a space), so it never runs on past the pane (into the side panel) or onto the
 * next row. */
static void draw_separator(int y, int width, const char *text, int attr)
{
    attron(attr);
    mvhline(y, 0, ACS_HLINE, width);
    int x = 3, end = width - 3;   /* "── TEXT ──": two cells of rule each side, a space each side */
    if (end > x) {
        mvaddch(y, 2, ' ');
        for (const char *p = text; *p;) {
            int b, w = *p == '\n' ? 1 : ed_cells(p, &b);
            if (*p == '\n') b = 1;
            if (x + w > end) break;
            if (*p == '\n') mvaddch(y, x, ' ');
            else mvaddnstr(y, x, p, b);
            x += w;
            p += b;
        }
        mvaddch(y, x, ' ');
    }
    attroff(attr);
}

static void draw_line(void *ud, const char *p, int bytes)
{
    draw_ctx *d = ud;
    int y = d->top + d->line - d->first;
    int show = y >= d->top && y <= d->bottom;
    draw_marked(y, 0, p, bytes, d->attr, d->event_attr, &d->in_event, show);
    if (show && d->base && d->hl_to > d->hl_from) {
        size_t a = (size_t)(p - d->base), b = a + (size_t)bytes;
        size_t from = d->hl_from > a ? d->hl_from : a, to = d->hl_to < b ? d->hl_to : b;
        if (from < to) {
            attron(d->hl_attr);
            mvaddnstr(y, cells_of(p, (int)(from - a)), d->base + from, (int)(to - from));
            attroff(d->hl_attr);
        }
    }
    d->line++;
}

/* ---- comparisons */

typedef struct col_ctx {
    char **lines;
    int n, cap;
} col_ctx;

static void keep_line(void *ud, const char *p, int bytes)
{
    col_ctx *c = ud;
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 16;
        char **nl = realloc(c->lines, sizeof *nl * (size_t)nc);
        if (!nl) return;
        c->lines = nl;
        c->cap = nc;
    }
    char *l = malloc((size_t)bytes + 1);
    if (!l) return;
    memcpy(l, p, (size_t)bytes);
    l[bytes] = 0;
    c->lines[c->n++] = l;
}

static int column_width(const conv_entry *x, int width)
{
    int cw = (width - 2 * (x->n_cols - 1)) / (x->n_cols > 0 ? x->n_cols : 1);
    return cw < 8 ? 8 : cw;
}

static const char compare_title[] = "== compare: the same question under each policy, from the same cache";

/* The rows a comparison takes: its title, then the tallest column (heading + answer). */
static int compare_rows(const conv_entry *x, int width)
{
    int cw = column_width(x, width), rows = 0;
    for (int c = 0; c < x->n_cols; c++) {
        int r = conv_wrap(x->head[c], cw, NULL, NULL) + conv_wrap(x->col[c], cw, NULL, NULL);
        if (r > rows) rows = r;
    }
    return conv_wrap(compare_title, width, NULL, NULL) + rows;
}

static void draw_compare(draw_ctx *d, const conv_entry *x, int width, const conv_attrs *a)
{
    int n = x->n_cols, cw = column_width(x, width), rows = 0, heads[8];
    col_ctx cols[8];
    memset(cols, 0, sizeof cols);
    for (int c = 0; c < n; c++) {
        conv_wrap(x->head[c], cw, keep_line, &cols[c]);
        heads[c] = cols[c].n;
        conv_wrap(x->col[c], cw, keep_line, &cols[c]);
        if (cols[c].n > rows) rows = cols[c].n;
    }
    d->attr = a->heading;
    d->base = NULL;
    conv_wrap(compare_title, width, draw_line, d);
    int marked[8] = { 0 };
    for (int r = 0; r < rows; r++) {
        int y = d->top + d->line - d->first, show = y >= d->top && y <= d->bottom;
        for (int c = 0; c < n; c++) {
            if (r >= cols[c].n) continue;
            draw_marked(y, c * (cw + 2), cols[c].lines[r], (int)strlen(cols[c].lines[r]), r < heads[c] ? a->heading : 0,
                        a->event, &marked[c], show);
        }
        d->line++;
    }
    for (int c = 0; c < n; c++) {
        for (int k = 0; k < cols[c].n; k++) free(cols[c].lines[k]);
        free(cols[c].lines);
    }
}

/* ---- layout, search and drawing */

/* Rows entry i takes (with the blank row after it). */
static int entry_rows(const conv_entry *x, int width)
{
    if (x->kind == E_COMPARE) return compare_rows(x, width) + 1;
    if (x->kind == E_SEP) return 2;
    char *s = composed(x);
    int r = s ? conv_wrap(s, width, NULL, NULL) : 1;
    free(s);
    return r + 1;
}

typedef struct line_of_ctx {
    const char *base;
    size_t at;
    int line, found;
} line_of_ctx;

static void line_of(void *ud, const char *p, int bytes)
{
    line_of_ctx *l = ud;
    if (!l->found && (size_t)(p - l->base) + (size_t)bytes >= l->at) l->found = 1;
    if (!l->found) l->line++;
}

/* The k-th match from the end (entry and its offset in the shown text); the count of matches. */
static int match_at(const conv *c, int k, int *ent, size_t *from, size_t *to)
{
    int count = 0;
    size_t pl = strlen(c->find);
    if (!pl) return 0;
    for (int i = c->n - 1; i >= 0; i--) {
        const conv_entry *x = &c->e[i];
        if (x->kind == E_COMPARE || x->kind == E_SEP) continue;
        char *s = composed(x);
        if (!s) continue;
        /* every match in this entry, newest (last) first */
        size_t offs[256];
        int m = 0;
        for (const char *p = strcasestr(s, c->find); p && m < 256; p = strcasestr(p + 1, c->find))
            offs[m++] = (size_t)(p - s);
        for (int j = m - 1; j >= 0; j--, count++)
            if (count == k) {
                *ent = i;
                *from = offs[j];
                *to = offs[j] + pl;
            }
        free(s);
    }
    return count;
}

int conv_find(conv *c, const char *pat, int k)
{
    snprintf(c->find, sizeof c->find, "%s", pat);
    int ent;
    size_t a, b;
    c->find_n = match_at(c, 0, &ent, &a, &b);
    if (c->find_n == 0) return 0;
    if (k < 0) k = 0;
    if (k >= c->find_n) k = c->find_n - 1;
    c->find_cur = k;
    c->scroll = -1;   /* the next draw scrolls to it */
    return c->find_n;
}

void conv_scroll(conv *c, int lines)
{
    c->scroll += lines;
    if (c->scroll < 0) c->scroll = 0;
}

void conv_scroll_to(conv *c, int end) { c->scroll = end ? 0 : 1 << 30; }

void conv_draw(conv *c, int top, int bottom, int width, const conv_attrs *a)
{
    int h = bottom - top + 1;
    if (h < 1) return;
    int *rows = malloc(sizeof(int) * (size_t)(c->n > 0 ? c->n : 1)), total = 0;
    if (!rows) return;
    for (int i = 0; i < c->n; i++) total += rows[i] = entry_rows(&c->e[i], width);
    /* scrolled back: hold still while text arrives below (the same width: a resize re-flows) */
    if (c->scroll > 0 && width == c->last_width && total > c->last_total) c->scroll += total - c->last_total;
    int hl_ent = -1;
    size_t hl_from = 0, hl_to = 0;
    if (c->find[0]) {
        int n = match_at(c, c->find_cur, &hl_ent, &hl_from, &hl_to);
        if (n == 0) hl_ent = -1;
        if (c->scroll < 0 && hl_ent >= 0) {   /* scroll to the match: its row near the middle */
            int line = 0;
            for (int i = 0; i < hl_ent; i++) line += rows[i];
            char *s = composed(&c->e[hl_ent]);
            line_of_ctx l = { s, hl_from, 0, 0 };
            if (s) conv_wrap(s, width, line_of, &l);
            free(s);
            c->scroll = total - h - (line + l.line) + h / 2;
        }
    }
    if (c->scroll < 0) c->scroll = 0;
    int max_scroll = total > h ? total - h : 0;
    if (c->scroll > max_scroll) c->scroll = max_scroll;
    c->last_total = total;
    c->last_width = width;
    int more = c->scroll > 0;          /* the last row says what lies below */
    int first = total > h ? total - h - c->scroll : 0;
    draw_ctx d = { 0, first, top, more ? bottom - 1 : bottom, 0, a->event, 0, NULL, 0, 0, a->match };
    for (int i = 0; i < c->n; i++) {
        if (d.line + rows[i] <= first || d.line > first + h) {   /* off the screen */
            d.line += rows[i];
            continue;
        }
        const conv_entry *x = &c->e[i];
        if (x->kind == E_COMPARE) {
            draw_compare(&d, x, width, a);
        } else if (x->kind == E_SEP) {
            int y = top + d.line - first;
            if (y >= top && y <= d.bottom) draw_separator(y, width, x->text, a->heading);
            d.line++;
        } else {
            char *s = composed(x);
            if (!s) break;
            d.attr = a->kind[x->kind];
            d.in_event = 0;
            d.base = s;
            d.hl_from = i == hl_ent ? hl_from : 0;
            d.hl_to = i == hl_ent ? hl_to : 0;
            conv_wrap(s, width, draw_line, &d);
            d.base = NULL;
            free(s);
        }
        d.line++;   /* the blank row after it */
    }
    free(rows);
    if (more) {
        attron(a->more);
        mvhline(bottom, 0, ' ', width);
        mvprintw(bottom, 0, "-- more below (%d rows): End jumps to the end --", c->scroll);
        attroff(a->more);
    }
}
