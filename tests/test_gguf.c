/* test_gguf.c - the GGUF reader on the real test files and on synthetic files it must refuse:
 * truncation at every byte, bad magic and versions, counts and lengths larger than the file, bad
 * alignment, misplaced or oversized tensors, unknown types, duplicates. Every refusal is a one-line
 * message naming the problem. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "common/quant.h"

#define TD "../shared/testdata/"

/* ---------------------------------------------------------------- a small GGUF builder */

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb;

static void put(gb *b, const void *d, size_t k)
{
    if (b->n + k > b->cap) {
        b->cap = (b->n + k) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        cr_assert(b->p);
    }
    memcpy(b->p + b->n, d, k);
    b->n += k;
}
static void u32(gb *b, uint32_t v) { put(b, &v, 4); }
static void u64(gb *b, uint64_t v) { put(b, &v, 8); }
static void str(gb *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void pad(gb *b, size_t align)
{
    while (b->n % align) put(b, "", 1);
}

enum { VT_U32 = 4, VT_I32 = 5, VT_F32 = 6, VT_BOOL = 7, VT_STR = 8, VT_ARR = 9, VT_U8 = 0, VT_I64 = 11 };

/* A valid file: 4 KVs (u32, string, string array, f32) and 2 F32 tensors. Options corrupt it. */
typedef struct spec {
    uint32_t version;
    uint64_t n_kv_override, n_t_override;
    uint32_t alignment;          /* 0: no general.alignment key */
    uint32_t t1_type;            /* type of the second tensor */
    int64_t t1_ne0;
    uint32_t t1_ndims;
    uint64_t t1_offset_add;      /* added to the second tensor's offset */
    uint8_t bool_value;
    int dup_key, dup_tensor;
    uint64_t str_len_override;
    uint64_t arr_count_override;
    int truncate_data;
} spec;

static spec good(void)
{
    spec s = { 3, 0, 0, 0, 0, 16, 1, 0, 1, 0, 0, 0, 0, 0 };
    return s;
}

static gb build(spec s)
{
    gb b = { 0 };
    put(&b, "GGUF", 4);
    u32(&b, s.version);
    int n_kv = 5 + (s.alignment ? 1 : 0) + s.dup_key;
    u64(&b, s.n_t_override ? s.n_t_override : 2);
    u64(&b, s.n_kv_override ? s.n_kv_override : (uint64_t)n_kv);
    str(&b, "test.count");
    u32(&b, VT_U32);
    u32(&b, 7);
    str(&b, "test.name");
    u32(&b, VT_STR);
    if (s.str_len_override) {
        u64(&b, s.str_len_override);
        put(&b, "abc", 3);
    } else {
        str(&b, "tiny");
    }
    str(&b, "test.words");
    u32(&b, VT_ARR);
    u32(&b, VT_STR);
    u64(&b, s.arr_count_override ? s.arr_count_override : 3);
    str(&b, "alpha");
    str(&b, "");
    str(&b, "gamma");
    str(&b, "test.scale");
    u32(&b, VT_F32);
    float f = 0.5f;
    put(&b, &f, 4);
    str(&b, "test.flag");
    u32(&b, VT_BOOL);
    put(&b, &s.bool_value, 1);
    if (s.alignment) {
        str(&b, "general.alignment");
        u32(&b, VT_U32);
        u32(&b, s.alignment);
    }
    if (s.dup_key) {
        str(&b, "test.count");
        u32(&b, VT_U32);
        u32(&b, 8);
    }
    uint32_t align = s.alignment && (s.alignment & (s.alignment - 1)) == 0 ? s.alignment : 32;
    /* tensor 0: F32 [8, 2] at 0 (64 bytes); tensor 1 after it */
    str(&b, "t0");
    u32(&b, 2);
    u64(&b, 8);
    u64(&b, 2);
    u32(&b, 0);
    u64(&b, 0);
    str(&b, s.dup_tensor ? "t0" : "t1");
    u32(&b, s.t1_ndims);
    for (uint32_t d = 0; d < s.t1_ndims && d < 8; d++) u64(&b, d == 0 ? (uint64_t)s.t1_ne0 : 1);
    u32(&b, s.t1_type);
    u64(&b, (64 + align - 1) / align * align + s.t1_offset_add);
    pad(&b, align);
    for (int i = 0; i < 16; i++) {
        float v = (float)i;
        put(&b, &v, 4);
    }
    pad(&b, align);
    for (int i = 0; i < 16; i++) {
        float v = (float)-i;
        put(&b, &v, 4);
    }
    if (s.truncate_data) b.n -= 4;
    return b;
}

static void expect_refused(spec s, const char *word)
{
    gb b = build(s);
    gguf_file *f = NULL;
    char err[512] = "";
    int rc = gguf_open_memory(&f, b.p, b.n, "synthetic.gguf", err, sizeof err);
    cr_expect_eq(rc, -1, "accepted a corrupt file (expected '%s')", word);
    if (rc == 0) gguf_free(f);
    cr_expect(strstr(err, word), "message '%s' does not mention '%s'", err, word);
    cr_expect(!strchr(err, '\n'), "message is not one line: %s", err);
    cr_expect(!strncmp(err, "synthetic.gguf: ", 16), "message does not name the file: %s", err);
    free(b.p);
}

Test(gguf, synthetic_file_reads_back)
{
    gb b = build(good());
    gguf_file *f;
    char err[256];
    cr_assert(gguf_open_memory(&f, b.p, b.n, "s", err, sizeof err) == 0, "%s", err);
    cr_expect_eq(gguf_version(f), 3u);
    cr_expect_eq(gguf_n_kv(f), 5);
    cr_expect_eq(gguf_n_tensors(f), 2);
    uint32_t u;
    int64_t i64;
    float fl;
    int bo;
    gguf_str st;
    cr_expect(gguf_get_u32(f, "test.count", &u) == 0 && u == 7);
    cr_expect(gguf_get_i64(f, "test.count", &i64) == 0 && i64 == 7, "u32 widens to i64");
    cr_expect(gguf_get_f32(f, "test.scale", &fl) == 0 && fl == 0.5f);
    cr_expect(gguf_get_bool(f, "test.flag", &bo) == 0 && bo == 1);
    cr_expect(gguf_get_str(f, "test.name", &st) == 0 && gguf_str_eq(st, "tiny"));
    cr_expect_eq(gguf_get_u32(f, "test.name", &u), -2, "a string is not a u32");
    cr_expect_eq(gguf_get_f32(f, "test.count", &fl), -2, "an integer is not a float");
    cr_expect_eq(gguf_get_u32(f, "no.such.key", &u), -1);
    cr_expect(gguf_arr_str(f, "test.words", 2, &st) == 0 && gguf_str_eq(st, "gamma"));
    cr_expect(gguf_arr_str(f, "test.words", 1, &st) == 0 && st.len == 0);
    cr_expect_eq(gguf_arr_str(f, "test.words", 3, &st), -2, "index past the end");
    cr_expect_eq(gguf_arr_i64(f, "test.words", 0, &i64), -2, "strings are not integers");
    const gguf_tensor *t = gguf_find_tensor(f, "t1");
    cr_assert(t);
    float v;
    memcpy(&v, (const char *)t->data + 4 * 3, 4);
    cr_expect_eq(v, -3.0f);
    cr_expect_eq(t->nbytes, 64u);
    cr_expect_null(gguf_find_tensor(f, "t2"));
    gguf_free(f);
    free(b.p);
}

Test(gguf, truncation_at_every_byte_is_refused)
{
    gb b = build(good());
    for (size_t cut = 0; cut < b.n; cut++) {
        gguf_file *f = NULL;
        char err[512] = "";
        int rc = gguf_open_memory(&f, b.p, cut, "cut.gguf", err, sizeof err);
        cr_expect_eq(rc, -1, "a file cut at byte %zu of %zu was accepted", cut, b.n);
        if (rc == 0) gguf_free(f);
        cr_expect(strstr(err, "truncated") || strstr(err, "not a GGUF") || strstr(err, "cannot fit") ||
                      strstr(err, "exceeds") || strstr(err, "claims"),
                  "cut at %zu: unexpected message '%s'", cut, err);
    }
    free(b.p);
}

Test(gguf, corrupt_headers_are_refused_with_a_reason)
{
    spec s;
    s = good(); s.version = 1; expect_refused(s, "version 1 is no longer supported");
    s = good(); s.version = 4; expect_refused(s, "unsupported GGUF version 4");
    s = good(); s.version = 3u << 24; expect_refused(s, "big-endian");
    s = good(); s.n_kv_override = 1ull << 60; expect_refused(s, "cannot fit");
    s = good(); s.n_t_override = 1ull << 40; expect_refused(s, "cannot fit");
    s = good(); s.str_len_override = 1ull << 50; expect_refused(s, "claims");
    s = good(); s.arr_count_override = 1ull << 40; expect_refused(s, "exceeds the file");
    s = good(); s.alignment = 3; expect_refused(s, "power of two");
    s = good(); s.t1_offset_add = 4; expect_refused(s, "not aligned");
    s = good(); s.t1_offset_add = 4096; expect_refused(s, "past the end");
    s = good(); s.truncate_data = 1; expect_refused(s, "past the end");
    s = good(); s.t1_type = GGML_TYPE_Q4_K; expect_refused(s, "not a multiple of the Q4_K block size");
    s = good(); s.t1_type = 99; expect_refused(s, "unknown type id 99");
    s = good(); s.t1_ndims = 5; expect_refused(s, "dimensions");
    s = good(); s.t1_ndims = 0; expect_refused(s, "dimensions");
    s = good(); s.t1_ne0 = -16; expect_refused(s, "negative");
    s = good(); s.dup_key = 1; expect_refused(s, "duplicate metadata key 'test.count'");
    s = good(); s.dup_tensor = 1; expect_refused(s, "duplicate tensor name 't0'");
    s = good(); s.bool_value = 2; expect_refused(s, "bool value 2");
}

/* A name quoted from the file may hold control bytes; the message must stay one printable line. */
Test(gguf, control_bytes_in_quoted_names_keep_the_message_one_line)
{
    gb b = { 0 };
    put(&b, "GGUF", 4);
    u32(&b, 3);
    u64(&b, 0);
    u64(&b, 2);
    str(&b, "evil\r\n\x1b[2Jkey");
    u32(&b, VT_U32);
    u32(&b, 1);
    str(&b, "evil\r\n\x1b[2Jkey");
    u32(&b, VT_U32);
    u32(&b, 2);
    gguf_file *f;
    char err[512];
    cr_assert_eq(gguf_open_memory(&f, b.p, b.n, "ctl", err, sizeof err), -1);
    cr_expect(strstr(err, "duplicate"), "%s", err);
    for (const char *q = err; *q; q++) cr_expect((unsigned char)*q >= 0x20 && *q != 0x7f, "control byte in: %s", err);
    free(b.p);
}

Test(gguf, bad_magic_and_alignment_64)
{
    gb b = build(good());
    b.p[0] = 'X';
    gguf_file *f;
    char err[256];
    cr_expect_eq(gguf_open_memory(&f, b.p, b.n, "m", err, sizeof err), -1);
    cr_expect(strstr(err, "not a GGUF file"), "%s", err);
    free(b.p);
    spec s = good();
    s.alignment = 64;
    b = build(s);
    cr_assert(gguf_open_memory(&f, b.p, b.n, "a64", err, sizeof err) == 0, "%s", err);
    cr_expect_eq(gguf_alignment(f), 64u);
    const gguf_tensor *t = gguf_find_tensor(f, "t1");
    cr_expect_eq((size_t)((const uint8_t *)t->data - b.p) % 64, 0u);
    gguf_free(f);
    free(b.p);
}

Test(gguf, missing_path_directory_and_empty_file)
{
    gguf_file *f;
    char err[512];
    cr_expect_eq(gguf_open(&f, "/nonexistent/x.gguf", err, sizeof err), -1);
    cr_expect(strstr(err, "/nonexistent/x.gguf: No such file"), "%s", err);
    cr_expect_eq(gguf_open(&f, "/tmp", err, sizeof err), -1);
    cr_expect(strstr(err, "is a directory"), "%s", err);
    char path[] = "/tmp/kvchat-empty-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_expect_eq(gguf_open(&f, path, err, sizeof err), -1);
    cr_expect(strstr(err, "not a GGUF file"), "%s", err);
    unlink(path);
}

/* Facts of the shared test files. Values marked (gguf-py) were read with the gguf Python package's
 * GGUFReader, an independent reader, and are hard-coded here as expectations. */
Test(gguf, tiny_model_facts)
{
    gguf_file *f;
    char err[512];
    cr_assert(gguf_open(&f, TD "tiny/tiny-gemma3-q4_k_m.gguf", err, sizeof err) == 0, "%s", err);
    cr_expect_eq(gguf_version(f), 3u);
    cr_expect_eq(gguf_n_tensors(f), 80);
    cr_expect_eq(gguf_n_kv(f), 25);
    cr_expect_eq(gguf_alignment(f), 32u);
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    cr_assert(t);
    cr_expect_eq(t->type, 8u);
    cr_expect_eq(t->ne[0], 384);
    cr_expect_eq(t->ne[1], 32000);
    uint32_t u;
    cr_expect(gguf_get_u32(f, "gemma3.embedding_length", &u) == 0 && u == 384);
    cr_expect(gguf_get_u32(f, "gemma3.attention.sliding_window", &u) == 0 && u == 32);
    gguf_free(f);

    cr_assert(gguf_open(&f, TD "tiny/tiny-llama-q4_k_m.gguf", err, sizeof err) == 0, "%s", err);
    cr_expect(gguf_get_u32(f, "llama.block_count", &u) == 0 && u == 4);
    enum gguf_vtype et;
    uint64_t n;
    const void *d;
    cr_expect(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, &d) == 0 && et == GGUF_VT_STRING && n == 32000);
    gguf_str s;
    cr_expect(gguf_arr_str(f, "tokenizer.ggml.tokens", 1, &s) == 0 && gguf_str_eq(s, "<s>"));
    cr_expect(gguf_arr_str(f, "tokenizer.ggml.tokens", 13, &s) == 0 && gguf_str_eq(s, "<0x0A>"));
    cr_expect(gguf_arr_str(f, "tokenizer.ggml.tokens", 450, &s) == 0 && gguf_str_eq(s, "\xe2\x96\x81The"));  /* gguf-py */
    int64_t ty;
    cr_expect(gguf_arr_i64(f, "tokenizer.ggml.token_type", 0, &ty) == 0 && ty == 2);  /* <unk>: UNKNOWN */
    cr_expect(gguf_arr_i64(f, "tokenizer.ggml.token_type", 13, &ty) == 0 && ty == 6); /* byte piece */
    double sc;
    cr_expect(gguf_arr_f64(f, "tokenizer.ggml.scores", 450, &sc) == 0 && sc < 0);
    t = gguf_find_tensor(f, "output.weight");
    cr_assert(t);
    cr_expect_eq(t->type, (uint32_t)GGML_TYPE_Q6_K);
    gguf_free(f);

    /* every shared file opens; the vocabulary file has no tensors */
    const char *all[] = { TD "tiny/tiny-llama-f16.gguf", TD "tiny/tiny-gemma3-f16.gguf", TD "vocab/llama-spm.gguf" };
    for (int i = 0; i < 3; i++) {
        cr_assert(gguf_open(&f, all[i], err, sizeof err) == 0, "%s", err);
        if (i == 2) cr_expect_eq(gguf_n_tensors(f), 0);
        gguf_free(f);
    }
}

/* Cuts through the header region of a real model: each must be refused, never crash. */
Test(gguf, real_file_cut_in_its_header_is_refused)
{
    int fd = open(TD "tiny/tiny-gemma3-q4_k_m.gguf", O_RDONLY);
    cr_assert(fd >= 0);
    size_t hdr = 728736 + 4096;
    uint8_t *buf = malloc(hdr);
    cr_assert_eq(read(fd, buf, hdr), (ssize_t)hdr);
    close(fd);
    for (size_t cut = 0; cut < hdr; cut += hdr / 200) {
        gguf_file *f = NULL;
        char err[512];
        int rc = gguf_open_memory(&f, buf, cut, "cut", err, sizeof err);
        cr_expect_eq(rc, -1, "cut at %zu accepted", cut);
        if (rc == 0) gguf_free(f);
    }
    free(buf);
}
