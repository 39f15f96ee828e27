/* config.h - the interface's settings file, $XDG_CONFIG_HOME/kvchat/config (~/.config/kvchat/config):
 * "key = value" lines and # comments. Keys: policy, budget, temperature, top_k, top_p, min_p,
 * repeat_penalty, seed, n_predict, page_size, color (on/off), color.ELEMENT = FG [on BG] and
 * key.ACTION = KEY for the keymap (ui/keymap.h). The command line overrides the file. */
#ifndef KVCHAT_UI_CONFIG_H
#define KVCHAT_UI_CONFIG_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/options.h"
#include "ui/keymap.h"

/* What the interface colours, each settable as color.NAME = FG [on BG] (names black, red, green,
 * yellow, blue, magenta, cyan, white, default, or a number 0-255). */
enum { COL_USER, COL_ANSWER, COL_INFO, COL_ERROR, COL_BAR, COL_HEADING, COL_EVENT, COL_MAP1, COL_MAP2, COL_MAP3,
       COL_FRAME, COL_COUNT };

typedef struct tui_config {
    int color;
    keymap keys;
    short fg[COL_COUNT], bg[COL_COUNT];   /* -1: the terminal's default */
    char text[16][256];          /* the values of text settings (policy, budget, stop): options point here */
    int n_text;
    const opt_group *groups;     /* the option tables the file was read with: the settings view checks */
    int n_groups;                /* what is typed in it through them */
    int keep_policy;             /* the command line named a policy: it holds for the first session too */
    /* raised (to the signal's number) by SIGTERM or SIGHUP (the terminal closed): the interface leaves as
     * on Ctrl-Q, the answer stopped and saved, the terminal restored; the interface raises it to SIGHUP
     * itself when the terminal hung up without one (NULL: none) */
    volatile sig_atomic_t *stop_signal;
    char policy_at[1100];        /* "FILE:LINE" of the file's policy and budget lines ("": none) */
    char budget_at[1100];
    char notes[4][2048];         /* settings that could not apply, said in the conversation at start */
    int n_notes;
} tui_config;

/* The element's name in the settings file ("user"). */
const char *config_color_name(int element);

/* The file's path. 0, or -1 when neither XDG_CONFIG_HOME nor HOME is set. */
int config_path(char *buf, size_t cap);
/* The interface's own colours (what config_read starts from). */
void config_default_colors(tui_config *c);
/* Read the file into c (which starts from its defaults) and into the options of groups: color,
 * color.ELEMENT and key.ACTION are the interface's own; every other key is the option whose
 * settings key it is (opt_def.key), set and checked through the same table as the command line.
 * 0 (also when there is no file), or -1 with one line naming the file, the line and the problem. */
int config_read(const opt_group *groups, int n_groups, tui_config *c, char *err, size_t errlen);
/* For the commands that answer beside the interface (ask, chat): the file's stop sequences and
 * sampling settings (stop, temperature, top_k, top_p, min_p, repeat_penalty, seed) into the options
 * of groups, before the command line (which overrides them). Every other key is the interface's
 * (policy and budget for new documents, answer length, colours, keys) and left alone. 0, or -1 with
 * one line naming the file, the line and the problem. */
int config_read_answer_settings(const opt_group *groups, int n_groups, char *err, size_t errlen);
/* Set keys to values in the file, keeping every other line; written to a temporary file and
 * renamed over the old one. 0, or -1 with a message. */
int config_update(const char *const *keys, const char *const *values, int n, char *err, size_t errlen);

#endif
