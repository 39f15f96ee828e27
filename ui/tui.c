/* tui.c - the ncurses screen (see tui.h).
 *
 * Layout: a status bar on top (model, document, policy, context meter, speed, state); the
 * conversation on the left (wrapped, scrollable); a side panel on the right when the terminal is
 * wide enough (memory, the page map, uncertainty); the input line at the bottom. The screen is
 * redrawn 20 times a second from the worker's published view; keys are read with a 50 ms timeout,
 * so typing, scrolling and Ctrl-C work while tokens stream. */
#define _XOPEN_SOURCE_EXTENDED 1
#include "ui/tui.h"

#include <locale.h>
#include <ncurses.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include "ui/browser.h"
#include "ui/config.h"
#include "ui/keymap.h"
#include "ui/pickers.h"
#include "ui/worker.h"

enum { C_USER = 1, C_ANSWER, C_INFO, C_ERROR, C_BAR, C_HEAD, C_EVENT, C_MAP1, C_MAP2, C_MAP3, C_DIM };
enum { E_USER, E_ANSWER, E_INFO, E_ERROR, E_EVENT, E_COMPARE };
enum { OV_NONE, OV_SESSIONS, OV_POLICY, OV_SETTINGS, OV_FILES };
/* An uncertainty event inside an answer's text, where it happened: EV_ON ... EV_OFF, drawn in the
 * event colour (zero-width markers). */
#define EV_ON '\x1e'
#define EV_OFF '\x1f'


typedef struct entry {
    int kind;
    char *text;
    size_t len, cap;
    /* E_COMPARE: one column per policy */
    int n_cols;
    char *head[8], *col[8];
} entry;

typedef struct tui {
    ui_worker *w;
    entry *e;
    int n, cap;
    char input[2048];
    size_t in_len, cursor;
    char **hist;
    int n_hist, hist_pos;
    int scroll;              /* lines scrolled back from the bottom */
    int help;
    int quit;
    int answering;           /* an answer entry is open for text */
    char progress[512];
    int color;
    uw_span *seen;           /* the "what the model sees" view, when open */
    int n_seen, seen_open, seen_scroll;
    keymap km;
    int overlay;             /* OV_*: a framed list over the conversation */
    browser br;
    policy_picker pp;
    settings_menu st;
    file_picker fp;
    char last_dir[1024];     /* where the file picker opens */
} tui;

