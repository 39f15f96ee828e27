/* test_gguf_write.c - the GGUF writer (engine/gguf_write.c), read back by the reader (engine/gguf.c).
 *
 * Every metadata value type, arrays of each, a vocabulary copied from a tiny model file, tensors of
 * several types streamed in pieces of random sizes, other alignments; and the file handling: an
 * existing destination refused (or replaced with overwrite), a symbolic link at the destination
 * replaced and never followed, nothing left behind by an unfinished or short write. Files go to a
 * fresh directory under /tmp. Random piece sizes print their seed (GW_SEED replays). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/quant.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"

static char dir[256];

static void mkdir_tmp(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvchat-gw-XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp");
}

static void rm_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(gguf_write, .init = mkdir_tmp, .fini = rm_dir);

static int entries_in_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    cr_assert(p && fscanf(p, "%d", &n) == 1);
    pclose(p);
    return n;
}

static uint64_t rng;
static uint32_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

Test(gguf_write, every_value_type_and_tensor_reads_back)
{
    const char *env = getenv("GW_SEED");
    rng = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    cr_log_info("seed %llu (GW_SEED to replay)", (unsigned long long)rng);
    char path[300], err[512];
    snprintf(path, sizeof path, "%s/all.gguf", dir);
    gguf_writer *w = gguf_writer_create(0);
    cr_assert(w);
    cr_assert_eq(gguf_w_u8(w, "t.u8", 200), 0);
    cr_assert_eq(gguf_w_i8(w, "t.i8", -100), 0);
    cr_assert_eq(gguf_w_u16(w, "t.u16", 60000), 0);
    cr_assert_eq(gguf_w_i16(w, "t.i16", -30000), 0);
    cr_assert_eq(gguf_w_u32(w, "t.u32", 4000000000u), 0);
    cr_assert_eq(gguf_w_i32(w, "t.i32", -2000000000), 0);
    cr_assert_eq(gguf_w_f32(w, "t.f32", 1.5e-3f), 0);
    cr_assert_eq(gguf_w_bool(w, "t.bool", 1), 0);
    cr_assert_eq(gguf_w_str(w, "t.str", "h\xc3\xa9llo"), 0);
    cr_assert_eq(gguf_w_u64(w, "t.u64", 1ull << 60), 0);
    cr_assert_eq(gguf_w_i64(w, "t.i64", -(1ll << 60)), 0);
    cr_assert_eq(gguf_w_f64(w, "t.f64", 0.1), 0);
    const int32_t ai[3] = { -1, 0, 7 };
    const float af[2] = { 0.25f, -8.0f };
    const uint8_t ab[3] = { 1, 0, 1 };
    const char *as[3] = { "a", "", "\xe2\x96\x81piece" };
    cr_assert_eq(gguf_w_arr(w, "t.ai32", GGUF_VT_INT32, ai, 3), 0);
    cr_assert_eq(gguf_w_arr(w, "t.af32", GGUF_VT_FLOAT32, af, 2), 0);
    cr_assert_eq(gguf_w_arr(w, "t.abool", GGUF_VT_BOOL, ab, 3), 0);
    cr_assert_eq(gguf_w_arr(w, "t.aempty", GGUF_VT_UINT64, NULL, 0), 0);
    cr_assert_eq(gguf_w_arr_str(w, "t.astr", as, 3), 0);
    /* the vocabulary of a tiny model, copied verbatim */
    gguf_file *src;
    cr_assert(gguf_open(&src, "../shared/testdata/tiny/tiny-llama-f16.gguf", err, sizeof err) == 0, "%s", err);
    int copied = 0;
    for (int64_t i = 0; i < gguf_n_kv(src); i++) {
        gguf_str k = gguf_key_name(src, i);
        if (k.len > 10 && !memcmp(k.ptr, "tokenizer.", 10)) {
            cr_assert_eq(gguf_w_copy_kv(w, src, i), 0);
            copied++;
        }
    }
    cr_assert(copied >= 5);
    /* tensors: f32 [5], Q8_0 [64 x 3], Q4_K [256 x 2], F16 [7 x 2 x 3] */
    const int64_t ne_a[1] = { 5 }, ne_b[2] = { 64, 3 }, ne_c[2] = { 256, 2 }, ne_d[3] = { 7, 2, 3 };
    cr_assert_eq(gguf_w_tensor(w, "a", 1, ne_a, GGML_TYPE_F32), 0);
    cr_assert_eq(gguf_w_tensor(w, "b", 2, ne_b, GGML_TYPE_Q8_0), 0);
    cr_assert_eq(gguf_w_tensor(w, "c", 2, ne_c, GGML_TYPE_Q4_K), 0);
    cr_assert_eq(gguf_w_tensor(w, "d", 3, ne_d, GGML_TYPE_F16), 0);
    uint64_t total = gguf_w_data_bytes(w);
    cr_assert_eq(total, 20 + 3 * 2 * 34 + 2 * 144 + 42 * 2);
    uint8_t *data = malloc((size_t)total);
    for (uint64_t i = 0; i < total; i++) data[i] = (uint8_t)rnd();
    /* streamed in pieces of random sizes, across tensor boundaries */
    cr_assert_eq(gguf_w_begin(w, path, 0, err, sizeof err), 0, "%s", err);
    for (uint64_t off = 0; off < total;) {
        size_t k = 1 + rnd() % 97;
        if (k > total - off) k = (size_t)(total - off);
        cr_assert_eq(gguf_w_data(w, data + off, k, err, sizeof err), 0, "%s", err);
        off += k;
    }
    cr_assert_eq(gguf_w_finish(w, err, sizeof err), 0, "%s", err);
    gguf_writer_free(w);
    cr_assert_eq(entries_in_dir(), 1, "the temporary file is gone");

    gguf_file *f;
    cr_assert(gguf_open(&f, path, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(gguf_version(f), 3);
    cr_assert_eq(gguf_alignment(f), 32);
    cr_assert_eq(gguf_n_kv(f), 17 + copied);
    int64_t v;
    uint32_t u;
    float fl;
    int b;
    gguf_str s;
    cr_assert(gguf_get_i64(f, "t.u8", &v) == 0 && v == 200 && gguf_kv_type(f, gguf_find_key(f, "t.u8")) == GGUF_VT_UINT8);
    cr_assert(gguf_get_i64(f, "t.i8", &v) == 0 && v == -100);
    cr_assert(gguf_get_i64(f, "t.u16", &v) == 0 && v == 60000);
    cr_assert(gguf_get_i64(f, "t.i16", &v) == 0 && v == -30000);
    cr_assert(gguf_get_u32(f, "t.u32", &u) == 0 && u == 4000000000u);
    cr_assert(gguf_get_i64(f, "t.i32", &v) == 0 && v == -2000000000);
    cr_assert(gguf_get_f32(f, "t.f32", &fl) == 0 && fl == 1.5e-3f);
    cr_assert(gguf_get_bool(f, "t.bool", &b) == 0 && b == 1);
    cr_assert(gguf_get_str(f, "t.str", &s) == 0 && gguf_str_eq(s, "h\xc3\xa9llo"));
    cr_assert(gguf_get_i64(f, "t.u64", &v) == 0 && v == (int64_t)(1ull << 60));
    cr_assert(gguf_get_i64(f, "t.i64", &v) == 0 && v == -(1ll << 60));
    cr_assert(gguf_get_f32(f, "t.f64", &fl) == 0 && fl == 0.1f);
    cr_assert_eq(gguf_kv_type(f, gguf_find_key(f, "t.f64")), GGUF_VT_FLOAT64);
    for (uint64_t i = 0; i < 3; i++) {
        cr_assert(gguf_arr_i64(f, "t.ai32", i, &v) == 0 && v == ai[i]);
        cr_assert(gguf_arr_str(f, "t.astr", i, &s) == 0 && gguf_str_eq(s, as[i]));
    }
    double d;
    cr_assert(gguf_arr_f64(f, "t.af32", 1, &d) == 0 && d == -8.0);
    enum gguf_vtype et;
    uint64_t n;
    const void *p;
    cr_assert(gguf_get_arr(f, "t.abool", &et, &n, &p) == 0 && et == GGUF_VT_BOOL && n == 3 && !memcmp(p, ab, 3));
    cr_assert(gguf_get_arr(f, "t.aempty", &et, &n, &p) == 0 && et == GGUF_VT_UINT64 && n == 0);
    /* the copied vocabulary is the source's, byte for byte */
    for (int64_t i = 0; i < gguf_n_kv(src); i++) {
        gguf_str k = gguf_key_name(src, i);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        if (strncmp(key, "tokenizer.", 10)) continue;
        int64_t j = gguf_find_key(f, key);
        cr_assert(j >= 0, "%s copied", key);
        const void *r1, *r2;
        uint64_t l1, l2;
        cr_assert(gguf_kv_raw(src, i, &r1, &l1) == 0 && gguf_kv_raw(f, j, &r2, &l2) == 0);
        cr_assert(l1 == l2 && !memcmp(r1, r2, (size_t)l1) && gguf_kv_type(src, i) == gguf_kv_type(f, j), "%s", key);
    }
    cr_assert_eq(gguf_n_tensors(f), 4);
    const char *names[] = { "a", "b", "c", "d" };
    uint64_t off = 0;
    for (int i = 0; i < 4; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, names[i]);
        cr_assert(t && t->data);
        cr_assert_eq(t->offset % 32, 0);
        cr_assert(!memcmp(t->data, data + off, (size_t)t->nbytes), "tensor %s's bytes", names[i]);
        off += t->nbytes;
    }
    const gguf_tensor *td = gguf_find_tensor(f, "d");
    cr_assert(td->n_dims == 3 && td->ne[0] == 7 && td->ne[1] == 2 && td->ne[2] == 3 && td->type == GGML_TYPE_F16);
    gguf_free(f);
    gguf_free(src);
    free(data);
}

