/* tui.h - the ncurses interface: a conversation about a document with live memory, page map and
 * uncertainty views. The engine runs on ui/worker.c's thread; this file only draws and reads keys. */
#ifndef KVCHAT_UI_TUI_H
#define KVCHAT_UI_TUI_H

#include <stdint.h>

#include <stddef.h>

#include "ui/config.h"
#include "ui/worker.h"

/* Run the interface on worker w (stopped and freed on return) until the user quits. With doc, open
 * it (a new session); else continue session (a name or id), else the most recent session, if any.
 * cfg: colour (0: monochrome) and the keymap. 0, or -1 with a message when the terminal cannot be
 * set up. */
int tui_main(ui_worker *w, const char *doc, const char *resume, const tui_config *cfg, char *err, size_t errlen);

#endif
