/* text.c - escaping and display width for the terminal (see text.h). */
#include "common/text.h"

#include <stdint.h>
#include <string.h>
#include <wchar.h>

/* The code point at s (n bytes left) and its length; *cp -1 for a byte that starts no valid UTF-8
 * sequence (length 1). */
static int utf8_next(const unsigned char *s, size_t n, int32_t *cp)
{
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || (size_t)len > n) {
        *cp = -1;
        return 1;
    }
    int32_t v = len == 1 ? (int32_t)c : len == 2 ? (int32_t)(c & 0x1F) : len == 3 ? (int32_t)(c & 0x0F) : (int32_t)(c & 0x07);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = -1;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    static const int32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (v < min[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = -1;
        return 1;
    }
    *cp = v;
    return len;
}

static int is_control(int32_t cp) { return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F); }

/* Each character of s in turn: its bytes as they are, or its escape; fn gets the piece. */
static void each(const char *s, int flags, void (*fn)(void *ud, const char *p, size_t n, int cols), void *ud)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t left = strlen(s);
    while (left > 0) {
        int32_t cp;
        int len = utf8_next(p, left, &cp);
        char esc[12];
        if (cp < 0 || (is_control(cp) && !(cp == '\n' && (flags & TEXT_KEEP_NEWLINE)) &&
                       !(cp == '\t' && (flags & TEXT_KEEP_TAB)))) {
            /* a control character is shown as \xNN of its code point (a C1 control's, not its bytes) */
            unsigned v = cp < 0 ? p[0] : (unsigned)cp;
            snprintf(esc, sizeof esc, "\\x%02x", v & 0xffu);
            fn(ud, esc, 4, 4);
        } else {
            int w = cp == '\n' || cp == '\t' ? 1 : wcwidth((wchar_t)cp);
            fn(ud, (const char *)p, (size_t)len, w < 0 ? 1 : w);
        }
        p += len;
        left -= (size_t)len;
    }
}

typedef struct sink {
    char *out;
    size_t cap, n;
    int cols, max_cols, full;
    FILE *f;
} sink;

static void to_buf(void *ud, const char *p, size_t n, int cols)
{
    sink *k = ud;
    if (k->full || k->n + n + 1 > k->cap || (k->max_cols >= 0 && k->cols + cols > k->max_cols)) {
        k->full = 1;
        return;
    }
    memcpy(k->out + k->n, p, n);
    k->n += n;
    k->cols += cols;
}

static void to_file(void *ud, const char *p, size_t n, int cols)
{
    (void)cols;
    fwrite(p, 1, n, ((sink *)ud)->f);
}

static void count(void *ud, const char *p, size_t n, int cols)
{
    (void)p;
    (void)n;
    ((sink *)ud)->cols += cols;
}

void text_escape(const char *s, char *out, size_t cap, int flags)
{
    if (cap == 0) return;
    sink k = { out, cap, 0, 0, -1, 0, NULL };
    each(s, flags, to_buf, &k);
    out[k.n] = 0;
}

void text_put(FILE *f, const char *s, int flags)
{
    sink k = { NULL, 0, 0, 0, -1, 0, f };
    each(s, flags, to_file, &k);
}

int text_width(const char *s)
{
    sink k = { NULL, 0, 0, 0, -1, 0, NULL };
    each(s, 0, count, &k);
    return k.cols;
}

void text_fit(const char *s, int width, char *out, size_t cap)
{
    if (cap == 0) return;
    int cut = text_width(s) > width;
    sink k = { out, cap > 4 ? cap - 4 : cap, 0, 0, cut ? width - 3 : width, 0, NULL };
    if (k.max_cols < 0) k.max_cols = 0;
    each(s, 0, to_buf, &k);
    if (cut && width >= 3 && k.n + 4 <= cap) {
        memcpy(out + k.n, "...", 3);
        k.n += 3;
        k.cols += 3;
    }
    while (k.cols < width && k.n + 1 < cap) {
        out[k.n++] = ' ';
        k.cols++;
    }
    out[k.n] = 0;
}
