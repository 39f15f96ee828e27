/* menu.c - a framed list with a filter line and a prompt (see menu.h). */
#define _XOPEN_SOURCE_EXTENDED 1
#include "ui/menu.h"

#include <ncurses.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include "ui/conv.h"

void menu_init(menu *m, const char *title, const char *hint, int filterable)
{
    menu_free(m);
    memset(m, 0, sizeof *m);
    snprintf(m->title, sizeof m->title, "%s", title);
    snprintf(m->hint, sizeof m->hint, "%s", hint);
    m->filterable = filterable;
}

void menu_clear(menu *m)
{
    for (int i = 0; i < m->n; i++) free(m->rows[i]);
    m->n = 0;
}

void menu_free(menu *m)
{
    menu_clear(m);
    free(m->rows);
    free(m->tag);
    m->rows = NULL;
    m->tag = NULL;
    m->cap = 0;
}

void menu_add(menu *m, int64_t tag, const char *fmt, ...)
{
    if (m->n == m->cap) {
        int nc = m->cap ? m->cap * 2 : 32;
        char **nr = realloc(m->rows, sizeof *nr * (size_t)nc);
        if (!nr) return;
        m->rows = nr;
        int64_t *nt = realloc(m->tag, sizeof *nt * (size_t)nc);
        if (!nt) return;
        m->tag = nt;
        m->cap = nc;
    }
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *r = strdup(buf);
    if (!r) return;
    m->rows[m->n] = r;
    m->tag[m->n++] = tag;
}

/* Move the selection by d rows, skipping headings; stays put when nothing selectable lies there. */
static void move_sel(menu *m, int d)
{
    int s = m->sel, step = d > 0 ? 1 : -1, moved = 0;
    for (int i = s + step; i >= 0 && i < m->n; i += step) {
        if (m->tag[i] < 0) continue;
        s = i;
        if (++moved >= (d > 0 ? d : -d)) break;
    }
    m->sel = s;
}

int64_t menu_tag(const menu *m)
{
    if (m->sel < 0 || m->sel >= m->n || m->tag[m->sel] < 0) return -1;
    return m->tag[m->sel];
}

void menu_select_tag(menu *m, int64_t tag)
{
    for (int i = 0; i < m->n; i++)
        if (m->tag[i] == tag) {
            m->sel = i;
            return;
        }
    /* the first selectable row */
    m->sel = 0;
    if (m->n > 0 && m->tag[0] < 0) move_sel(m, 1);
}

void menu_prompt(menu *m, const char *label, const char *initial)
{
    m->editing = 1;
    snprintf(m->edit_label, sizeof m->edit_label, "%s", label);
    snprintf(m->edit, sizeof m->edit, "%s", initial ? initial : "");
    m->edit_selected = m->edit[0] != 0;
}

void menu_say(menu *m, int error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->msg, sizeof m->msg, fmt, ap);
    va_end(ap);
    m->msg_error = error;
}

/* Remove the last UTF-8 character of s. */
static void drop_last(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && ((unsigned char)s[--n] & 0xC0) == 0x80) {}
    s[n] = 0;
}

/* Ctrl-W: remove the last word of s and the blanks after it. */
static void drop_word(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == ' ') n--;
    while (n > 0 && s[n - 1] != ' ') n--;
    s[n] = 0;
}

static void add_char(char *s, size_t cap, int ch)
{
    char mb[8];
    mbstate_t st;
    memset(&st, 0, sizeof st);
    size_t k = wcrtomb(mb, (wchar_t)ch, &st);
    size_t n = strlen(s);
    if (k == (size_t)-1 || n + k >= cap) return;
    memcpy(s + n, mb, k);
    s[n + k] = 0;
}

int menu_key(menu *m, int ch, int is_key)
{
    int page = LINES - 10 > 1 ? LINES - 10 : 1;
    if (m->editing) {
        if (!is_key && ch == 27) {
            m->editing = 0;
            return MENU_NONE;
        }
        if ((!is_key && (ch == '\n' || ch == '\r')) || (is_key && ch == KEY_ENTER)) {
            m->editing = 0;
            return MENU_EDIT_DONE;
        }
        int was_selected = m->edit_selected;
        m->edit_selected = 0;   /* any key but a typed character keeps the text, now to edit */
        if ((is_key && ch == KEY_BACKSPACE) || (!is_key && (ch == 127 || ch == 8))) {
            drop_last(m->edit);
            return MENU_NONE;
        }
        if (!is_key && ch == 21) {   /* Ctrl-U: the line's start is the prompt's start */
            m->edit[0] = 0;
            return MENU_NONE;
        }
        if (!is_key && ch == 23) {
            drop_word(m->edit);
            return MENU_NONE;
        }
        if (!is_key && ch >= 32) {
            if (was_selected) m->edit[0] = 0;
            add_char(m->edit, sizeof m->edit, ch);
        }
        return MENU_NONE;
    }
    if (is_key) {
        switch (ch) {
        case KEY_UP: move_sel(m, -1); return MENU_NONE;
        case KEY_DOWN: move_sel(m, 1); return MENU_NONE;
        case KEY_PPAGE: move_sel(m, -page); return MENU_NONE;
        case KEY_NPAGE: move_sel(m, page); return MENU_NONE;
        case KEY_HOME: menu_select_tag(m, -2); return MENU_NONE;
        case KEY_END: move_sel(m, m->n); return MENU_NONE;
        case KEY_ENTER: return menu_tag(m) >= 0 ? MENU_PICK : MENU_NONE;
        case KEY_BACKSPACE:
            if (m->filterable && m->filter[0]) {
                drop_last(m->filter);
                return MENU_FILTER;
            }
            return MENU_BACK;
        default: return MENU_UNHANDLED;
        }
    }
    if (ch == 27) return MENU_CLOSE;
    if (ch == '\n' || ch == '\r') return menu_tag(m) >= 0 ? MENU_PICK : MENU_NONE;
    if (ch == 127 || ch == 8) return menu_key(m, KEY_BACKSPACE, 1);
    if (m->filterable && (ch == 21 || ch == 23)) {   /* Ctrl-U, Ctrl-W */
        if (ch == 21) m->filter[0] = 0;
        else drop_word(m->filter);
        return MENU_FILTER;
    }
    if (m->filterable && ch >= 32) {
        add_char(m->filter, sizeof m->filter, ch);
        return MENU_FILTER;
    }
    return MENU_UNHANDLED;
}

