/* document.c - reading a document as checked text (see document.h). */
#include "engine/document.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/files.h"
#include "engine/tokenizer.h"

char *doc_load(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen)
{
    /* "-": the standard input, asked for by name (a pipe is what it should be), read to its end
     * with the same bound as it is read */
    int std_in = !strcmp(path, "-");
    if (std_in) path = "the standard input";
    FILE *fp = std_in ? stdin : files_open_read(path, max_bytes, "a text file", err, errlen);
    if (!fp) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            snprintf(err, errlen, "%s: out of memory", path);
            if (!std_in) fclose(fp);
            return NULL;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
        if (n > max_bytes) {   /* the file grew while it was read */
            snprintf(err, errlen, "%s: more than the %zu bytes a document may have here", path, max_bytes);
            free(buf);
            if (!std_in) fclose(fp);
            return NULL;
        }
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int rerr = ferror(fp);
    if (!std_in) fclose(fp);
    if (rerr) {
        snprintf(err, errlen, "%s: read error", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        snprintf(err, errlen, "%s: binary file (contains NUL bytes at byte %zu), expected text", path,
                 (size_t)(nul - buf));
        free(buf);
        return NULL;
    }
    int64_t bad = tok_utf8_invalid_at(buf, n);
    if (bad >= 0) {
        snprintf(err, errlen, "%s: invalid UTF-8 at byte %lld", path, (long long)bad);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}
