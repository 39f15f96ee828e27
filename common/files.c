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

int files_replaceable(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return 0;
    /* a rename would put a regular file where a device, FIFO or socket was (or fail on a directory) */
    snprintf(err, errlen, "%s is %s, not a file kvchat replaces", path, files_kind(st.st_mode));
    return -1;
}

static int atomic_open(files_atomic *a, const char *path, int replace, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->replace = replace;
    if (strlen(path) >= sizeof a->path) {
        snprintf(err, errlen, "%.200s...: the path is too long", path);
        return -1;
    }
    snprintf(a->path, sizeof a->path, "%s", path);
    /* refused now, before any work is spent on the contents */
    if (files_replaceable(path, err, errlen)) return -1;
    struct stat st;
    if (!replace && lstat(path, &st) == 0) {
        snprintf(err, errlen, "%s: already exists", path);
        return -2;
    }
    snprintf(a->tmp, sizeof a->tmp, "%s.XXXXXX", path);
    int fd = mkostemp(a->tmp, O_CLOEXEC);   /* O_CREAT | O_EXCL: never an existing file or link */
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create a file beside it: %s", path, strerror(errno));
        a->tmp[0] = 0;   /* nothing of ours to remove */
        return -1;
    }
    fchmod(fd, 0644);
    if (!(a->f = fdopen(fd, "w"))) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        unlink(a->tmp);
        a->tmp[0] = 0;
        return -1;
    }
    return 0;
}

FILE *files_append(const char *path, int *fresh, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s is %s, not a file kvchat appends to", path,
                 S_ISLNK(st.st_mode) ? "a symbolic link" : files_kind(st.st_mode));
        return NULL;
    }
    /* O_NOFOLLOW and O_NONBLOCK: a link or FIFO put there since fails here instead of being
     * followed or blocking */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot append to %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s is %s, not a file kvchat appends to", path, files_kind(st.st_mode));
        close(fd);
        return NULL;
    }
    fcntl(fd, F_SETFL, O_WRONLY | O_APPEND);
    FILE *f = fdopen(fd, "a");
    if (!f) {
        snprintf(err, errlen, "cannot append to %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    *fresh = st.st_size == 0;
    return f;
}

int files_close(FILE *f, const char *path, char *err, size_t errlen)
{
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) snprintf(err, errlen, "writing %s failed: %s", path, strerror(e ? e : EIO));
    return bad ? -1 : 0;
}

int files_atomic_open(files_atomic *a, const char *path, char *err, size_t errlen)
{
    return atomic_open(a, path, 1, err, errlen);
}

int files_atomic_open_new(files_atomic *a, const char *path, char *err, size_t errlen)
{
    return atomic_open(a, path, 0, err, errlen);
}

int files_move_over(const char *from, const char *path, char *err, size_t errlen)
{
    /* checked just before: something else may have been put there while the file was written */
    if (files_replaceable(path, err, errlen) == 0) {
        if (rename(from, path) == 0) return 0;
        snprintf(err, errlen, "%s: cannot move the file into place: %s", path, strerror(errno));
    }
    unlink(from);
    return -1;
}

/* The written temporary file to its name, which must still be free: link never replaces. A file
 * system without hard links gets a check and a rename instead. */
static int move_new(files_atomic *a, char *err, size_t errlen)
{
    int rc = link(a->tmp, a->path) == 0 ? 0 : -1, e = errno;
    struct stat st;
    if (rc && (e == EEXIST || lstat(a->path, &st) == 0)) {
        snprintf(err, errlen, "%s: already exists", a->path);
        rc = -2;
    } else if (rc && (e == EPERM || e == EOPNOTSUPP || e == EMLINK || e == ENOSYS)) {
        if (rename(a->tmp, a->path) == 0) return 0;
        e = errno;
    }
    if (rc == -1) snprintf(err, errlen, "%s: cannot move the file into place: %s", a->path, strerror(e));
    unlink(a->tmp);
    return rc;
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
    if (bad) {
        snprintf(err, errlen, "writing %s failed: %s", a->path, strerror(e ? e : EIO));
        unlink(a->tmp);
        return -1;
    }
    return a->replace ? files_move_over(a->tmp, a->path, err, errlen) : move_new(a, err, errlen);
}

void files_atomic_abort(files_atomic *a)
{
    if (a->f) fclose(a->f);
    a->f = NULL;
    if (a->tmp[0]) unlink(a->tmp);
    a->tmp[0] = 0;
}

void files_absolute(const char *path, char *out, size_t cap)
{
    char cwd[1024];
    if (path[0] == '/' || !getcwd(cwd, sizeof cwd))
        snprintf(out, cap, "%s", path);
    else
        snprintf(out, cap, "%s/%s", cwd, path);
}

int files_make_parents(const char *path)
{
    char d[4096];
    if (snprintf(d, sizeof d, "%s", path) >= (int)sizeof d) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = d + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(d, 0700) && errno != EEXIST) return -1;
        *p = '/';
    }
    return 0;
}