/* Rows of text at width cells, wrapped at word boundaries (a row of the list that does not fit goes
 * on under itself). */
typedef struct text_rows {
    int y, x, max_y, attr;
} text_rows;

static void put_row(void *ud, const char *p, int bytes)
{
    text_rows *r = ud;
    if (r->y <= r->max_y) {
        attron(r->attr);
        mvaddnstr(r->y, r->x, p, bytes);
        attroff(r->attr);
    }
    r->y++;
}

static int rows_of(const char *s, int width) { return *s ? conv_wrap(s, width, NULL, NULL) : 1; }

void menu_draw(menu *m, const menu_attrs *at)
{
    int frame_attr = at->frame, heading_attr = at->heading, error_attr = at->error;
    int H = LINES, W = COLS;
    int x0 = W > 84 ? 4 : 1, y0 = 2, w = W - 2 * x0, h = H - 4;
    if (w < 20 || h < 8) return;
    /* the frame, cleared inside */
    for (int y = y0; y < y0 + h; y++) mvhline(y, x0, ' ', w);
    attron(frame_attr);
    mvhline(y0, x0, ACS_HLINE, w);
    mvhline(y0 + h - 1, x0, ACS_HLINE, w);
    mvvline(y0, x0, ACS_VLINE, h);
    mvvline(y0, x0 + w - 1, ACS_VLINE, h);
    mvaddch(y0, x0, ACS_ULCORNER);
    mvaddch(y0, x0 + w - 1, ACS_URCORNER);
    mvaddch(y0 + h - 1, x0, ACS_LLCORNER);
    mvaddch(y0 + h - 1, x0 + w - 1, ACS_LRCORNER);
    attroff(frame_attr);
    attron(heading_attr);
    mvprintw(y0, x0 + 2, " %.*s ", w - 6, m->title);
    attroff(heading_attr);
    int y = y0 + 1, iw = w - 4, x = x0 + 2;
    if (m->editing) {
        attron(A_BOLD);
        mvprintw(y, x, "%.*s: ", iw / 2, m->edit_label);
        attroff(A_BOLD);
        if (m->edit_selected) attron(A_REVERSE);   /* selected: what is typed replaces it */
        addnstr(m->edit, iw - (int)strlen(m->edit_label) - 2);
        if (m->edit_selected) attroff(A_REVERSE);
        addstr("_");
        y++;
    } else if (m->filterable) {
        mvprintw(y++, x, "%s: %.*s_", m->filter_label ? m->filter_label : "search", iw - 9, m->filter);
    }
    /* below the list: the detail, the last outcome and the keys, each wrapped */
    int below = rows_of(m->detail, iw) + (m->msg[0] ? rows_of(m->msg, iw) : 0) + rows_of(m->hint, iw);
    int list_end = y0 + h - 2 - below;   /* the list's last row */
    if (list_end < y) list_end = y;
    /* the list, scrolled to keep the selection (all of its rows) visible */
    int room = list_end - y + 1;
    if (m->sel < m->top) m->top = m->sel;
    for (;;) {
        int used = 0;
        for (int i = m->top; i <= m->sel && i < m->n; i++) used += rows_of(m->rows[i], iw);
        if (used <= room || m->top >= m->sel) break;
        m->top++;
    }
    if (m->top < 0) m->top = 0;
    for (int i = m->top; i < m->n && y <= list_end; i++) {
        int a = m->tag[i] < 0 ? heading_attr : i == m->sel ? (int)A_REVERSE : 0;
        int r = rows_of(m->rows[i], iw);
        if (i == m->sel && m->tag[i] >= 0) {
            attron(a);
            for (int k = 0; k < r && y + k <= list_end; k++) mvhline(y + k, x, ' ', iw);
            attroff(a);
        }
        text_rows tr = { y, x, list_end, a };
        if (m->rows[i][0]) conv_wrap(m->rows[i], iw, put_row, &tr);
        y += r;
    }
    if (m->n == 0) mvaddnstr(y, x, "(nothing here)", iw);
    y = list_end + 1;
    text_rows tr = { y, x, y0 + h - 2, 0 };
    conv_wrap(m->detail, iw, put_row, &tr);
    if (!m->detail[0]) tr.y++;
    if (m->msg[0]) {
        tr.attr = m->msg_error ? error_attr : (int)A_BOLD;
        conv_wrap(m->msg, iw, put_row, &tr);
    }
    tr.attr = A_DIM;
    conv_wrap(m->hint, iw, put_row, &tr);
}
