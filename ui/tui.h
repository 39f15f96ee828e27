/* tui.h - the ncurses interface: a conversation about a document with live memory, page map and
 * uncertainty views. The engine runs on ui/worker.c's thread; this file only draws and reads keys. */
#ifndef KVCHAT_UI_TUI_H
#define KVCHAT_UI_TUI_H

#include <stdint.h>

#include "app/cli.h"
#include "ui/config.h"

/* Run the interface until the user quits. With doc, open it (a new session); else continue session
 * (a name or id), else the most recent session, if any. cfg: answer length, colour (0: monochrome)
 * and the keymap. Returns the exit status. */
int tui_main(const cli_opts *o, const char *doc, const char *session, const tui_config *cfg);

#endif
