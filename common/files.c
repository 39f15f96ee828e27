/* files.c - file-system helpers (see files.h). */
#include "common/files.h"

#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *files_kind(mode_t mode)
{
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device"
           : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : S_ISREG(mode) ? "a regular file"
                                                                               : "not a regular file";
}

FILE *files_create_new(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path,
                 errno == EEXIST ? "already exists (kvchat does not overwrite files or follow links)" : strerror(errno));
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        unlink(path);
    }
    return f;
}

int files_atomic_open(files_atomic *a, const char *path, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    if (strlen(path) >= sizeof a->path) {
        snprintf(err, errlen, "%.200s...: the path is too long", path);
        return -1;
    }
    snprintf(a->path, sizeof a->path, "%s", path);
    snprintf(a->tmp, sizeof a->tmp, "%s.XXXXXX", path);
    int fd = mkstemp(a->tmp);   /* O_CREAT | O_EXCL: never an existing file or link */
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    fchmod(fd, 0644);
    if (!(a->f = fdopen(fd, "w"))) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        unlink(a->tmp);
        return -1;
    }
    return 0;
}

int files_atomic_commit(files_atomic *a, char *err, size_t errlen)
{
    int bad = fflush(a->f) != 0 || ferror(a->f) || fsync(fileno(a->f)) != 0;
    int e = errno;
    if (fclose(a->f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    a->f = NULL;
    if (!bad && rename(a->tmp, a->path) != 0) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        snprintf(err, errlen, "writing %s failed: %s", a->path, strerror(e));
        unlink(a->tmp);
        return -1;
    }
    return 0;
}

void files_atomic_abort(files_atomic *a)
{
    if (a->f) fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
}

void files_absolute(const char *path, char *out, size_t cap)
{
    char cwd[1024];
    if (path[0] == '/' || !getcwd(cwd, sizeof cwd))
        snprintf(out, cap, "%s", path);
    else
        snprintf(out, cap, "%s/%s", cwd, path);
}
