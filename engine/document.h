/* document.h - reading a document (or a prompt file) as text: UTF-8 only, no binary data.
 *
 * Every front end reads what the user names through here, so a file is accepted or refused the
 * same way everywhere and the refusal is one line naming the file and the problem. */
#ifndef KVCHAT_DOCUMENT_H
#define KVCHAT_DOCUMENT_H

#include <stddef.h>

/* The whole file, NUL-terminated and malloc'd, its length in *len. NULL with a message in err for a
 * file that cannot be read, a directory, binary data (NUL bytes) or invalid UTF-8. */
char *doc_load(const char *path, size_t *len, char *err, size_t errlen);

#endif
