/* document.h - reading a document (or a prompt file) as text: UTF-8 only, no binary data.
 *
 * Every front end reads what the user names through here, so a file is accepted or refused the
 * same way everywhere and the refusal is one line naming the file and the problem. */
#ifndef KVCHAT_DOCUMENT_H
#define KVCHAT_DOCUMENT_H

#include <stddef.h>

/* What a document may be at most unless a caller knows better (a session knows its context). */
#define DOC_MAX_BYTES ((size_t)256 << 20)

/* The whole file, NUL-terminated and malloc'd, its length in *len; path "-" reads the standard input
 * to its end (at most max_bytes of it). NULL with a message in err for a
 * file that cannot be read, anything but a regular file (a directory, a FIFO, a device: refused
 * before any read, so /dev/zero or a pipe never blocks or fills memory), one of more than max_bytes,
 * binary data (NUL bytes) or invalid UTF-8. */
char *doc_load(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

#endif
