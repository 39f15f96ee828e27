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

int files_open_read_fd(const char *path, uint64_t max_bytes, const char *what, uint64_t *size, char *err,
                       size_t errlen)
{
    /* O_NONBLOCK: opening a FIFO does not wait for a writer; it is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        errno = e;   /* a caller may take ENOENT as "not there yet" */
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        errno = EINVAL;
        snprintf(err, errlen, "%s is %s, not %s", path, files_kind(st.st_mode), what);
        close(fd);
        return -1;
    }
    if ((uint64_t)st.st_size > max_bytes) {
        errno = EFBIG;
        snprintf(err, errlen, "%s: %lld bytes, more than the %llu bytes %s may have", path, (long long)st.st_size,
                 (unsigned long long)max_bytes, what);
        close(fd);
        return -1;
    }
    /* reads block as usual from here (a regular file never waits, but a caller may expect it) */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (size) *size = (uint64_t)st.st_size;
    return fd;
}

FILE *files_open_read(const char *path, uint64_t max_bytes, const char *what, char *err, size_t errlen)
{
    int fd = files_open_read_fd(path, max_bytes, what, NULL, err, errlen);
    if (fd < 0) return NULL;   /* errno kept */
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

char *files_read_all(const char *path, size_t max_bytes, const char *what, size_t *len, char *err, size_t errlen)
{
    uint64_t size;
    int fd = files_open_read_fd(path, max_bytes, what, &size, err, errlen);
    if (fd < 0) return NULL;
    /* the size at open is a hint: the file may change while it is read, and it is read to its end
     * with the same bound */
    size_t cap = (size_t)size + 1, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            snprintf(err, errlen, "%s: out of memory", path);
            close(fd);
            return NULL;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (got == 0) break;
        n += (size_t)got;
        if (n > max_bytes) {
            snprintf(err, errlen, "%s: more than the %zu bytes %s may have", path, max_bytes, what);
            free(buf);
            close(fd);
            return NULL;
        }
        if (n == cap) {
            cap = cap * 2 > max_bytes + 1 ? max_bytes + 1 : cap * 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    close(fd);
    buf[n] = 0;
    *len = n;
    return buf;
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
