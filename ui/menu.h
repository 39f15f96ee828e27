/* menu.h - a framed list over the conversation: the session browser, the policy picker, the
 * settings and the file picker are all one of these. It moves the selection, keeps a typed filter
 * (or search) line and a one-line prompt (rename, a value), and draws itself; what a pick means is
 * the caller's. */
#ifndef KVCHAT_UI_MENU_H
#define KVCHAT_UI_MENU_H

#include <stdint.h>

typedef struct menu {
    char title[160];
    char hint[256];          /* the keys, on the frame's last line */
    char detail[512];        /* about the selected row, under the list */
    char msg[512];           /* the last outcome (exported to ..., an error) */
    int msg_error;
    char **rows;
    int64_t *tag;            /* the caller's value per row; rows with tag < 0 are headings */
    int n, cap;
    int sel, top;
    int filterable;          /* typed characters go to filter */
    const char *filter_label;   /* "search" unless set */
    char filter[128];
    int editing;             /* typed characters go to edit (a prompt) */
    int edit_selected;       /* the initial value is selected: a typed character replaces it */
    char edit[256], edit_label[96];
} menu;

typedef struct menu_attrs {
    int frame, heading, error;
} menu_attrs;

enum { MENU_NONE, MENU_CLOSE, MENU_PICK, MENU_FILTER, MENU_EDIT_DONE, MENU_BACK, MENU_UNHANDLED };

void menu_init(menu *m, const char *title, const char *hint, int filterable);
void menu_clear(menu *m);    /* the rows only */
void menu_free(menu *m);
void menu_add(menu *m, int64_t tag, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The selected row's tag (-1 when nothing is selectable). */
int64_t menu_tag(const menu *m);
/* Keep the selection on the row with this tag, if there is one. */
void menu_select_tag(menu *m, int64_t tag);
/* Start a prompt with a label and an initial text, selected as in a dialog: typing replaces it,
 * Backspace edits it from its end (Right or End keep it), Ctrl-U clears the line, Ctrl-W the word
 * before, Esc cancels, Enter takes it. */
void menu_prompt(menu *m, const char *label, const char *initial);
void menu_say(menu *m, int error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* One key (is_key: an ncurses key code). Returns what happened (MENU_*). In a filter line too,
 * Ctrl-U clears it and Ctrl-W drops its last word. */
int menu_key(menu *m, int ch, int is_key);
/* Draw the frame over the screen. */
void menu_draw(menu *m, const menu_attrs *a);

#endif