static void add_entry(tui *t, int kind, const char *text)
{
    if (t->n == t->cap) {
        int nc = t->cap ? t->cap * 2 : 64;
        entry *ne = realloc(t->e, sizeof *ne * (size_t)nc);
        if (!ne) return;
        t->e = ne;
        t->cap = nc;
    }
    entry *x = &t->e[t->n++];
    x->kind = kind;
    x->n_cols = 0;
    x->len = strlen(text);
    x->cap = x->len + 1;
    x->text = malloc(x->cap);
    if (x->text) memcpy(x->text, text, x->cap);
    else t->n--;
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

static void add_compare(tui *t, uw_compared *c, int n)
{
    add_entry(t, E_COMPARE, "");
    entry *x = &t->e[t->n - 1];
    x->n_cols = n;
    for (int i = 0; i < n; i++) {
        char head[700];
        int d = i ? first_difference(c[0].text, c[i].text) : 0;
        char diff[64];
        if (i == 0)
            snprintf(diff, sizeof diff, "the conversation's policy");
        else if (d == 0)
            snprintf(diff, sizeof diff, "same answer as the first");
        else
            snprintf(diff, sizeof diff, "differs from the first at word %d", d);
        snprintf(head, sizeof head, "[%.250s] %.150s; %.60s", c[i].policy, c[i].figures, diff);
        x->head[i] = strdup(head);
        x->col[i] = c[i].text;   /* taken over */
        if (d > 0) {   /* highlight this answer from its first different word on */
            const char *p = c[i].text;
            for (int word = 1;; word++) {
                while (*p == ' ' || *p == '\n') p++;
                if (word == d || !*p) break;
                p += strcspn(p, " \n");
            }
            size_t off = (size_t)(p - c[i].text), L = strlen(c[i].text);
            char *m = malloc(L + 2);
            if (m) {
                memcpy(m, c[i].text, off);
                m[off] = EV_ON;
                memcpy(m + off + 1, c[i].text + off, L - off + 1);
                free(c[i].text);
                x->col[i] = m;
            }
        }
    }
}

static void append_text(tui *t, const char *s)
{
    if (!t->answering || t->n == 0) {
        add_entry(t, E_ANSWER, "");
        t->answering = 1;
    }
    entry *x = &t->e[t->n - 1];
    size_t k = strlen(s);
    if (x->len + k + 1 > x->cap) {
        size_t nc = (x->len + k + 1) * 2;
        char *nt = realloc(x->text, nc);
        if (!nt) return;
        x->text = nt;
        x->cap = nc;
    }
    memcpy(x->text + x->len, s, k + 1);
    x->len += k;
}

/* Bytes of the UTF-8 sequence starting with c. */
static int u8len(unsigned char c) { return c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 1; }

/* Wrap text into lines of at most width cells (one cell per code point); calls fn per line. */
static int wrap(const char *s, int width, void (*fn)(void *ud, const char *p, int bytes), void *ud)
{
    int lines = 0;
    while (*s) {
        const char *p = s, *brk = NULL;
        int cells = 0;
        while (*p && *p != '\n' && cells < width) {
            if (*p == ' ') brk = p;
            if (*p != EV_ON && *p != EV_OFF) cells++;
            p += u8len((unsigned char)*p);
        }
        const char *end = p;
        if (*p && *p != '\n' && brk && brk > s) end = brk;   /* break at the last space */
        if (fn) fn(ud, s, (int)(end - s));
        lines++;
        s = end;
        if (*s == '\n' || (*s == ' ' && end == brk)) s++;
    }
    return lines;
}

typedef struct draw_ctx {
    int y, x, top, bottom, skip;
    int attr;
    int event_attr, in_event;   /* inside an inline event (EV_ON .. EV_OFF) */
} draw_ctx;

/* bytes of p at (y, x) in attr, the runs between EV_ON and EV_OFF in marked; *in_mark carries the
 * state from line to line (and is updated when show is 0, for lines scrolled off). */
static void draw_marked(int y, int x, const char *p, int bytes, int attr, int marked, int *in_mark, int show)
{
    for (int i = 0; i < bytes;) {
        if (p[i] == EV_ON || p[i] == EV_OFF) {
            *in_mark = p[i] == EV_ON;
            i++;
            continue;
        }
        int j = i, cells = 0;
        while (j < bytes && p[j] != EV_ON && p[j] != EV_OFF) {
            if (((unsigned char)p[j] & 0xC0) != 0x80) cells++;
            j++;
        }
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

static void draw_line(void *ud, const char *p, int bytes)
{
    draw_ctx *d = ud;
    int show = d->skip <= 0 && d->y <= d->bottom && d->y >= d->top;
    if (d->skip > 0) d->skip--;
    else if (d->y <= d->bottom) d->y++;
    draw_marked(d->y - 1, d->x, p, bytes, d->attr, d->event_attr, &d->in_event, show);
}

/* The rows a comparison takes: the tallest column (heading lines + wrapped answer). */
static int compare_rows(const entry *x, int width)
{
    int cw = (width - 2 * (x->n_cols - 1)) / (x->n_cols > 0 ? x->n_cols : 1), rows = 0;
    if (cw < 8) cw = 8;
    for (int c = 0; c < x->n_cols; c++) {
        int r = wrap(x->head[c], cw, NULL, NULL) + wrap(x->col[c], cw, NULL, NULL);
        if (r > rows) rows = r;
    }
    return rows + 1;   /* and the title line */
}

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

static int kind_attr(const tui *t, int kind)
{
    if (!t->color) return kind == E_USER ? A_BOLD : kind == E_ERROR ? A_STANDOUT : 0;
    switch (kind) {
    case E_USER: return COLOR_PAIR(C_USER) | A_BOLD;
    case E_ANSWER: return COLOR_PAIR(C_ANSWER);
    case E_INFO: return COLOR_PAIR(C_INFO);
    case E_ERROR: return COLOR_PAIR(C_ERROR) | A_BOLD;
    default: return COLOR_PAIR(C_EVENT);
    }
}

static void draw_compare(tui *t, draw_ctx *d, const entry *x, int width);

/* Columns side by side: heading (policy and figures), then the answer; a column whose answer
 * differs from the first one's says from which word on. */
static void draw_compare(tui *t, draw_ctx *d, const entry *x, int width)
{
    int n = x->n_cols, cw = (width - 2 * (n - 1)) / (n > 0 ? n : 1);
    if (cw < 8) cw = 8;
    col_ctx cols[8];
    int rows = 0, heads[8];
    memset(cols, 0, sizeof cols);
    for (int c = 0; c < n; c++) {
        wrap(x->head[c], cw, keep_line, &cols[c]);
        heads[c] = cols[c].n;
        wrap(x->col[c], cw, keep_line, &cols[c]);
        if (cols[c].n > rows) rows = cols[c].n;
    }
    int save = d->attr;
    d->attr = t->color ? COLOR_PAIR(C_HEAD) | A_BOLD : A_BOLD;
    draw_line(d, "== compare: the same question under each policy, from the same cache", 68);
    int marked[8] = { 0 }, mark_attr = t->color ? COLOR_PAIR(C_EVENT) | A_BOLD : A_UNDERLINE;
    for (int r = 0; r < rows; r++) {
        int show = d->skip <= 0 && d->y <= d->bottom && d->y >= d->top;
        for (int c = 0; c < n; c++) {
            if (r >= cols[c].n) continue;
            int a = r < heads[c] ? (t->color ? COLOR_PAIR(C_HEAD) : (int)A_BOLD) : 0;
            draw_marked(d->y, d->x + c * (cw + 2), cols[c].lines[r], (int)strlen(cols[c].lines[r]), a, mark_attr,
                        &marked[c], show);
        }
        if (d->skip > 0) d->skip--;
        else if (d->y <= d->bottom) d->y++;
    }
    d->attr = save;
    for (int c = 0; c < n; c++) {
        for (int k = 0; k < cols[c].n; k++) free(cols[c].lines[k]);
        free(cols[c].lines);
    }
}

static void draw_conversation(tui *t, int top, int bottom, int width)
{
    int h = bottom - top + 1;
    /* count lines from the end until the screen (plus the scroll-back) is full */
    int total = 0, first = t->n;
    char buf[64];
    for (int i = t->n - 1; i >= 0 && total < h + t->scroll; i--) {
        if (t->e[i].kind == E_COMPARE) {
            total += compare_rows(&t->e[i], width) + 1;
            first = i;
            continue;
        }
        size_t L = strlen(prefix(t->e[i].kind)) + t->e[i].len + 1;
        char *s = malloc(L);
        if (!s) break;
        snprintf(s, L, "%s%s", prefix(t->e[i].kind), t->e[i].text);
        total += wrap(s, width, NULL, NULL) + 1;
        free(s);
        first = i;
    }
    (void)buf;
    int max_scroll = total > h ? total - h : 0;
    if (t->scroll > max_scroll) t->scroll = max_scroll;
    draw_ctx d = { top, 0, top, bottom, total > h ? total - h - t->scroll : 0, 0, 0, 0 };
    for (int i = first; i < t->n; i++) {
        if (t->e[i].kind == E_COMPARE) {
            draw_compare(t, &d, &t->e[i], width);
            draw_line(&d, "", 0);
            continue;
        }
        size_t L = strlen(prefix(t->e[i].kind)) + t->e[i].len + 1;
        char *s = malloc(L);
        if (!s) break;
        snprintf(s, L, "%s%s", prefix(t->e[i].kind), t->e[i].text);
        d.attr = kind_attr(t, t->e[i].kind);
        d.event_attr = kind_attr(t, E_EVENT) | A_BOLD;
        d.in_event = 0;
        wrap(s, width, draw_line, &d);
        free(s);
        draw_line(&d, "", 0);   /* a blank line between turns */
    }
}

static void bar(int y, int x, int width, double frac, int attr)
{
    int n = (int)(frac * width + 0.5);
    if (n > width) n = width;
    attron(attr);
    for (int i = 0; i < width; i++) mvaddstr(y, x + i, i < n ? "\u2588" : "\u2591");
    attroff(attr);
}

/* The page map's colour per level: evicted, not read, selected rarely .. often, every step. */
static const int map_pair[] = { C_DIM, C_DIM, C_MAP1, C_MAP2, C_MAP3, C_EVENT };

static void draw_panel(tui *t, const uw_view *v, int top, int bottom, int x, int width)
{
    int y = top, head = t->color ? COLOR_PAIR(C_HEAD) | A_BOLD : A_BOLD;
    double mib = 1024.0 * 1024.0;
    attron(head);
    mvprintw(y++, x, "Memory");
    attroff(head);
    mvprintw(y++, x, "weights  %7.1f MiB", v->weights_mib);
    mvprintw(y++, x, "KV held  %7.2f MiB", (double)v->kv_held / mib);
    mvprintw(y++, x, "KV full  %7.2f MiB", (double)v->kv_full / mib);
    if (y <= bottom) bar(y++, x, width - 1, v->kv_full ? (double)v->kv_held / (double)v->kv_full : 0,
                         t->color ? COLOR_PAIR(C_MAP2) : 0);
    mvprintw(y++, x, "KV peak  %7.2f MiB", (double)v->kv_peak / mib);
    mvprintw(y++, x, "RSS peak %7.1f MiB", v->rss_mib);
    if (v->gpu_total) mvprintw(y++, x, "GPU %7.0f/%.0f MiB", (double)v->gpu_held / mib, (double)v->gpu_total / mib);
    y++;
    if (y > bottom) return;
    attron(head);
    mvprintw(y++, x, "Pages: %lld of %d tokens", (long long)v->n_map, v->page_size);
    attroff(head);
    /* each cell: one page or a run of pages; evicted (x), read at every step of the answer (the
     * sinks and window a policy always keeps, or everything under the full cache), selected on
     * some steps (shaded by how often), or not read */
    int cols = width - 1, rows_left = bottom - y - 8;
    if (rows_left < 1) rows_left = 1;
    int64_t per_cell = (v->n_map + (int64_t)cols * rows_left - 1) / ((int64_t)cols * rows_left);
    if (per_cell < 1) per_cell = 1;
    int64_t cells = (v->n_map + per_cell - 1) / per_cell;
    for (int64_t c = 0; c < cells && y <= bottom; c++) {
        int64_t hits = 0, held = 0, n = 0;
        for (int64_t i = c * per_cell; i < (c + 1) * per_cell && i < v->n_map; i++, n++) {
            hits += v->map[i] > 0 ? v->map[i] : 0;
            held += v->held[i];
        }
        double frac = v->map_full > 0 && held > 0 ? (double)hits / (double)(v->map_full * held) : 0;
        static const char *glyph[] = { "\u00d7", "\u00b7", "\u2591", "\u2592", "\u2593", "\u2588" };
        int lvl = held == 0 ? 0 : hits == 0 ? 1 : frac >= 0.999 ? 5 : frac >= 0.5 ? 4 : frac >= 0.15 ? 3 : 2;
        int a = t->color ? COLOR_PAIR(map_pair[lvl]) : lvl <= 1 ? (int)A_DIM : 0;
        attron(a);
        mvaddstr(y, x + (int)(c % cols), glyph[lvl]);
        attroff(a);
        if (c % cols == cols - 1) y++;
    }
    if (cells % cols) y++;
    /* the legend, each glyph in its colour */
    static const struct {
        int lvl, dx, dy;
        const char *text;
    } legend[] = { { 5, 0, 0, "\u2588 every step" }, { 4, 14, 0, "\u2593" }, { 3, 15, 0, "\u2592" },
                   { 2, 16, 0, "\u2591 selected" }, { 1, 0, 1, "\u00b7 not read" }, { 0, 14, 1, "\u00d7 evicted" } };
    for (size_t i = 0; i < sizeof legend / sizeof *legend && y + legend[i].dy <= bottom; i++) {
        int a = t->color ? COLOR_PAIR(map_pair[legend[i].lvl]) : legend[i].lvl <= 1 ? (int)A_DIM : 0;
        attron(a);
        mvaddstr(y + legend[i].dy, x + legend[i].dx, legend[i].text);
        attroff(a);
    }
    y += 2;
    y++;
    if (y > bottom) return;
    attron(head);
    mvprintw(y++, x, "Uncertainty");
    attroff(head);
    if (v->thr_valid)
        mvprintw(y++, x, "thresholds H %.2f V %.2f", v->thr_h, v->thr_v);
    else if (y <= bottom)
        mvprintw(y++, x, "no thresholds (calibrate)");
    if (y <= bottom) {
        static const char *spark[] = { "\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588" };
        int n = v->n_hist < width - 3 ? v->n_hist : width - 3;
        mvprintw(y, x, "H ");
        for (int i = 0; i < n; i++) {
            float h = v->entropy[v->n_hist - n + i];
            int k = (int)(h / 4.0f * 8);
            if (k > 7) k = 7;
            if (k < 0) k = 0;
            mvaddstr(y, x + 2 + i, spark[k]);
        }
        y++;
    }
    if (y <= bottom) mvprintw(y++, x, "events %d, regenerated %d", v->events, v->regenerated);
}

/* The sequence as the first global layer holds it: evicted text dim, held text plain, the tokens the
 * last step attended highlighted. Wrapped per character; seen_scroll lines are skipped. */
static void draw_seen(tui *t, int top, int bottom, int width)
{
    int hl = t->color ? COLOR_PAIR(C_MAP3) | A_BOLD : A_REVERSE;
    int head = t->color ? COLOR_PAIR(C_HEAD) | A_BOLD : A_BOLD;
    attron(head);
    mvaddnstr(top, 0, "What the model sees (first global layer): dim = evicted or merged, plain = held, "
                      "highlighted = attended at the last step. F2 closes, PgUp/PgDn scroll.", width);
    attroff(head);
    int y = top + 1 - t->seen_scroll, x = 0;
    for (int i = 0; i < t->n_seen; i++) {
        int a = t->seen[i].state == 0 ? (int)A_DIM : t->seen[i].state == 2 ? hl : 0;
        const char *p = t->seen[i].text;
        while (*p) {
            int k = u8len((unsigned char)*p);
            if (*p == '\n' || x >= width) {
                y++;
                x = 0;
                if (*p == '\n') {
                    p++;
                    continue;
                }
            }
            if (y > bottom) return;
            if (y > top) {
                attron(a);
                mvaddnstr(y, x, p, k);
                attroff(a);
            }
            x++;
            p += k;
        }
    }
}

/* Every key (as bound now) and command. */
static void draw_help(tui *t, int H, int W, int attr)
{
    char lines[40][96];
    int n = 0;
    snprintf(lines[n++], 96, "kvchat keys and commands");
    lines[n++][0] = 0;
    for (int a = 0; a < KA_COUNT; a++) {
        char k[16];
        keymap_key_name(t->km.key[a], k, sizeof k);
        snprintf(lines[n++], 96, "%-6s %s", k, keymap_action_help(a));
    }
    static const char *fixed[] = { "Ctrl-C stop the answer or the prefill (quit when idle)",
                                   "Up/Down input history; mouse wheel scrolls",
                                   "",
                                   "Enter            ask the question typed below",
                                   "/open [PATH]     open a document (no PATH: the file picker)",
                                   "/policy [SPEC]   switch policy (no SPEC: the picker)",
                                   "/sessions        the session browser; /resume ID continues one",
                                   "/settings        sampling, answer length and budget",
                                   "/regen           another answer to the last question (a branch)",
                                   "/edit N TEXT     ask TEXT instead of question N (a branch)",
                                   "/compare P1,P2 Q answer Q under these policies side by side",
                                   "/help  /quit",
                                   "",
                                   "keys are remapped in the settings file: key.ACTION = KEY",
                                   "press any key" };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed && n < 40; i++) snprintf(lines[n++], 96, "%s", fixed[i]);
    int w = 66, y0 = (H - n) / 2 - 1, x0 = (W - w) / 2;
    if (x0 < 0) x0 = 0;
    if (y0 < 1) y0 = 1;
    for (int i = -1; i <= n; i++) {
        attron(attr);
        mvhline(y0 + i, x0, ' ', w);
        if (i >= 0 && i < n) mvaddnstr(y0 + i, x0 + 2, lines[i], w - 4);
        attroff(attr);
    }
}

static void draw(tui *t)
{
    uw_view v;
    uw_get_view(t->w, &v);
    erase();
    int H = LINES, W = COLS;
    int panel = W >= 100 ? 34 : 0;
    int conv_w = W - (panel ? panel + 1 : 0);
    /* status bar */
    int bar_attr = t->color ? COLOR_PAIR(C_BAR) : A_REVERSE;
    attron(bar_attr);
    mvhline(0, 0, ' ', W);
    char status[2048];
    /* the context meter: positions used of the limit, then token rows kept and the bytes they hold
     * against a full cache */
    snprintf(status, sizeof status, " kvchat | %s | %s | %s | ctx %lld/%lld | kept %.0f%% %.1f/%.1f MiB | %.1f tok/s | %s",
             v.busy ? (t->progress[0] ? t->progress : "working") : "ready", v.doc[0] ? v.doc : "no document",
             v.policy, (long long)v.ctx_used, (long long)v.ctx_limit,
             v.tokens_full ? 100.0 * (double)v.tokens_kept / (double)v.tokens_full : 100.0,
             (double)v.kv_held / (1 << 20), (double)v.kv_full / (1 << 20), v.tok_s, v.model);
    mvaddnstr(0, 0, status, W);
    attroff(bar_attr);
    /* conversation, or what the model sees */
    if (t->seen_open)
        draw_seen(t, 1, H - 3, conv_w - 1);
    else
        draw_conversation(t, 1, H - 3, conv_w - 1);
    if (panel) {
        int a = t->color ? COLOR_PAIR(C_DIM) : 0;
        attron(a);
        mvvline(1, conv_w, ACS_VLINE, H - 3);
        attroff(a);
        draw_panel(t, &v, 1, H - 3, conv_w + 2, panel - 1);
    }
    /* input */
    mvhline(H - 2, 0, ACS_HLINE, W);
    mvprintw(H - 1, 0, "> ");
    int room = W - 3;
    size_t start = 0;
    int cells = 0;
    for (size_t i = 0; i < t->cursor; i += (size_t)u8len((unsigned char)t->input[i])) cells++;
    while (cells >= room && start < t->cursor) {
        start += (size_t)u8len((unsigned char)t->input[start]);
        cells--;
    }
    mvaddnstr(H - 1, 2, t->input + start, (int)(t->in_len - start));
    if (t->help) draw_help(t, H, W, bar_attr);
    menu_attrs ma = { t->color ? COLOR_PAIR(C_DIM) : 0, t->color ? COLOR_PAIR(C_HEAD) | A_BOLD : A_BOLD,
                      t->color ? COLOR_PAIR(C_ERROR) | A_BOLD : A_STANDOUT };
    if (t->overlay == OV_SESSIONS) browser_draw(&t->br, &ma);
    if (t->overlay == OV_POLICY) menu_draw(&t->pp.m, &ma);
    if (t->overlay == OV_SETTINGS) menu_draw(&t->st.m, &ma);
    if (t->overlay == OV_FILES) menu_draw(&t->fp.m, &ma);
    move(H - 1, 2 + cells);
    refresh();
}

static void push_history(tui *t, const char *s)
{
    char **nh = realloc(t->hist, sizeof *nh * (size_t)(t->n_hist + 1));
    if (!nh) return;
    t->hist = nh;
    t->hist[t->n_hist++] = strdup(s);
    t->hist_pos = t->n_hist;
}

static void set_input(tui *t, const char *s)
{
    snprintf(t->input, sizeof t->input, "%s", s ? s : "");
    t->in_len = t->cursor = strlen(t->input);
}

static void open_overlay(tui *t, int which)
{
    uw_view v;
    uw_get_view(t->w, &v);
    if (which == OV_SESSIONS) {
        browser_open(&t->br, uw_db_path(t->w));
        menu_select_tag(&t->br.m, v.session_id);
    } else if (which == OV_POLICY) {
        policy_picker_open(&t->pp, v.policy);
    } else if (which == OV_SETTINGS) {
        settings_open(&t->st, &v);
    } else if (which == OV_FILES) {
        file_picker_open(&t->fp, t->last_dir[0] ? t->last_dir : ".");
    }
    t->help = 0;
    t->overlay = which;
}

static void close_overlay(tui *t)
{
    if (t->overlay == OV_SESSIONS) browser_close(&t->br);
    if (t->overlay == OV_POLICY) menu_free(&t->pp.m);
    if (t->overlay == OV_SETTINGS) menu_free(&t->st.m);
    if (t->overlay == OV_FILES) {
        snprintf(t->last_dir, sizeof t->last_dir, "%s", t->fp.dir);
        file_picker_close(&t->fp);
    }
    t->overlay = OV_NONE;
    t->answering = 0;   /* whatever it started writes a new entry */
}

static void overlay_key(tui *t, int ch, int is_key)
{
    uw_view v;
    uw_get_view(t->w, &v);
    int done = 0;
    switch (t->overlay) {
    case OV_SESSIONS: done = browser_key(&t->br, t->w, v.session_id, ch, is_key); break;
    case OV_POLICY: done = policy_picker_key(&t->pp, t->w, v.policy, ch, is_key); break;
    case OV_SETTINGS: done = settings_key(&t->st, t->w, v.policy, ch, is_key); break;
    case OV_FILES: done = file_picker_key(&t->fp, t->w, ch, is_key); break;
    }
    if (done) close_overlay(t);
}

static void toggle_seen(tui *t)
{
    if (t->seen_open)
        t->seen_open = 0;
    else if (uw_request_seen(t->w))
        add_entry(t, E_ERROR, "busy: the view opens when the current job ends");
}

static void action(tui *t, int a)
{
    switch (a) {
    case KA_HELP: t->help = 1; break;
    case KA_SEEN: toggle_seen(t); break;
    case KA_SESSIONS: open_overlay(t, OV_SESSIONS); break;
    case KA_POLICY: open_overlay(t, OV_POLICY); break;
    case KA_SETTINGS: open_overlay(t, OV_SETTINGS); break;
    case KA_OPEN: open_overlay(t, OV_FILES); break;
    case KA_REGEN:
        if (uw_regenerate(t->w)) add_entry(t, E_ERROR, "busy: wait for the current job or press Ctrl-C");
        else t->answering = 0;
        break;
    case KA_SCROLL_UP:
        if (t->seen_open) t->seen_scroll = t->seen_scroll > LINES / 2 ? t->seen_scroll - LINES / 2 : 0;
        else t->scroll += LINES / 2;
        break;
    case KA_SCROLL_DOWN:
        if (t->seen_open) t->seen_scroll += LINES / 2;
        else t->scroll = t->scroll > LINES / 2 ? t->scroll - LINES / 2 : 0;
        break;
    case KA_QUIT: t->quit = 1; break;
    }
}

static void submit(tui *t)
{
    char line[sizeof t->input];
    snprintf(line, sizeof line, "%s", t->input);
    set_input(t, "");
    if (!line[0]) return;
    push_history(t, line);
    t->scroll = 0;
    char err[600];
    if (!strcmp(line, "/quit") || !strcmp(line, "/q")) {
        t->quit = 1;
    } else if (!strcmp(line, "/help")) {
        t->help = 1;
    } else if (!strcmp(line, "/open")) {
        open_overlay(t, OV_FILES);
    } else if (!strcmp(line, "/policy")) {
        open_overlay(t, OV_POLICY);
    } else if (!strcmp(line, "/settings")) {
        open_overlay(t, OV_SETTINGS);
    } else if (!strcmp(line, "/sessions")) {
        open_overlay(t, OV_SESSIONS);
    } else if (!strncmp(line, "/open ", 6)) {
        if (uw_open(t->w, line + 6)) add_entry(t, E_ERROR, "busy: wait for the current job or press Ctrl-C");
        else t->answering = 0;
    } else if (!strncmp(line, "/compare ", 9)) {
        if (uw_compare(t->w, line + 9)) add_entry(t, E_ERROR, "busy: wait for the current job or press Ctrl-C");
        else add_entry(t, E_INFO, line);
    } else if (!strncmp(line, "/edit ", 6)) {
        if (uw_edit(t->w, line + 6)) add_entry(t, E_ERROR, "busy: wait for the current job or press Ctrl-C");
        else t->answering = 0;
    } else if (!strcmp(line, "/regen")) {
        action(t, KA_REGEN);
    } else if (!strncmp(line, "/resume ", 8)) {
        if (uw_resume(t->w, line + 8)) add_entry(t, E_ERROR, "busy: wait for the current job or press Ctrl-C");
        else t->answering = 0;
    } else if (!strncmp(line, "/policy ", 8)) {
        if (uw_set_policy(t->w, line + 8, NULL, err, sizeof err)) add_entry(t, E_ERROR, err);
        else t->answering = 0;
    } else if (line[0] == '/') {
        snprintf(err, sizeof err, "unknown command %.100s (F1 for help)", line);
        add_entry(t, E_ERROR, err);
    } else if (uw_ask(t->w, line)) {
        add_entry(t, E_ERROR, "busy: wait for the current answer or press Ctrl-C");
    } else {
        add_entry(t, E_USER, line);
        t->answering = 0;
    }
}

static void edit_key(tui *t, wint_t ch, int is_key)
{
    if (is_key) {
        switch (ch) {
        case KEY_LEFT:
            while (t->cursor > 0 && ((unsigned char)t->input[--t->cursor] & 0xC0) == 0x80) {}
            return;
        case KEY_RIGHT:
            if (t->cursor < t->in_len) t->cursor += (size_t)u8len((unsigned char)t->input[t->cursor]);
            return;
        case KEY_HOME: t->cursor = 0; return;
        case KEY_END: t->cursor = t->in_len; return;
        case KEY_BACKSPACE:
            if (t->cursor > 0) {
                size_t c = t->cursor;
                while (c > 0 && ((unsigned char)t->input[--c] & 0xC0) == 0x80) {}
                memmove(t->input + c, t->input + t->cursor, t->in_len - t->cursor + 1);
                t->in_len -= t->cursor - c;
                t->cursor = c;
            }
            return;
        case KEY_DC:
            if (t->cursor < t->in_len) {
                size_t k = (size_t)u8len((unsigned char)t->input[t->cursor]);
                memmove(t->input + t->cursor, t->input + t->cursor + k, t->in_len - t->cursor - k + 1);
                t->in_len -= k;
            }
            return;
        case KEY_UP:
            if (t->hist_pos > 0) set_input(t, t->hist[--t->hist_pos]);
            return;
        case KEY_DOWN:
            if (t->hist_pos < t->n_hist - 1) set_input(t, t->hist[++t->hist_pos]);
            else {
                t->hist_pos = t->n_hist;
                set_input(t, "");
            }
            return;
        case KEY_ENTER: submit(t); return;
        case KEY_MOUSE: {
            MEVENT me;
            if (getmouse(&me) == OK) {
                if (me.bstate & BUTTON4_PRESSED) t->scroll += 3;
#ifdef BUTTON5_PRESSED
                if (me.bstate & BUTTON5_PRESSED) t->scroll = t->scroll > 3 ? t->scroll - 3 : 0;
#endif
            }
            return;
        }
        default: return;
        }
    }
    if (ch == '\n' || ch == '\r') {
        submit(t);
        return;
    }
    if (ch == 127 || ch == 8) {
        edit_key(t, KEY_BACKSPACE, 1);
        return;
    }
    if (ch < 32) return;
    char mb[8];
    mbstate_t st;
    memset(&st, 0, sizeof st);
    size_t k = wcrtomb(mb, (wchar_t)ch, &st);
    if (k == (size_t)-1 || t->in_len + k >= sizeof t->input) return;
    memmove(t->input + t->cursor + k, t->input + t->cursor, t->in_len - t->cursor + 1);
    memcpy(t->input + t->cursor, mb, k);
    t->cursor += k;
    t->in_len += k;
}

static void drain(tui *t)
{
    uw_event ev;
    while (uw_poll(t->w, &ev)) {
        switch (ev.kind) {
        case UW_TEXT:
            append_text(t, ev.text);
            break;
        case UW_PROGRESS:
            snprintf(t->progress, sizeof t->progress, "%s", ev.text);
            break;
        case UW_DONE:
            if (ev.a == 1 && t->answering) {   /* Ctrl-C: the partial answer stays, marked */
                char mark[32];
                snprintf(mark, sizeof mark, "%c [stopped]%c", EV_ON, EV_OFF);
                append_text(t, mark);
            }
            t->answering = 0;
            t->progress[0] = 0;
            if (ev.text[0]) add_entry(t, E_INFO, ev.text);
            if (ev.b == 3) {   /* a comparison is ready */
                uw_compared c[8];
                int n = uw_take_compared(t->w, c);
                if (n > 0) add_compare(t, c, n);
            }
            if (ev.b == 2) {   /* the "what the model sees" spans are ready */
                for (int i = 0; i < t->n_seen; i++) free(t->seen[i].text);
                free(t->seen);
                t->seen = uw_take_seen(t->w, &t->n_seen);
                t->seen_open = 1;
                t->seen_scroll = 0;
            }
            break;
        case UW_ERROR:
            t->answering = 0;
            t->progress[0] = 0;
            add_entry(t, E_ERROR, ev.text);
            break;
        case UW_INFO:
            add_entry(t, E_INFO, ev.text);
            break;
        case UW_EVENT:
            {   /* events come from answers: inside the answer's text, where it happened */
                char mark[600];
                snprintf(mark, sizeof mark, "%c [%s] %c", EV_ON, ev.text, EV_OFF);
                append_text(t, mark);
            }
            break;
        case UW_PAST_USER:
            t->answering = 0;
            add_entry(t, E_USER, ev.text);
            break;
        case UW_PAST_ANSWER:
            add_entry(t, E_ANSWER, ev.text);
            t->answering = 0;
            break;
        }
    }
}

int tui_main(ui_worker *w, const char *doc, const char *resume, const tui_config *cfg, char *err, size_t errlen)
{
    setlocale(LC_ALL, "");
    if (!initscr()) {
        uw_stop(w);
        snprintf(err, errlen, "cannot start the terminal interface (is TERM set?)");
        return -1;
    }
    set_escdelay(25);
    raw();   /* Ctrl-C arrives as a key: it stops generation instead of killing the program */
    noecho();
    keypad(stdscr, TRUE);
    mousemask(BUTTON4_PRESSED
#ifdef BUTTON5_PRESSED
                  | BUTTON5_PRESSED
#endif
              ,
              NULL);
    timeout(50);
    tui t;
    memset(&t, 0, sizeof t);
    t.w = w;
    t.km = cfg->keys;
    t.color = cfg->color && has_colors();
    if (t.color) {
        start_color();
        use_default_colors();
        /* the screen's colour pairs from the settings (config.h names them) */
        static const int pair_of[COL_COUNT] = { C_USER, C_ANSWER, C_INFO, C_ERROR, C_BAR, C_HEAD,
                                                C_EVENT, C_MAP1, C_MAP2, C_MAP3, C_DIM };
        for (int e = 0; e < COL_COUNT; e++) init_pair((short)pair_of[e], cfg->fg[e], cfg->bg[e]);
    }
    /* a document to open, a session to continue, or (neither) the most recent session */
    if (doc)
        uw_open(w, doc);
    else
        uw_resume(w, resume ? resume : "");
    while (!t.quit) {
        drain(&t);
        draw(&t);
        wint_t ch;
        int r = get_wch(&ch);
        if (r == ERR) continue;
        if (t.help) {
            t.help = 0;
            continue;
        }
        int is_key = r == KEY_CODE_YES;
        if (r == OK && ch == 3) {   /* Ctrl-C: stop the job; else close the overlay; else leave */
            uw_view v;
            uw_get_view(w, &v);
            if (v.busy) uw_cancel(w);
            else if (t.overlay) close_overlay(&t);
            else t.quit = 1;
            continue;
        }
        if (t.overlay && !(is_key && ch == KEY_RESIZE)) {
            overlay_key(&t, (int)ch, is_key);
            continue;
        }
        int a = keymap_lookup(&t.km, (int)ch, is_key);
        if (a >= 0) {
            action(&t, a);
            continue;
        }
        if (r == OK && ch == 4 && t.in_len == 0) break;   /* Ctrl-D on an empty line */
        edit_key(&t, ch, is_key);
    }
    if (t.overlay) close_overlay(&t);
    endwin();
    uw_stop(w);
    for (int i = 0; i < t.n; i++) {
        free(t.e[i].text);
        for (int c = 0; c < t.e[i].n_cols; c++) {
            free(t.e[i].head[c]);
            free(t.e[i].col[c]);
        }
    }
    free(t.e);
    for (int i = 0; i < t.n_hist; i++) free(t.hist[i]);
    free(t.hist);
    for (int i = 0; i < t.n_seen; i++) free(t.seen[i].text);
    free(t.seen);
    return 0;
}
