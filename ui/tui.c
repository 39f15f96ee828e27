/* tui.c - the ncurses screen (see tui.h).
 *
 * Layout: a status bar on top (state and live progress, conversation, policy, context, speed
 * and the device giving it, model); the conversation on the left (ui/conv.c); a side panel on the right when the terminal is
 * wide enough (memory, the page map, uncertainty); the input (ui/editor.c, as many rows as its text
 * takes) at the bottom. The screen is redrawn 20 times a second from the worker's published view;
 * keys are read with a 50 ms timeout, so typing, scrolling and Ctrl-C work while tokens stream. */
#define _XOPEN_SOURCE_EXTENDED 1
#include "ui/tui.h"

#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <ncurses.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "ui/browser.h"
#include "ui/config.h"
#include "ui/conv.h"
#include "ui/editor.h"
#include "ui/keymap.h"
#include "ui/pickers.h"
#include "ui/worker.h"

enum { C_USER = 1, C_ANSWER, C_INFO, C_ERROR, C_BAR, C_HEAD, C_EVENT, C_MAP1, C_MAP2, C_MAP3, C_DIM };
enum { OV_NONE, OV_SESSIONS, OV_POLICY, OV_SETTINGS, OV_FILES };
/* Bracketed paste (the terminal wraps pasted text in these when asked to): codes of our own. */
enum { KEY_PASTE_BEGIN = KEY_MAX + 1, KEY_PASTE_END };
#define MAX_QUEUE 8
#define INPUT_ROWS 8         /* the input grows to this many rows, then scrolls */

