/* conv.h - the conversation pane: questions, streamed answers, notes, errors, comparisons and
 * separators between conversations, wrapped at word boundaries and scrolled.
 *
 * Scrolled back, the pane holds still while text streams below (a "more below" line says so);
 * Home and End jump; a search finds text in it and scrolls to each match. Drawing only: what the
 * entries say comes from the worker's events (ui/tui.c). */
#ifndef KVCHAT_UI_CONV_H
#define KVCHAT_UI_CONV_H

#include <stddef.h>

#include "ui/worker.h"

enum { E_USER, E_ANSWER, E_INFO, E_ERROR, E_EVENT, E_COMPARE, E_SEP };

/* An uncertainty event inside an answer's text, where it happened: MARK_ON ... MARK_OFF, drawn in
 * the event colour (zero-width markers). */
#define MARK_ON '\x1e'
#define MARK_OFF '\x1f'

typedef struct conv_entry {
    int kind;
    char *text;
    size_t len, cap;
    int n_cols;              /* E_COMPARE: one column per policy */
    char *head[8], *col[8];
} conv_entry;

typedef struct conv {
    conv_entry *e;
    int n, cap;
    int answering;           /* an answer entry is open for text */
    char pend[4];            /* the start of a character the next piece of the answer finishes */
    int n_pend;
    int scroll;              /* lines scrolled back from the bottom */
    int last_total, last_width;   /* the layout of the last frame (to hold still while scrolled) */
    char find[256];          /* the search, "" when none */
    int find_cur;            /* the current match (0 = the newest) */
    int find_n;              /* matches at the last search */
} conv;

typedef struct conv_attrs {
    int kind[E_SEP + 1];     /* each kind's attribute */
    int event, heading, more, match;
} conv_attrs;

/* Every text is kept as it is shown: control characters and bytes of no valid UTF-8 as \xNN (as
 * everywhere kvchat prints), tabs as four spaces, so what is wrapped is what is drawn. */
void conv_add(conv *c, int kind, const char *text);
/* Text to the answer being streamed (one is opened when none is). */
void conv_append(conv *c, const char *s);
/* An event note inside the answer being streamed, between MARK_ON and MARK_OFF. */
void conv_append_mark(conv *c, const char *s);
/* The answers of a comparison side by side (texts taken over). */
void conv_add_compare(conv *c, uw_compared *cmp, int n);
void conv_free(conv *c);
/* The n-th answer shown (1 = the first; 0 = the last), or NULL. */
const char *conv_answer(const conv *c, int n);

/* Draw rows top..bottom, width cells wide. */
void conv_draw(conv *c, int top, int bottom, int width, const conv_attrs *a);
void conv_scroll(conv *c, int lines);            /* back (> 0) or forward (< 0) */
void conv_scroll_to(conv *c, int end);           /* 0: the start, 1: the end */

/* Search: matches of pat (case-insensitive); the view scrolls to match k (0 = the newest) at the
 * next draw. The number of matches. */
int conv_find(conv *c, const char *pat, int k);

/* Wrap s (the markers count no cells) into rows of at most width cells, breaking after a space where
 * there is one; fn gets each row (no trailing space). The rows. */
int conv_wrap(const char *s, int width, void (*fn)(void *ud, const char *p, int bytes), void *ud);

#endif
