/* fuzz_gguf.c - libFuzzer harness for the GGUF reader: parse arbitrary bytes and, when the reader
 * accepts them, touch everything it exposes (every key through every typed getter, every array
 * element, the first and last byte of every tensor), so an unchecked count or offset shows up as an
 * AddressSanitizer report. Built and run by `make fuzz`. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/gguf.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *f;
    char err[512];
    if (gguf_open_memory(&f, data, size, "fuzz", err, sizeof err) != 0) {
        if (!memchr(err, 0, sizeof err)) __builtin_trap();  /* the message must be a C string */
        return 0;
    }
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        gguf_str k = gguf_key_name(f, i);
        char key[300];
        snprintf(key, sizeof key, "%.*s", (int)(k.len > 290 ? 290 : k.len), k.ptr);
        if (gguf_find_key(f, key) < 0 && !memchr(k.ptr, 0, k.len) && k.len <= 290) __builtin_trap();
        uint32_t u;
        int64_t i64;
        float fl;
        int b;
        gguf_str s;
        if (gguf_get_u32(f, key, &u) == 0) sink += u;
        if (gguf_get_i64(f, key, &i64) == 0) sink += (uint64_t)i64;
        if (gguf_get_f32(f, key, &fl) == 0) sink += (uint64_t)(fl == fl);
        if (gguf_get_bool(f, key, &b) == 0) sink += (uint64_t)b;
        if (gguf_get_str(f, key, &s) == 0 && s.len) sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        enum gguf_vtype et;
        uint64_t n;
        const void *d;
        if (gguf_get_arr(f, key, &et, &n, &d) == 0) {
            for (uint64_t e = 0; e < n && e < 4096; e++) {
                double dv;
                if (gguf_arr_i64(f, key, e, &i64) == 0) sink += (uint64_t)i64;
                if (gguf_arr_f64(f, key, e, &dv) == 0) sink += (uint64_t)(dv == dv);
                if (gguf_arr_str(f, key, e, &s) == 0 && s.len) sink += (uint8_t)s.ptr[s.len - 1];
            }
            /* and the last element, wherever it is */
            if (n > 0 && gguf_arr_i64(f, key, n - 1, &i64) == 0) sink += (uint64_t)i64;
            if (n > 0 && gguf_arr_str(f, key, n - 1, &s) == 0 && s.len) sink += (uint8_t)s.ptr[0];
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
        char name[300];
        if (t->name.len < 290 && !memchr(t->name.ptr, 0, t->name.len)) {
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            if (gguf_find_tensor(f, name) != t) __builtin_trap();
        }
    }
    gguf_free(f);
    return 0;
}
