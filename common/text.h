/* text.h - text that reaches a terminal: control characters made visible (an escape sequence in a
 * session title, a document path or a model's name is shown, never executed), and columns laid out
 * by display width (wide CJK and emoji take two columns, combining marks none).
 *
 * Escaping: C0 controls, DEL and C1 controls (U+0080..U+009F) become \xNN ("\x1b[2J"), invalid
 * UTF-8 bytes too; a backslash stays a backslash. Newline and tab are kept when asked. */
#ifndef KVCHAT_TEXT_H
#define KVCHAT_TEXT_H

#include <stddef.h>
#include <stdio.h>

enum { TEXT_KEEP_NEWLINE = 1, TEXT_KEEP_TAB = 2 };

/* Escape s into out (cap bytes, always NUL-terminated, cut on a character boundary). */
void text_escape(const char *s, char *out, size_t cap, int flags);
/* Write s to f escaped (any length). */
void text_put(FILE *f, const char *s, int flags);
/* Display columns of s once escaped (UTF-8; what wcwidth says of each character). */
int text_width(const char *s);
/* s escaped, cut to at most width columns (ending in "..." when cut) and padded with spaces to
 * exactly width columns. */
void text_fit(const char *s, int width, char *out, size_t cap);

#endif
