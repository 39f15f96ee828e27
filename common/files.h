/* files.h - small file-system helpers every layer shares: what kind of file a path is (for
 * one-line refusals), and writing a file without following a link or clobbering what is there. */
#ifndef KVCHAT_FILES_H
#define KVCHAT_FILES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* "a directory", "a FIFO", "a character device", "a block device", "a socket", "a regular file". */
const char *files_kind(mode_t mode);

/* The one way kvchat opens a file it reads: path must be a regular file (a directory, FIFO, device
 * or socket is refused before any read, a FIFO without waiting for a writer, so /dev/zero or a
 * pipe never blocks or fills memory) of at most max_bytes. what names the file in the refusal ("a
 * settings file": "X is a FIFO, not a settings file"). The descriptor, or -1 with a one-line
 * message naming path (errno ENOENT when there is nothing at path); *size gets the file's size when
 * size is not NULL. */
int files_open_read_fd(const char *path, uint64_t max_bytes, const char *what, uint64_t *size, char *err,
                       size_t errlen);
/* The same as a stream ("rb"). */
FILE *files_open_read(const char *path, uint64_t max_bytes, const char *what, char *err, size_t errlen);
/* The whole file through files_open_read, NUL-terminated and malloc'd, its length in *len (a file
 * that grows past max_bytes while it is read is refused too). */
char *files_read_all(const char *path, size_t max_bytes, const char *what, size_t *len, char *err, size_t errlen);

/* Create path for writing, failing when anything exists there (a file, or a link, which is never
 * followed): O_CREAT | O_EXCL | O_NOFOLLOW. NULL with a message naming the path. */
FILE *files_create_new(const char *path, char *err, size_t errlen);

/* The rule for every file kvchat writes whole: what is at path may be replaced only when it is a
 * regular file or a symbolic link (the link itself is replaced, never followed). 0 when nothing is
 * there or it may be replaced; -1 with "PATH is a FIFO, not a file kvchat replaces" for a
 * directory, FIFO, device or socket (and with the reason when path cannot be looked at). */
int files_replaceable(const char *path, char *err, size_t errlen);

/* Open path for appending (created when missing), never through a link and never anything but a
 * regular file (a FIFO would block, a device is no log). *fresh: the file is empty (write a
 * header). NULL with a message naming the path. */
FILE *files_append(const char *path, int *fresh, char *err, size_t errlen);
/* fflush, ferror and fclose, so a write error (a full disk) is seen: 0, or -1 with "writing PATH
 * failed: REASON". f is closed either way. */
int files_close(FILE *f, const char *path, char *err, size_t errlen);

/* Replacing a file whole: written to a new temporary file beside it (path.XXXXXX), then renamed
 * over it, so a link at path is replaced (never followed) and a failed write leaves the old file as
 * it was. What files_replaceable refuses is refused when opening and again just before the rename. */
typedef struct files_atomic {
    FILE *f;                     /* write here */
    int replace;                 /* 0: commit never replaces anything at path */
    char tmp[1100], path[1024];
} files_atomic;
int files_atomic_open(files_atomic *a, const char *path, char *err, size_t errlen);
/* The same for a file that must be new: anything at path (a link included) is kept, and commit
 * fails with -2 ("PATH: already exists") when something appeared there meanwhile. */
int files_atomic_open_new(files_atomic *a, const char *path, char *err, size_t errlen);
/* Flush, sync, close and move into place. 0, or -1 with a message (-2: see files_atomic_open_new);
 * the temporary file is removed either way. */
int files_atomic_commit(files_atomic *a, char *err, size_t errlen);
void files_atomic_abort(files_atomic *a);
/* The file at from (written whole, on the same file system) renamed over path under
 * files_replaceable's rule, checked just before the rename. 0, or -1 with a message (from removed). */
int files_move_over(const char *from, const char *path, char *err, size_t errlen);
/* The folders that hold path made where missing (mkdir -p of its directory, mode 0700): 0, or -1
 * with errno. */
int files_make_parents(const char *path);
/* path made absolute against the working directory (for saying where a file was written). */
void files_absolute(const char *path, char *out, size_t cap);

#endif
