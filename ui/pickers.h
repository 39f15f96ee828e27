/* pickers.h - the three smaller overlays: the policy picker (every registered policy, decode-time
 * and prefill, with its one-line summary; picking one replaces that half of the current spec), the
 * settings (sampling, answer length, budget: edited live, saved to the settings file with s) and the
 * file picker (directories and files, filtered as you type). */
#ifndef KVCHAT_UI_PICKERS_H
#define KVCHAT_UI_PICKERS_H

#include "common/options.h"
#include "ui/menu.h"
#include "ui/worker.h"

typedef struct policy_picker {
    menu m;
    char specs[32][128];     /* what each row stands for (tag = index) */
    int n;
    char note[400];          /* what the last switch dropped (a budget full has no use for), or "" */
} policy_picker;

void policy_picker_open(policy_picker *p, const char *current);
/* 1 when it should close (Esc, or a policy was picked and the switch started). budget: the one in
 * force ("" when each policy's own); a switch to a policy without one drops it (said in p->note). */
int policy_picker_key(policy_picker *p, ui_worker *w, const char *current, const char *budget, int ch, int is_key);
/* Switch to spec through w. A budget in force that spec cannot take (full keeps everything) is
 * dropped with the switch rather than refusing it, and note says so ("" otherwise). 0, or -1 with
 * the engine's reason in err. */
int policy_switch(ui_worker *w, const char *spec, const char *budget, char *note, size_t notecap, char *err,
                  size_t errlen);
/* The spec with the half of pick's kind replaced ("none" removes the prefill half, "full" the
 * decode half). */
void policy_combine(const char *current, const char *pick, char *out, size_t cap);

typedef struct settings_menu {
    menu m;
    samp_params sp;
    int64_t n_predict;
    char budget[32];
    int editing_row;
    int dirty[8];                /* rows changed in this interface: what s writes (the policy only with a budget) */
    const opt_group *groups;     /* the option tables: a typed value is checked as on the command line */
    int n_groups;
} settings_menu;

/* groups: the option tables whose settings keys name the rows (tui_config). */
void settings_open(settings_menu *s, const uw_view *v, const opt_group *groups, int n_groups);
/* 1 when it should close. policy: the current spec (a budget change re-applies it). */
int settings_key(settings_menu *s, ui_worker *w, const char *policy, int ch, int is_key);

typedef struct file_picker {
    menu m;
    char dir[1024];
    char (*names)[256];
    int *is_dir;
    long long *size;
    int n;
} file_picker;

void file_picker_open(file_picker *f, const char *dir);
void file_picker_close(file_picker *f);
/* 1 when it should close (Esc, or a file was opened through w). Typing filters the directory, names
 * that begin with the filter first; a typed path ("/", "~/", "dir/") goes to that directory. */
int file_picker_key(file_picker *f, ui_worker *w, int ch, int is_key);

/* A path argument as typed: quotes ('...' or "...") and backslash escapes removed, a leading ~ or ~/
 * made $HOME. */
void path_expand(const char *arg, char *out, size_t cap);
/* A byte count as people read it: "812 B", "3.6 KiB", "1.2 MiB". */
void human_size(long long bytes, char *buf, size_t cap);

#endif
