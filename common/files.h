/* files.h - small file-system helpers every layer shares: what kind of file a path is (for
 * one-line refusals), and writing a file without following a link or clobbering what is there. */
#ifndef KVCHAT_FILES_H
#define KVCHAT_FILES_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* "a directory", "a FIFO", "a character device", "a block device", "a socket", "a regular file". */
const char *files_kind(mode_t mode);

/* Create path for writing, failing when anything exists there (a file, or a link, which is never
 * followed): O_CREAT | O_EXCL | O_NOFOLLOW. NULL with a message naming the path. */
FILE *files_create_new(const char *path, char *err, size_t errlen);

#endif