Test(gguf_write, other_alignments_place_every_tensor_on_them)
{
    char path[300], err[512];
    snprintf(path, sizeof path, "%s/al.gguf", dir);
    gguf_writer *w = gguf_writer_create(64);
    cr_assert(w);
    const int64_t ne1[1] = { 3 }, ne2[1] = { 32 };
    cr_assert_eq(gguf_w_tensor(w, "x", 1, ne1, GGML_TYPE_F32), 0);
    cr_assert_eq(gguf_w_tensor(w, "y", 1, ne2, GGML_TYPE_Q8_0), 0);
    cr_assert_eq(gguf_w_begin(w, path, 0, err, sizeof err), 0, "%s", err);
    uint8_t bytes[46];
    for (int i = 0; i < 46; i++) bytes[i] = (uint8_t)i;
    cr_assert_eq(gguf_w_data(w, bytes, 46, err, sizeof err), 0);
    cr_assert_eq(gguf_w_finish(w, err, sizeof err), 0, "%s", err);
    gguf_writer_free(w);
    gguf_file *f;
    cr_assert(gguf_open(&f, path, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(gguf_alignment(f), 64);
    const gguf_tensor *y = gguf_find_tensor(f, "y");
    cr_assert_eq(y->offset, 64);
    cr_assert(!memcmp(y->data, bytes + 12, 34));
    cr_assert_eq(gguf_file_size(f) % 64, 0, "the last tensor is padded too");
    gguf_free(f);
    cr_assert_null(gguf_writer_create(48), "48 is not a power of two");
}

Test(gguf_write, bad_metadata_and_tensors_are_refused_with_a_reason)
{
    char err[512], path[300];
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    gguf_writer *w = gguf_writer_create(0);
    cr_assert_eq(gguf_w_u32(w, "k", 1), 0);
    cr_assert_eq(gguf_w_u32(w, "k", 2), -1);
    cr_assert_eq(gguf_w_begin(w, path, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "duplicate metadata key: k"), "%s", err);
    gguf_writer_free(w);
    w = gguf_writer_create(0);
    const int64_t odd[2] = { 33, 2 };
    cr_assert_eq(gguf_w_tensor(w, "q", 2, odd, GGML_TYPE_Q8_0), -1);
    cr_assert_eq(gguf_w_begin(w, path, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "bad tensor shape"), "%s", err);
    gguf_writer_free(w);
    cr_assert_eq(entries_in_dir(), 0, "nothing was created");
}

Test(gguf_write, existing_files_and_links_at_the_destination)
{
    char path[300], target[300], err[512];
    snprintf(path, sizeof path, "%s/out.gguf", dir);
    snprintf(target, sizeof target, "%s/target.txt", dir);
    FILE *t = fopen(target, "w");
    fputs("keep me", t);
    fclose(t);
    cr_assert_eq(symlink(target, path), 0);
    const int64_t ne[1] = { 4 };
    const float x[4] = { 1, 2, 3, 4 };
    for (int overwrite = 0; overwrite < 2; overwrite++) {
        gguf_writer *w = gguf_writer_create(0);
        gguf_w_tensor(w, "x", 1, ne, GGML_TYPE_F32);
        int rc = gguf_w_begin(w, path, overwrite, err, sizeof err);
        if (!overwrite) {
            cr_assert_eq(rc, -2, "an existing name (here a link) is refused");
            cr_assert(strstr(err, "already exists"), "%s", err);
        } else {
            cr_assert_eq(rc, 0, "%s", err);
            cr_assert_eq(gguf_w_data(w, x, sizeof x, err, sizeof err), 0);
            cr_assert_eq(gguf_w_finish(w, err, sizeof err), 0, "%s", err);
        }
        gguf_writer_free(w);
    }
    struct stat st;
    cr_assert(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "the link itself was replaced by the file");
    char buf[16] = { 0 };
    t = fopen(target, "r");
    cr_assert(fgets(buf, sizeof buf, t));
    fclose(t);
    cr_assert_str_eq(buf, "keep me", "the link's target was not written through");
    cr_assert_eq(entries_in_dir(), 2);
}

Test(gguf_write, unfinished_and_short_writes_leave_nothing_behind)
{
    char path[300], err[512];
    snprintf(path, sizeof path, "%s/short.gguf", dir);
    const int64_t ne[1] = { 8 };
    const float x[9] = { 0 };
    /* freed before finishing */
    gguf_writer *w = gguf_writer_create(0);
    gguf_w_tensor(w, "x", 1, ne, GGML_TYPE_F32);
    cr_assert_eq(gguf_w_begin(w, path, 0, err, sizeof err), 0);
    cr_assert_eq(entries_in_dir(), 1, "the temporary file while writing");
    gguf_writer_free(w);
    cr_assert_eq(entries_in_dir(), 0);
    /* too few bytes */
    w = gguf_writer_create(0);
    gguf_w_tensor(w, "x", 1, ne, GGML_TYPE_F32);
    cr_assert_eq(gguf_w_begin(w, path, 0, err, sizeof err), 0);
    cr_assert_eq(gguf_w_data(w, x, 7 * sizeof(float), err, sizeof err), 0);
    cr_assert_eq(gguf_w_finish(w, err, sizeof err), -1);
    cr_assert(strstr(err, "has 28 of its 32 bytes"), "%s", err);
    gguf_writer_free(w);
    cr_assert_eq(entries_in_dir(), 0);
    /* too many */
    w = gguf_writer_create(0);
    gguf_w_tensor(w, "x", 1, ne, GGML_TYPE_F32);
    cr_assert_eq(gguf_w_begin(w, path, 0, err, sizeof err), 0);
    cr_assert_eq(gguf_w_data(w, x, sizeof x, err, sizeof err), -1);
    cr_assert(strstr(err, "more tensor data than the tensors hold"), "%s", err);
    gguf_writer_free(w);
    cr_assert_eq(entries_in_dir(), 0);
    /* a directory that does not exist */
    char nowhere[300];
    snprintf(nowhere, sizeof nowhere, "%s/no/such/dir.gguf", dir);
    w = gguf_writer_create(0);
    cr_assert_eq(gguf_w_begin(w, nowhere, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "cannot create a file beside it"), "%s", err);
    gguf_writer_free(w);
}

/* Only a regular file or a link is ever replaced: a FIFO or a directory at the destination is refused
 * before anything is written, with overwrite too, and stays what it was. */
Test(gguf_write, a_fifo_or_directory_at_the_destination_is_refused_even_with_overwrite)
{
    char path[300], err[512];
    const int64_t ne[1] = { 4 };
    for (int kind = 0; kind < 2; kind++) {
        snprintf(path, sizeof path, "%s/%s", dir, kind ? "adir.gguf" : "fifo.gguf");
        cr_assert_eq(kind ? mkdir(path, 0700) : mkfifo(path, 0600), 0);
        for (int overwrite = 0; overwrite < 2; overwrite++) {
            gguf_writer *w = gguf_writer_create(0);
            gguf_w_tensor(w, "x", 1, ne, GGML_TYPE_F32);
            cr_expect_eq(gguf_w_begin(w, path, overwrite, err, sizeof err), -1);
            cr_expect(strstr(err, path) && strstr(err, kind ? "is a directory" : "is a FIFO"), "%s", err);
            gguf_writer_free(w);
        }
        struct stat st;
        cr_assert(lstat(path, &st) == 0 && (kind ? S_ISDIR(st.st_mode) : S_ISFIFO(st.st_mode)));
    }
    cr_expect_eq(entries_in_dir(), 2, "no temporary file is left");
}

/* A stream (a pipe, standard output) gets the same bytes as a file: the writer never seeks. */
Test(gguf_write, a_pipe_gets_the_bytes_a_file_gets)
{
    char path[300], spath[300], err[512], cmd[700];
    snprintf(path, sizeof path, "%s/file.gguf", dir);
    snprintf(spath, sizeof spath, "%s/piped.gguf", dir);
    const int64_t ne[1] = { 40 };
    float x[40];
    for (int i = 0; i < 40; i++) x[i] = (float)i;
    for (int s = 0; s < 2; s++) {
        gguf_writer *w = gguf_writer_create(64);
        gguf_w_str(w, "general.name", "s");
        gguf_w_tensor(w, "x", 1, ne, GGML_TYPE_F32);
        gguf_w_tensor(w, "y", 1, ne, GGML_TYPE_F32);
        FILE *f = NULL;
        if (s) {
            snprintf(cmd, sizeof cmd, "cat > '%s'", spath);
            cr_assert(f = popen(cmd, "w"));
            cr_assert_eq(gguf_w_begin_stream(w, f, "a pipe", err, sizeof err), 0, "%s", err);
        } else {
            cr_assert_eq(gguf_w_begin(w, path, 0, err, sizeof err), 0, "%s", err);
        }
        cr_assert_eq(gguf_w_data(w, x, sizeof x, err, sizeof err), 0, "%s", err);
        cr_assert_eq(gguf_w_data(w, x, sizeof x, err, sizeof err), 0, "%s", err);
        cr_assert_eq(gguf_w_finish(w, err, sizeof err), 0, "%s", err);
        gguf_writer_free(w);
        if (s) cr_assert_eq(pclose(f), 0, "the stream is left open for its owner to close");
    }
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", path, spath);
    cr_expect_eq(system(cmd), 0, "the pipe's bytes differ from the file's");
}
