/* config.h - the interface's settings file, $XDG_CONFIG_HOME/kvchat/config (~/.config/kvchat/config):
 * "key = value" lines and # comments. Keys: policy, budget, temperature, top_k, top_p, min_p,
 * repeat_penalty, seed, n_predict, page_size, color (on/off), and key.ACTION = KEY for the keymap
 * (ui/keymap.h). The command line overrides the file. */
#ifndef KVCHAT_UI_CONFIG_H
#define KVCHAT_UI_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "keymap.h"

typedef struct tui_config {
    int64_t n_predict;
    int color;
    char policy[256], budget[32];
    keymap keys;
} tui_config;

/* The file's path. 0, or -1 when neither XDG_CONFIG_HOME nor HOME is set. */
int config_path(char *buf, size_t cap);
/* Read the file into o and c (c starts from its defaults). 0 (also when there is no file), or -1
 * after printing one line naming the file, the line and the problem. */
int config_read(cli_opts *o, tui_config *c);
/* Set keys to values in the file, keeping every other line; written to a temporary file and
 * renamed over the old one. 0, or -1 with a message. */
int config_update(const char *const *keys, const char *const *values, int n, char *err, size_t errlen);

#endif