typedef struct tui {
    ui_worker *w;
    conv cv;
    editor ed;
    int help, help_top;
    int quit, confirm_quit;
    int color;
    uw_span *seen;           /* the "what the model sees" view, when open */
    int n_seen, seen_open, seen_scroll;
    int seen_follow;         /* at its end: it stays there as the sequence grows (End; PgUp leaves it) */
    keymap km;
    const tui_config *cfg;
    int overlay;             /* OV_*: a framed list over the conversation */
    browser br;
    policy_picker pp;
    settings_menu st;
    file_picker fp;
    char last_dir[1024];     /* where the file picker opens */
    int pasting;             /* inside a bracketed paste: Enter is a newline */
    char *queue[MAX_QUEUE];  /* questions typed while a job ran, asked when it ends */
    int n_queue;
    int job_failed;          /* the running job reported an error */
    int mouse;               /* mouse capture (the wheel scrolls; off: the terminal selects text) */
    int finding;             /* typing a search of the conversation */
    char find[256];
    int find_k, find_n, find_scroll;
    ed_utf8 u8;              /* typed bytes into characters */
    char *events;            /* the answer's uncertainty events so far, one a line: shown after it */
    char hist_path[1024];    /* the input history's file ("": none) */
} tui;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void say(tui *t, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(tui *t, int kind, const char *fmt, ...)
{
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    conv_add(&t->cv, kind, buf);
    t->cv.answering = 0;
}

/* The share of a full cache's token rows the cache holds, at most 1. */
static double kept_share(const uw_view *v)
{
    if (v->tokens_full <= 0) return 1.0;
    double r = (double)v->tokens_kept / (double)v->tokens_full;
    return r > 1.0 ? 1.0 : r;
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
    mvprintw(y++, x, "device   %.*s", width > 10 ? width - 10 : 0, v->device);   /* where the weights are */
    mvprintw(y++, x, "weights  %7.1f MiB", v->weights_mib);
    /* held can pass full while a prefill chunk is in: its rows are appended to every layer before
     * the sliding-window layers let the rows behind their window go */
    int in_chunk = v->busy && v->phase == VIEW_PREFILL && v->kv_held > v->kv_full;
    mvprintw(y++, x, "KV held  %7.2f MiB%s", (double)v->kv_held / mib, in_chunk ? " +chunk" : "");
    mvprintw(y++, x, "KV full  %7.2f MiB", (double)v->kv_full / mib);   /* every layer, the whole context */
    /* the share of a full cache's token rows the cache holds (bytes include the last page's room) */
    if (y <= bottom) bar(y++, x, width - 1, kept_share(v), t->color ? COLOR_PAIR(C_MAP2) : 0);
    if (v->swa_window > 0 && y <= bottom) mvprintw(y++, x, "window layers hold %d tokens", v->swa_window);
    mvprintw(y++, x, "KV peak  %7.2f MiB", (double)v->kv_peak / mib);
    mvprintw(y++, x, "RSS peak %7.1f MiB", v->rss_mib);
    if (v->gpu_total) mvprintw(y++, x, "GPU %7.0f/%.0f MiB", (double)v->gpu_held / mib, (double)v->gpu_total / mib);
    y++;
    if (y > bottom) return;
    attron(head);
    mvprintw(y++, x, "Pages: %lld (%d tokens each)", (long long)v->n_map, v->page_size);
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

/* ---- what the model sees */

typedef struct seen_ctx {
    const char *base;
    const unsigned char *state;   /* per byte of base */
    int y, top, bottom, skip, hl;
} seen_ctx;

static void seen_line(void *ud, const char *p, int bytes)
{
    seen_ctx *c = ud;
    if (c->skip > 0) {
        c->skip--;
        return;
    }
    if (c->y > c->bottom) return;
    int x = 0;
    for (int i = 0; i < bytes;) {
        int st = c->state[p + i - c->base], j = i, cells = 0;
        while (j < bytes && c->state[p + j - c->base] == st) {
            int b;
            cells += ed_cells(p + j, &b);
            j += b;
        }
        if (j > bytes) j = bytes;
        int a = st == 0 ? (int)A_DIM : st == 2 ? c->hl : 0;
        attron(a);
        mvaddnstr(c->y, x, p + i, j - i);
        attroff(a);
        x += cells;
        i = j;
    }
    c->y++;
}

typedef struct row_ctx {
    int y, x;
} row_ctx;

static void plain_line(void *ud, const char *p, int bytes)
{
    row_ctx *r = ud;
    mvaddnstr(r->y++, r->x, p, bytes);
}

/* The sequence as the first global layer holds it: evicted text dim, held text plain, the tokens the
 * last step attended highlighted; wrapped at word boundaries, seen_scroll rows skipped. Kept fresh
 * by the worker while it is open (uw_seen_live). */
static void draw_seen(tui *t, int top, int bottom, int width)
{
    const char *title = "What the model sees (first global layer): dim = evicted or merged, plain = held, "
                        "highlighted = attended at the last step. F2 or Esc closes, PgUp/PgDn scroll.";
    int head = t->color ? COLOR_PAIR(C_HEAD) | A_BOLD : A_BOLD;
    row_ctx r = { top, 0 };
    attron(head);
    conv_wrap(title, width, plain_line, &r);
    attroff(head);
    size_t total = 0;
    for (int i = 0; i < t->n_seen; i++) total += strlen(t->seen[i].text);
    char *all = malloc(total + 1);
    unsigned char *state = malloc(total + 1);
    if (all && state) {
        size_t o = 0;
        for (int i = 0; i < t->n_seen; i++) {
            size_t l = strlen(t->seen[i].text);
            memcpy(all + o, t->seen[i].text, l);
            memset(state + o, t->seen[i].state, l);
            o += l;
        }
        all[o] = 0;
        int rows = conv_wrap(all, width, NULL, NULL), h = bottom - r.y + 1;
        if (t->seen_follow || t->seen_scroll > rows - h) t->seen_scroll = rows - h > 0 ? rows - h : 0;
        seen_ctx c = { all, state, r.y, r.y, bottom, t->seen_scroll,
                       t->color ? COLOR_PAIR(C_MAP3) | A_BOLD : A_REVERSE };
        conv_wrap(all, width, seen_line, &c);
    }
    free(all);
    free(state);
}

/* ---- help */

typedef struct box_ctx {
    char (*lines)[160];
    int n, max;
    int indent, rows;        /* a hanging indent for the rows after an item's first */
} box_ctx;

static void box_line(void *ud, const char *p, int bytes)
{
    box_ctx *b = ud;
    int ind = b->rows++ ? b->indent : 0;
    if (b->n < b->max) snprintf(b->lines[b->n++], 160, "%*s%.*s", ind, "", bytes, p);
}

/* One item of the help: a key or command in a column of width col, then its text; a text that does
 * not fit goes on under itself (col 0: a paragraph). */
static void box_item(box_ctx *b, const char *key, int col, const char *text, int iw)
{
    char first[400];
    snprintf(first, sizeof first, "%-*s%s", col, key, text);
    b->indent = col;
    b->rows = 0;
    if (!first[0]) {   /* a blank row between groups */
        box_line(b, "", 0);
        return;
    }
    if (col == 0 || conv_wrap(first, iw, NULL, NULL) == 1) {
        b->indent = 0;
        conv_wrap(first, iw, box_line, b);
        return;
    }
    /* the text wrapped in its own column, the key before its first row */
    box_ctx c = *b;
    c.indent = col;
    c.rows = 0;
    int before = b->n;
    conv_wrap(text, iw - col, box_line, &c);
    if (c.n > before) {
        char row[160];
        snprintf(row, sizeof row, "%-*s%s", col, key, b->lines[before]);
        snprintf(b->lines[before], 160, "%s", row);
    }
    b->n = c.n;
}

/* Every key (as bound now) and command, wrapped to the screen's width; arrows scroll it. */
static void draw_help(tui *t, int H, int W, int attr)
{
    static char lines[200][160];
    box_ctx b = { lines, 0, 200, 0, 0 };
    int w = W - 2 < 78 ? W - 2 : 78, iw = w - 4;
    if (iw < 24) return;
    box_item(&b, "", 0, "kvchat keys and commands", iw);
    box_item(&b, "", 0, "", iw);
    for (int a = 0; a < KA_COUNT; a++) {
        char k[16];
        keymap_key_name(t->km.key[a], k, sizeof k);
        box_item(&b, k, 9, keymap_action_help(a), iw);
    }
    static const char *keys[][2] = {
        { "Ctrl-C", "stop the answer or the prefill; idle: close what is open, clear the input, then quit (asks)" },
        { "Ctrl-Q", "quit at once" },
        { "Esc", "close a view or a list" },
        { "Enter", "send; Alt-Enter or Ctrl-J: a new line; a paste is inserted as it is" },
        { "Ctrl-A/E", "the line's start, end; Ctrl-K/U kill to its end, start; Ctrl-W, Alt-Backspace the word "
                      "before; Ctrl-Y yank; Alt-B/F a word back, forward; Up/Down lines, then the history; "
                      "Ctrl-R search the history" },
        { "", "" },
        { "", "A question typed while a document loads or an answer streams waits, and is asked when that "
              "ends." },
        { "", "" },
        { "/open [PATH]", "open a document (no PATH: the file picker; ~ and quotes work)" },
        { "/policy [SPEC]", "switch policy (no SPEC: the picker); a spec of one half keeps the other" },
        { "/sessions", "the session browser; /resume ID continues one" },
        { "/settings", "sampling, answer length and budget" },
        { "/regen", "another answer to the last question (a branch)" },
        { "/edit N TEXT", "ask TEXT instead of question N (a branch)" },
        { "/compare P1,P2 Q", "answer Q under these policies side by side" },
        { "/find TEXT", "search the conversation (^F again: older)" },
        { "/copy [N] [FILE]", "answer N (the last) to the clipboard (OSC 52), and to FILE" },
        { "/mouse", "mouse capture on/off" },
        { "/help  /quit", "" },
        { "", "" },
        { "", "Keys are remapped in the settings file: key.ACTION = KEY." },
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        box_item(&b, keys[i][0], keys[i][0][0] == '/' ? 18 : keys[i][0][0] ? 9 : 0, keys[i][1], iw);
    if (b.n + 1 <= H - 4) box_item(&b, "", 0, "Any key closes this.", iw);
    /* taller than the screen: the rows that fit, scrolled by the arrows, and a last row saying so */
    int more = b.n > H - 4, n = more ? H - 5 : b.n;
    if (n < 1) return;
    if (t->help_top > b.n - n) t->help_top = b.n - n;
    if (t->help_top < 0) t->help_top = 0;
    int rows = n + more, y0 = (H - rows) / 2 - 1, x0 = (W - w) / 2;
    if (x0 < 0) x0 = 0;
    if (y0 < 1) y0 = 1;
    attron(attr);
    for (int i = -1; i <= rows; i++) {
        mvhline(y0 + i, x0, ' ', w);
        if (i >= 0 && i < n) mvaddnstr(y0 + i, x0 + 2, lines[t->help_top + i], iw);
    }
    if (more)
        mvaddnstr(y0 + n, x0 + 2, t->help_top + n < b.n ? "-- more: Down, PgDn (any other key closes this) --"
                                                         : "-- the end: Up, PgUp back (any other key closes this) --", iw);
    attroff(attr);
}

/* ---- the status bar */

/* What is happening now: ready, a prefill's progress, the answer's tokens, speed and time, a
 * comparison's column. */
static void state_text(const uw_view *v, char *buf, size_t cap)
{
    double el = v->phase_start > 0 ? now_s() - v->phase_start : 0;
    if (!v->busy) {
        snprintf(buf, cap, "ready");
    } else if (v->phase == VIEW_PREFILL) {
        double rate = el > 0 ? (double)v->done / el : 0;
        snprintf(buf, cap, "prefill %lld/%lld tokens (%.0f%%), %.0f tok/s, %.0f s left (Ctrl-C cancels)",
                 (long long)v->done, (long long)v->total, 100.0 * (double)v->done / (double)(v->total ? v->total : 1),
                 rate, rate > 0 ? (double)(v->total - v->done) / rate : 0.0);
    } else if (v->phase == VIEW_ANSWER) {
        snprintf(buf, cap, "answering: %lld tokens, %.1f tok/s, %.1f s (Ctrl-C stops)", (long long)v->answer_tokens,
                 el > 0 ? (double)v->answer_tokens / el : 0.0, el);
    } else if (v->phase == VIEW_COMPARE) {
        snprintf(buf, cap, "compare: %d policies together, %lld tokens, %.1f s (Ctrl-C stops)", v->n_columns,
                 (long long)v->answer_tokens, el);
    } else {
        snprintf(buf, cap, "working");
    }
}

static void draw_status(const uw_view *v, int W, int attr)
{
    char state[300], conv_name[400], policy[320], speed[48];
    state_text(v, state, sizeof state);
    /* the conversation: its session id and title (the document's name when the title is another) */
    if (!v->doc[0])
        snprintf(conv_name, sizeof conv_name, "no document");
    else if (v->session_id && v->title[0] && strcmp(v->title, v->doc))
        snprintf(conv_name, sizeof conv_name, "#%lld %.120s: %.200s", (long long)v->session_id, v->title, v->doc);
    else if (v->session_id)
        snprintf(conv_name, sizeof conv_name, "#%lld %.250s", (long long)v->session_id, v->doc);
    else
        snprintf(conv_name, sizeof conv_name, "%.250s", v->doc);
    snprintf(policy, sizeof policy, "%.250s%s", v->policy,
             !v->policy_pending ? "" : v->have_doc ? " (next answer)" : " (next document)");
    double live = v->busy && v->phase == VIEW_ANSWER && v->phase_start > 0 ? now_s() - v->phase_start : 0;
    if (live > 0)
        snprintf(speed, sizeof speed, "%.1f tok/s", (double)v->answer_tokens / live);
    else
        snprintf(speed, sizeof speed, "%.1f tok/s", v->tok_s);
    char status[2048], kv[128];
    /* the KV cache: the share of the token rows it holds of a cache where every layer holds the
     * whole context, and its memory (the side panel has that cache's). Under any policy, full
     * included, a model's sliding-window layers hold only their window: said, so that "full" at
     * under 100% reads right. */
    double mib = (double)v->kv_held / (1 << 20);
    if (v->tokens_full <= 0)
        snprintf(kv, sizeof kv, "KV empty");
    else if (v->swa_window > 0 && v->swa_window < v->ctx_used)
        snprintf(kv, sizeof kv, "KV %.0f%% of context (sliding-window layers hold %d; %.2f MiB)",
                 100.0 * kept_share(v), v->swa_window, mib);
    else
        snprintf(kv, sizeof kv, "KV %.0f%% of context (%.2f MiB)", 100.0 * kept_share(v), mib);
    /* the context meter: positions used of the limit */
    /* the speed beside what gives it: the GPU or the CPU's threads */
    snprintf(status, sizeof status, " kvchat%s | %s | %s | %s | ctx %lld/%lld | %s | %s on %s | %s",
             v->base_model ? " (base model)" : "", state, conv_name, policy, (long long)v->ctx_used,
             (long long)v->ctx_limit, kv, speed, v->device, v->model);
    attron(attr);
    mvhline(0, 0, ' ', W);
    mvaddnstr(0, 0, status, W);
    attroff(attr);
}

/* ---- the input */

/* Rows below the conversation: the pending questions' line, the rule, the input's rows. */
static int input_rows(tui *t, int W)
{
    if (t->finding || t->confirm_quit) return 1;
    int r, c;
    int rows = ed_layout(t->ed.buf, t->ed.len, t->ed.cur, W - 2, NULL, 0, &r, &c);
    if (t->ed.searching) rows = 1;
    return rows > INPUT_ROWS ? INPUT_ROWS : rows;
}

static void draw_input(tui *t, int H, int W, int rows, int *cy, int *cx)
{
    int y0 = H - rows;
    if (t->confirm_quit) {
        attron(A_BOLD);
        mvaddnstr(y0, 0, "Quit kvchat? y quits, any other key stays (F10 and Ctrl-Q quit at once)", W);
        attroff(A_BOLD);
        *cy = y0;
        *cx = W - 1 < 72 ? W - 1 : 72;
        return;
    }
    if (t->finding) {
        char line[400];
        if (!t->find[0])
            snprintf(line, sizeof line, "find: ");
        else if (t->find_n == 0)
            snprintf(line, sizeof line, "find (no match): %s", t->find);
        else
            snprintf(line, sizeof line, "find (%d of %d; ^F/Up older, Down newer, Enter stays, Esc back): %s",
                     t->find_n - t->find_k, t->find_n, t->find);
        mvaddnstr(y0, 0, line, W);
        *cy = y0;
        *cx = (int)strlen(line) < W - 1 ? (int)strlen(line) : W - 1;
        return;
    }
    if (t->ed.searching) {
        char line[600];
        snprintf(line, sizeof line, "(history search)'%.100s': %.400s", t->ed.pat, t->ed.match >= 0 ? t->ed.buf : "");
        for (char *p = line; *p; p++)
            if (*p == '\n') *p = ' ';
        mvaddnstr(y0, 0, line, W);
        *cy = y0;
        *cx = 17 + (int)strlen(t->ed.pat) < W - 1 ? 17 + (int)strlen(t->ed.pat) : W - 1;
        return;
    }
    size_t starts[256];
    int cr, cc;
    int n = ed_layout(t->ed.buf, t->ed.len, t->ed.cur, W - 2, starts, 256, &cr, &cc);

    /* the rows shown keep the cursor's row in view */
    int first = cr >= rows ? cr - rows + 1 : 0;
    for (int r = 0; r < rows && first + r < n && first + r < 256; r++) {
        size_t a = starts[first + r], b = first + r + 1 < n && first + r + 1 < 256 ? starts[first + r + 1] : t->ed.len;
        while (b > a && (t->ed.buf[b - 1] == '\n')) b--;
        mvaddstr(y0 + r, 0, first + r == 0 ? "> " : "  ");
        mvaddnstr(y0 + r, 2, t->ed.buf + a, (int)(b - a));
    }
    *cy = y0 + cr - first;
    *cx = 2 + cc;
}

static void draw(tui *t)
{
    uw_view v;
    uw_get_view(t->w, &v);
    erase();
    int H = LINES, W = COLS;
    int panel = W >= 100 ? 34 : 0;
    int conv_w = W - (panel ? panel + 1 : 0);
    int bar_attr = t->color ? COLOR_PAIR(C_BAR) : A_REVERSE;
    draw_status(&v, W, bar_attr);
    int rows = input_rows(t, W), pending = t->n_queue > 0;
    int bottom = H - rows - 2 - pending;   /* the conversation's last row */
    if (t->seen_open)
        draw_seen(t, 1, bottom, conv_w - 1);
    else {
        conv_attrs ca;
        for (int k = 0; k <= E_SEP; k++) {
            static const int pair[] = { C_USER, C_ANSWER, C_INFO, C_ERROR, C_EVENT, C_HEAD, C_HEAD };
            ca.kind[k] = t->color ? COLOR_PAIR(pair[k]) : 0;
        }
        if (t->color) {
            ca.kind[E_USER] |= A_BOLD;
            ca.kind[E_ERROR] |= A_BOLD;
        } else {
            ca.kind[E_USER] = A_BOLD;
            ca.kind[E_ERROR] = A_STANDOUT;
        }
        ca.event = t->color ? COLOR_PAIR(C_EVENT) | A_BOLD : A_UNDERLINE;
        ca.heading = t->color ? COLOR_PAIR(C_HEAD) | A_BOLD : A_BOLD;
        ca.more = bar_attr;
        ca.match = A_REVERSE;
        conv_draw(&t->cv, 1, bottom, conv_w - 1, &ca);
    }
    if (panel) {
        int a = t->color ? COLOR_PAIR(C_DIM) : 0;
        attron(a);
        mvvline(1, conv_w, ACS_VLINE, bottom);
        attroff(a);
        draw_panel(t, &v, 1, bottom, conv_w + 2, panel - 1);
    }
    if (pending) {
        char line[600];
        snprintf(line, sizeof line, "pending (asked when the current job ends; Ctrl-C cancels it): %s%s", t->queue[0],
                 t->n_queue > 1 ? " ..." : "");
        for (char *p = line; *p; p++)
            if (*p == '\n') *p = ' ';
        attron(A_BOLD);
        mvaddnstr(bottom + 1, 0, line, W);
        attroff(A_BOLD);
    }
    mvhline(H - rows - 1, 0, ACS_HLINE, W);
    int cy, cx;
    draw_input(t, H, W, rows, &cy, &cx);
    if (t->help) draw_help(t, H, W, bar_attr);
    menu_attrs ma = { t->color ? COLOR_PAIR(C_DIM) : 0, t->color ? COLOR_PAIR(C_HEAD) | A_BOLD : A_BOLD,
                      t->color ? COLOR_PAIR(C_ERROR) | A_BOLD : A_STANDOUT };
    if (t->overlay == OV_SESSIONS) browser_draw(&t->br, &ma);
    if (t->overlay == OV_POLICY) menu_draw(&t->pp.m, &ma);
    if (t->overlay == OV_SETTINGS) menu_draw(&t->st.m, &ma);
    if (t->overlay == OV_FILES) menu_draw(&t->fp.m, &ma);
    move(cy, cx);
    refresh();
}

/* ---- overlays, views and actions */

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
        settings_open(&t->st, &v, t->cfg->groups, t->cfg->n_groups);
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
    t->cv.answering = 0;   /* whatever it started writes a new entry */
}

static void overlay_key(tui *t, int ch, int is_key)
{
    uw_view v;
    uw_get_view(t->w, &v);
    int done = 0;
    switch (t->overlay) {
    case OV_SESSIONS: done = browser_key(&t->br, t->w, v.session_id, ch, is_key); break;
    case OV_POLICY:
        done = policy_picker_key(&t->pp, t->w, v.policy, v.budget, ch, is_key);
        if (done && t->pp.note[0]) say(t, E_INFO, "%s", t->pp.note);
        t->pp.note[0] = 0;
        break;
    case OV_SETTINGS: done = settings_key(&t->st, t->w, v.policy, ch, is_key); break;
    case OV_FILES: done = file_picker_key(&t->fp, t->w, ch, is_key); break;
    }
    if (done) close_overlay(t);
}

static void close_seen(tui *t)
{
    t->seen_open = 0;
    uw_seen_live(t->w, 0);
}

static void toggle_seen(tui *t)
{
    if (t->seen_open)
        close_seen(t);
    else if (uw_request_seen(t->w))
        say(t, E_ERROR, "busy: the view opens when the current job ends");
}

static void set_mouse(tui *t, int on)
{
    t->mouse = on;
    mousemask(on ? BUTTON4_PRESSED
#ifdef BUTTON5_PRESSED
                       | BUTTON5_PRESSED
#endif
                 : 0,
              NULL);
}

static void start_find(tui *t)
{
    if (t->finding) {   /* again: an older match */
        if (t->find_n && t->find_k + 1 < t->find_n) conv_find(&t->cv, t->find, ++t->find_k);
        return;
    }
    t->finding = 1;
    t->find[0] = 0;
    t->find_k = t->find_n = 0;
    t->find_scroll = t->cv.scroll;
}

static void action(tui *t, int a)
{
    int page = LINES / 2;
    switch (a) {
    case KA_HELP: t->help = 1; t->help_top = 0; break;
    case KA_SEEN: toggle_seen(t); break;
    case KA_SESSIONS: open_overlay(t, OV_SESSIONS); break;
    case KA_POLICY: open_overlay(t, OV_POLICY); break;
    case KA_SETTINGS: open_overlay(t, OV_SETTINGS); break;
    case KA_OPEN: open_overlay(t, OV_FILES); break;
    case KA_REGEN:
        if (uw_regenerate(t->w)) say(t, E_ERROR, "busy: wait for the current job or press Ctrl-C");
        else t->cv.answering = 0;
        break;
    case KA_SCROLL_UP:
        t->seen_follow = 0;
        if (t->seen_open) t->seen_scroll = t->seen_scroll > page ? t->seen_scroll - page : 0;
        else conv_scroll(&t->cv, page);
        break;
    case KA_SCROLL_DOWN:
        if (t->seen_open) t->seen_scroll += page;
        else conv_scroll(&t->cv, -page);
        break;
    case KA_TOP:
        t->seen_follow = 0;
        if (t->seen_open) t->seen_scroll = 0;
        else conv_scroll_to(&t->cv, 0);
        break;
    case KA_BOTTOM:
        if (t->seen_open) t->seen_follow = 1;
        else conv_scroll_to(&t->cv, 1);
        break;
    case KA_FIND: start_find(t); break;
    case KA_MOUSE:
        set_mouse(t, !t->mouse);
        say(t, E_INFO, t->mouse ? "mouse capture on: the wheel scrolls (%s turns it off)"
                                : "mouse capture off: the terminal selects and copies text (%s turns it back on)",
            "the mouse key or /mouse");
        break;
    case KA_QUIT: t->quit = 1; break;
    }
}

/* ---- copying */

static void base64(const unsigned char *in, size_t n, char *out)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    out[o] = 0;
}

/* An answer's text without the event markers (malloc'd). */
static char *plain_text(const char *s)
{
    char *o = malloc(strlen(s) + 1), *d = o;
    if (!o) return NULL;
    for (int in = 0; *s; s++) {
        if (*s == MARK_ON) in = 1;
        else if (*s == MARK_OFF) in = 0;
        else if (!in) *d++ = *s;
    }
    *d = 0;
    return o;
}

/* "/copy [N] [FILE]": answer N (the last when no N) to the terminal's clipboard (OSC 52: the
 * terminal decides whether to allow it) and, with FILE, into that new file. */
static void copy_answer(tui *t, const char *arg)
{
    char *end;
    long n = strtol(arg, &end, 10);
    if (end == arg || (*end && *end != ' ')) {
        n = 0;
        end = (char *)arg;
    }
    char file[1024];
    path_expand(end, file, sizeof file);
    const char *src = conv_answer(&t->cv, (int)n);
    if (!src) {
        if (n)
            say(t, E_ERROR, "there is no answer %ld here (/copy N counts the answers shown, 1 the first)", n);
        else
            say(t, E_ERROR, "no answer to copy yet");
        return;
    }
    char *text = plain_text(src);
    if (!text) return;
    size_t len = strlen(text);
    char *b64 = malloc(len / 3 * 4 + 8);
    if (b64) {
        base64((const unsigned char *)text, len, b64);
        fputs("\033]52;c;", stdout);
        fputs(b64, stdout);
        fputs("\a", stdout);
        fflush(stdout);
        free(b64);
    }
    if (file[0]) {
        /* a new file only: nothing is overwritten, and no link is followed */
        int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        int bad = fd < 0;
        if (!bad) {
            bad = write(fd, text, len) != (ssize_t)len || write(fd, "\n", 1) != 1;
            if (close(fd)) bad = 1;
        }
        if (bad)
            say(t, E_ERROR, "cannot write %s: %s", file, errno == EEXIST ? "it exists (give a new name)" : strerror(errno));
        else
            say(t, E_INFO, "answer copied to the clipboard (OSC 52) and written to %s (%zu bytes)", file, len);
    } else {
        say(t, E_INFO, "answer copied to the clipboard through the terminal (OSC 52; %zu bytes); /copy N FILE also "
                       "writes a file", len);
    }
    free(text);
}

/* ---- commands */

static const struct {
    const char *name, *usage;
} usages[] = {
    { "/compare", "usage: /compare P1[,P2...] QUESTION (decode-time policies, e.g. /compare chess,quest What is it about?)" },
    { "/edit", "usage: /edit N NEW QUESTION (N: the question's number, 1 for the first)" },
    { "/resume", "usage: /resume ID (a session's id or name; F3 lists them)" },
    { "/find", "usage: /find TEXT (or ^F and type)" },
};

static void busy_error(tui *t) { say(t, E_ERROR, "busy: wait for the current job or press Ctrl-C (your text stays below)"); }

/* "/policy SPEC": a spec naming one stage replaces that half of the current spec and keeps the
 * other (said in a note); "full" alone is full attention everywhere. 0 when busy (the input stays). */
static int policy_command(tui *t, const char *spec)
{
    uw_view v;
    uw_get_view(t->w, &v);
    if (v.busy) return busy_error(t), 0;
    char combined[512], err[700];
    const char *use = spec;
    if (!strchr(spec, '+') && strcmp(spec, POL_FULL) != 0) {
        policy_combine(v.policy, spec, combined, sizeof combined);
        if (strcmp(combined, spec) != 0) use = combined;
    }
    char note[400];
    if (policy_switch(t->w, use, v.budget, note, sizeof note, err, sizeof err)) {
        say(t, E_ERROR, "%s", err);
        return 1;
    }
    if (note[0]) say(t, E_INFO, "%s", note);
    if (use == combined) {
        char kept[512];
        const char *plus = strchr(combined, '+');
        int first_kept = strncmp(combined, spec, strcspn(spec, ":")) != 0;
        snprintf(kept, sizeof kept, "%.*s", first_kept ? (int)(plus ? plus - combined : (long)strlen(combined)) : 500,
                 first_kept ? combined : plus ? plus + 1 : "");
        say(t, E_INFO, "%s replaces its half of %s; the other half (%s) stays: %s (a spec with + sets both)", spec,
            v.policy, kept, combined);
    }
    t->cv.answering = 0;
    return 1;
}

/* Returns 1 when the input is done with (cleared), 0 when it stays (busy: nothing is lost). */
static int command(tui *t, const char *line)
{
    char name[32], arg[ED_MAX];
    size_t nl = strcspn(line, " \n");
    snprintf(name, sizeof name, "%.*s", (int)(nl < sizeof name ? nl : sizeof name - 1), line);
    const char *a = line + nl;
    a += strspn(a, " \n");
    snprintf(arg, sizeof arg, "%s", a);
    for (size_t i = strlen(arg); i > 0 && (arg[i - 1] == ' ' || arg[i - 1] == '\n'); i--) arg[i - 1] = 0;
    for (size_t i = 0; i < sizeof usages / sizeof *usages; i++)
        if (!strcmp(name, usages[i].name) && !arg[0]) {
            say(t, E_ERROR, "%s", usages[i].usage);
            return 1;
        }
    if (!strcmp(name, "/quit") || !strcmp(name, "/q")) {
        t->quit = 1;
    } else if (!strcmp(name, "/help")) {
        t->help = 1;
        t->help_top = 0;
    } else if (!strcmp(name, "/settings")) {
        open_overlay(t, OV_SETTINGS);
    } else if (!strcmp(name, "/sessions")) {
        open_overlay(t, OV_SESSIONS);
    } else if (!strcmp(name, "/mouse")) {
        action(t, KA_MOUSE);
    } else if (!strcmp(name, "/open")) {
        char path[1024];
        path_expand(arg, path, sizeof path);
        if (!path[0]) open_overlay(t, OV_FILES);
        else if (uw_open(t->w, path)) return busy_error(t), 0;
        else t->cv.answering = 0;
    } else if (!strcmp(name, "/policy")) {
        if (!arg[0]) open_overlay(t, OV_POLICY);
        else if (!policy_command(t, arg)) return 0;
    } else if (!strcmp(name, "/compare")) {
        if (uw_compare(t->w, arg)) return busy_error(t), 0;
        say(t, E_INFO, "%s", line);
    } else if (!strcmp(name, "/edit")) {
        if (uw_edit(t->w, arg)) return busy_error(t), 0;
        t->cv.answering = 0;
    } else if (!strcmp(name, "/regen")) {
        if (uw_regenerate(t->w)) return busy_error(t), 0;
        t->cv.answering = 0;
    } else if (!strcmp(name, "/resume")) {
        if (uw_resume(t->w, arg)) return busy_error(t), 0;
        t->cv.answering = 0;
    } else if (!strcmp(name, "/find")) {
        t->finding = 1;
        t->find_scroll = t->cv.scroll;
        snprintf(t->find, sizeof t->find, "%.*s", (int)sizeof t->find - 1, arg);
        t->find_k = 0;
        t->find_n = conv_find(&t->cv, t->find, 0);
    } else if (!strcmp(name, "/copy")) {
        copy_answer(t, arg);
    } else {
        say(t, E_ERROR, "unknown command %.100s (F1 lists the commands)", name);
    }
    return 1;
}

static void ask_now(tui *t, const char *q)
{
    conv_add(&t->cv, E_USER, q);
    t->cv.answering = 0;
}

/* The input history to its file, after each entry: a crash or a kill loses nothing typed. A
 * failure is said once, and the history is not written again this session. */
static void save_history(tui *t)
{
    char err[1200];
    if (!t->hist_path[0] || ed_history_save(&t->ed, t->hist_path, err, sizeof err) == 0) return;
    say(t, E_ERROR, "input history: %s (not saved this session)", err);
    t->hist_path[0] = 0;
}

static void submit(tui *t)
{
    char line[ED_MAX];
    snprintf(line, sizeof line, "%s", t->ed.buf);
    if (!line[strspn(line, " \n")]) return;
    conv_scroll_to(&t->cv, 1);
    if (line[0] == '/') {
        if (command(t, line)) {
            ed_history_add(&t->ed, line);
            ed_clear(&t->ed);
            save_history(t);
        }
        return;
    }
    ed_history_add(&t->ed, line);
    ed_clear(&t->ed);
    save_history(t);
    if (t->n_queue == 0 && uw_ask(t->w, line) == 0) {
        ask_now(t, line);
        return;
    }
    /* a job runs (a document loading): the question waits and is asked when it ends */
    if (t->n_queue == MAX_QUEUE) {
        say(t, E_ERROR, "%d questions are waiting already; this one stays in the input", MAX_QUEUE);
        ed_set(&t->ed, line);
        return;
    }
    t->queue[t->n_queue++] = strdup(line);
}

/* The job ended: ask the next waiting question, or (the job failed) give them back to the input. */
static void run_queue(tui *t, int failed)
{
    if (t->n_queue == 0) return;
    if (failed) {
        char all[ED_MAX] = "";
        for (int i = 0; i < t->n_queue; i++) {
            size_t l = strlen(all);
            snprintf(all + l, sizeof all - l, "%s%s", l ? "\n" : "", t->queue[i]);
            free(t->queue[i]);
        }
        t->n_queue = 0;
        if (t->ed.len) {
            size_t l = strlen(all);
            snprintf(all + l, sizeof all - l, "\n%.*s", (int)(sizeof all - l - 2), t->ed.buf);
        }
        ed_set(&t->ed, all);
        say(t, E_INFO, "the question waiting for that job is back in the input line");
        return;
    }
    if (uw_ask(t->w, t->queue[0]) != 0) return;
    ask_now(t, t->queue[0]);
    free(t->queue[0]);
    memmove(t->queue, t->queue + 1, sizeof *t->queue * (size_t)(--t->n_queue));
}

/* ---- keys */

/* Keys while a search of the conversation is typed. */
static void find_key(tui *t, int ch, int is_key)
{
    if ((!is_key && (ch == '\r' || ch == '\n')) || (is_key && ch == KEY_ENTER)) {
        t->finding = 0;   /* the view stays where the match is; the highlight goes */
        t->cv.find[0] = 0;
        return;
    }
    if (!is_key && (ch == 27 || ch == 7)) {
        t->finding = 0;
        t->cv.find[0] = 0;
        t->cv.scroll = t->find_scroll;
        return;
    }
    if ((is_key && ch == KEY_UP) || (!is_key && ch == 6)) {
        if (t->find_k + 1 < t->find_n) conv_find(&t->cv, t->find, ++t->find_k);
        return;
    }
    if (is_key && ch == KEY_DOWN) {
        if (t->find_k > 0) conv_find(&t->cv, t->find, --t->find_k);
        return;
    }
    size_t n = strlen(t->find);
    if (!is_key && ch == 21) {   /* Ctrl-U: the search from its start */
        t->find[0] = 0;
    } else if ((is_key && ch == KEY_BACKSPACE) || (!is_key && (ch == 127 || ch == 8))) {
        while (n > 0 && ((unsigned char)t->find[--n] & 0xC0) == 0x80) {}
        t->find[n] = 0;
    } else if (!is_key && ch >= 32) {
        char mb[8];
        mbstate_t st;
        memset(&st, 0, sizeof st);
        size_t k = wcrtomb(mb, (wchar_t)ch, &st);
        if (k == (size_t)-1 || n + k >= sizeof t->find) return;
        memcpy(t->find + n, mb, k);
        t->find[n + k] = 0;
    } else {
        return;
    }
    t->find_k = 0;
    t->find_n = t->find[0] ? conv_find(&t->cv, t->find, 0) : 0;
    if (!t->find[0]) {
        t->cv.find[0] = 0;
        t->cv.scroll = t->find_scroll;
    }
}

/* Ctrl-C: stop the job (a waiting question goes back to the input); else close what is open; else
 * clear the input (Up brings it back); else ask before quitting. */
static void ctrl_c(tui *t)
{
    uw_view v;
    uw_get_view(t->w, &v);
    if (v.busy) {
        uw_cancel(t->w);
        run_queue(t, 1);
    } else if (t->overlay) {
        close_overlay(t);
    } else if (t->seen_open) {
        close_seen(t);
    } else if (t->finding) {
        find_key(t, 27, 0);
    } else if (t->ed.searching) {
        ed_key(&t->ed, 7, 0, 0);
    } else if (t->ed.len) {
        ed_history_add(&t->ed, t->ed.buf);
        ed_clear(&t->ed);
    } else {
        t->confirm_quit = 1;
    }
}

static void key(tui *t, wint_t ch, int is_key, int alt)
{
    if (t->help) {   /* arrows scroll the help; any other key closes it */
        if (is_key && (ch == KEY_DOWN || ch == KEY_NPAGE)) t->help_top += ch == KEY_DOWN ? 1 : LINES / 2;
        else if (is_key && (ch == KEY_UP || ch == KEY_PPAGE)) t->help_top -= ch == KEY_UP ? 1 : LINES / 2;
        else if (!(is_key && ch == KEY_RESIZE)) t->help = 0;
        return;
    }
    if (t->confirm_quit) {
        t->confirm_quit = 0;
        if (!is_key && (ch == 'y' || ch == 'Y' || ch == 3)) t->quit = 1;
        return;
    }
    if (!is_key && !alt && ch == 3) {
        ctrl_c(t);
        return;
    }
    if (!is_key && !alt && ch == 17) {   /* Ctrl-Q */
        t->quit = 1;
        return;
    }
    if (is_key && ch == KEY_RESIZE) return;
    if (t->overlay) {
        overlay_key(t, (int)ch, is_key);
        return;
    }
    if (t->seen_open && !is_key && !alt && ch == 27) {
        close_seen(t);
        return;
    }
    if (t->finding) {   /* the find key again: an older match; anything else edits the search */
        if (keymap_lookup(&t->km, (int)ch, is_key) == KA_FIND) start_find(t);
        else find_key(t, (int)ch, is_key);
        return;
    }
    if (!t->ed.searching && !alt) {
        int a = keymap_lookup(&t->km, (int)ch, is_key);
        if (a >= 0) {
            action(t, a);
            return;
        }
    }
    if (is_key && ch == KEY_MOUSE) {
        MEVENT me;
        if (getmouse(&me) == OK) {
            if (me.bstate & BUTTON4_PRESSED) conv_scroll(&t->cv, 3);
#ifdef BUTTON5_PRESSED
            if (me.bstate & BUTTON5_PRESSED) conv_scroll(&t->cv, -3);
#endif
        }
        return;
    }
    if (!is_key && !alt && ch == 4 && t->ed.len == 0) {   /* Ctrl-D on an empty line */
        t->quit = 1;
        return;
    }
    if (ed_key(&t->ed, (int)ch, is_key, alt) == ED_SUBMIT) submit(t);
}

/* One key as typed: Escape and the key after it are Alt and that key; a bracketed paste is text. */
static void read_key(tui *t, int r, wint_t ch)
{
    int is_key = r == KEY_CODE_YES;
    if (is_key && ch == KEY_PASTE_BEGIN) {
        t->pasting = 1;
        return;
    }
    if (is_key && ch == KEY_PASTE_END) {
        t->pasting = 0;
        return;
    }
    if (t->pasting) {
        if (is_key) return;
        if (t->overlay) {   /* into the list's filter or prompt; a newline ends nothing there */
            if (ch != '\r' && ch != '\n') overlay_key(t, (int)ch, 0);
            return;
        }
        if (t->finding || t->ed.searching) return;
        char mb[8];
        mbstate_t st;
        memset(&st, 0, sizeof st);
        size_t k = ch == '\r' || ch == '\n' ? (mb[0] = '\n', 1) : wcrtomb(mb, (wchar_t)ch, &st);
        if (k != (size_t)-1 && (ch >= 32 || ch == '\r' || ch == '\n' || ch == '\t')) ed_insert(&t->ed, mb, k);
        return;
    }
    int alt = 0;
    /* Escape with a key right behind it is Alt and that key, where the input has a use for it (a
     * view or a list closes on Escape, and the key after it is a key of its own) */
    int plain = !t->overlay && !t->seen_open && !t->finding && !t->help && !t->confirm_quit;
    if (!is_key && ch == 27 && plain) {
        timeout(0);
        int c2 = getch();
        timeout(50);
        int pair = c2 == 'b' || c2 == 'f' || c2 == 'd' || c2 == '\r' || c2 == '\n' || c2 == 127 || c2 == 8;
        if (pair) {
            alt = 1;
            ch = (wint_t)c2;
        } else if (c2 != ERR && c2 < KEY_MIN) {
            ungetch(c2);   /* a byte: handled on its own next time round */
        } else if (c2 != ERR) {   /* a key code cannot be pushed back: both now */
            key(t, ch, is_key, 0);
            key(t, (wint_t)c2, 1, 0);
            return;
        }
    }
    key(t, ch, is_key, alt);
}

/* ---- what the worker says */

static void drain(tui *t)
{
    uw_event ev;
    while (uw_poll(t->w, &ev)) {
        switch (ev.kind) {
        case UW_TEXT:
            conv_append(&t->cv, ev.text);
            break;
        case UW_PROGRESS:
            break;   /* the status bar reads the view */
        case UW_DONE:
            if (ev.a == 1 && t->cv.answering) conv_append_mark(&t->cv, " [stopped]");   /* Ctrl-C: the partial answer stays, marked */
            t->cv.answering = 0;
            if (t->events) {   /* the answer's events, after it rather than inside its sentences */
                for (char *line = strtok(t->events, "\n"); line; line = strtok(NULL, "\n"))
                    conv_add(&t->cv, E_EVENT, line);
                free(t->events);
                t->events = NULL;
            }
            if (ev.text[0]) say(t, E_INFO, "%s", ev.text);
            if (ev.b == 3) {   /* a comparison is ready */
                uw_compared c[8];
                int n = uw_take_compared(t->w, c);
                if (n > 0) conv_add_compare(&t->cv, c, n);
            }
            if (ev.b == 2) {   /* the "what the model sees" spans are ready */
                for (int i = 0; i < t->n_seen; i++) free(t->seen[i].text);
                free(t->seen);
                t->seen = uw_take_seen(t->w, &t->n_seen);
                t->seen_open = 1;
                t->seen_scroll = 0;
                t->seen_follow = 0;
                uw_seen_live(t->w, 1);
            }
            run_queue(t, t->job_failed);
            t->job_failed = 0;
            break;
        case UW_ERROR:
            t->job_failed = 1;
            say(t, E_ERROR, "%s", ev.text);
            break;
        case UW_INFO:
            say(t, E_INFO, "%s", ev.text);
            break;
        case UW_EVENT: {   /* kept until the answer ends, and shown after it (answer page N says where) */
            size_t had = t->events ? strlen(t->events) : 0, add = strlen(ev.text);
            char *grown = realloc(t->events, had + add + 2);
            if (!grown) break;
            memcpy(grown + had, ev.text, add);
            memcpy(grown + had + add, "\n", 2);
            t->events = grown;
            break;
        }
        case UW_PAST_USER:
            t->cv.answering = 0;
            conv_add(&t->cv, E_USER, ev.text);
            break;
        case UW_PAST_ANSWER:
            conv_add(&t->cv, E_ANSWER, ev.text);
            t->cv.answering = 0;
            break;
        case UW_SEEN:
            if (t->seen_open) {
                int n;
                uw_span *sp = uw_take_seen(t->w, &n);
                if (sp) {
                    for (int i = 0; i < t->n_seen; i++) free(t->seen[i].text);
                    free(t->seen);
                    t->seen = sp;
                    t->n_seen = n;
                }
            }
            break;
        case UW_SEPARATOR:
            if (t->cv.n > 0) say(t, E_SEP, "%s", ev.text);   /* the first conversation needs none */
            break;
        }
    }
}

/* The terminal hung up (closed) though no SIGHUP came (the shell that owned it caught it and lives
 * on): every read fails at once, so the loop would spin instead of waiting for keys. */
static int terminal_gone(void)
{
    struct pollfd p = { STDIN_FILENO, POLLIN, 0 };
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
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
    nonl();  /* Enter is \r, Ctrl-J \n: a newline in the input */
    noecho();
    keypad(stdscr, TRUE);
    /* bracketed paste: a pasted text arrives between these, and is inserted, not sent */
    define_key("\033[200~", KEY_PASTE_BEGIN);
    define_key("\033[201~", KEY_PASTE_END);
    fputs("\033[?2004h", stdout);
    fflush(stdout);
    timeout(50);
    tui t;
    memset(&t, 0, sizeof t);
    t.w = w;
    t.km = cfg->keys;
    t.cfg = cfg;
    set_mouse(&t, 1);
    t.color = cfg->color && has_colors();
    if (t.color) {
        start_color();
        use_default_colors();
        /* the screen's colour pairs from the settings (config.h names them) */
        static const int pair_of[COL_COUNT] = { C_USER, C_ANSWER, C_INFO, C_ERROR, C_BAR, C_HEAD,
                                                C_EVENT, C_MAP1, C_MAP2, C_MAP3, C_DIM };
        for (int e = 0; e < COL_COUNT; e++) init_pair((short)pair_of[e], cfg->fg[e], cfg->bg[e]);
    }
    for (int i = 0; i < cfg->n_notes; i++) say(&t, E_ERROR, "%s", cfg->notes[i]);
    /* a document to open, a session to continue, or (neither) the most recent session */
    if (cfg->keep_policy) uw_keep_policy_once(w);
    if (doc)
        uw_open(w, doc);
    else
        uw_resume(w, resume ? resume : "");
    if (ed_history_path(t.hist_path, sizeof t.hist_path) == 0 && ed_history_load(&t.ed, t.hist_path, err, errlen)) {
        say(&t, E_ERROR, "input history: %s", err);
        t.hist_path[0] = 0;   /* what is there is kept, not replaced */
    }
    /* a stop signal leaves like Ctrl-Q: uw_stop below stops the answer, which the worker saves */
    while (!t.quit && !(cfg->stop_signal && *cfg->stop_signal)) {
        drain(&t);
        draw(&t);
        /* bytes, decoded here: ncurses' get_wch waits for more after an invalid byte and drops the
         * characters typed behind it */
        int c = getch();
        if (c == ERR) {
            if (cfg->stop_signal && terminal_gone()) *cfg->stop_signal = SIGHUP;   /* what closing it would have sent */
            continue;
        }
        if (c >= KEY_MIN) {
            read_key(&t, KEY_CODE_YES, (wint_t)c);
            continue;
        }
        unsigned out[2];
        int n = ed_utf8_feed(&t.u8, c, out);
        for (int i = 0; i < n && !t.quit; i++) read_key(&t, OK, (wint_t)out[i]);
    }
    if (t.overlay) close_overlay(&t);
    fputs("\033[?2004l", stdout);
    endwin();
    uw_stop(w);
    conv_free(&t.cv);
    free(t.events);
    ed_free(&t.ed);
    for (int i = 0; i < t.n_queue; i++) free(t.queue[i]);
    for (int i = 0; i < t.n_seen; i++) free(t.seen[i].text);
    free(t.seen);
    return 0;
}
