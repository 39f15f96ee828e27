/* gguf.h - read-only view of a GGUF model file (mmap'd, every count and offset validated).
 *
 * gguf_open() maps the file and checks the whole header, metadata and tensor table against the file
 * size before returning; afterwards every accessor is a plain lookup that cannot read out of bounds.
 * It knows nothing about architectures (engine/model.c interprets the keys); engine/gguf_write.c
 * writes files. */
#ifndef KVCHAT_GGUF_H
#define KVCHAT_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Metadata value types, numbered as in the file format. */
enum gguf_vtype {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12, GGUF_VT_COUNT
};

/* A string inside the mapped file: not NUL-terminated. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

/* One tensor of the table. data points into the mapping; nbytes is exact (rows * row size). */
typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[4];          /* ne[0] fastest; unused dims are 1 */
    uint32_t type;          /* ggml type id (see engine/quant.h) */
    uint64_t offset;        /* relative to the data section */
    const void *data;
    uint64_t nbytes;
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Map and validate PATH. Returns 0 and *out, or -1 with a one-line message in err
 * ("PATH: truncated: tensor table ends past end of file"). Tensor types unknown to kvchat are
 * accepted here (their size cannot be checked, so they are rejected only if the type id is not a
 * known ggml type); engine/model.c refuses unsupported types by name. */
int gguf_open(gguf_file **out, const char *path, char *err, size_t errlen);
/* Same, over a caller-owned buffer (used by the fuzzer and tests); the buffer must outlive the file. */
int gguf_open_memory(gguf_file **out, const void *buf, size_t size, const char *label, char *err,
                     size_t errlen);
void gguf_free(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_file_size(const gguf_file *f);
uint32_t gguf_alignment(const gguf_file *f);

/* Metadata. Keys are looked up by exact name; -1 when absent. */
int64_t gguf_n_kv(const gguf_file *f);
int64_t gguf_find_key(const gguf_file *f, const char *key);
gguf_str gguf_key_name(const gguf_file *f, int64_t i);
enum gguf_vtype gguf_kv_type(const gguf_file *f, int64_t i);

/* The i-th value exactly as the file stores it after its type (for an array: its element type,
 * count and elements), validated at open: what a writer copies verbatim. 0, or -1 for a bad i. */
int gguf_kv_raw(const gguf_file *f, int64_t i, const void **bytes, uint64_t *len);

/* Typed getters: 0 on success; -1 when the key is absent; -2 when its type does not convert
 * (integers of any width widen to the requested type if the value fits; floats read F32 or F64). */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);

/* Arrays: element type and count; for numeric arrays, a pointer to the packed little-endian
 * elements (may be unaligned: read with memcpy); for string arrays use gguf_arr_str. */
int gguf_get_arr(const gguf_file *f, const char *key, enum gguf_vtype *elem_type, uint64_t *n,
                 const void **data);
/* i-th string of a string array (O(1): offsets are indexed at open time). */
int gguf_arr_str(const gguf_file *f, const char *key, uint64_t i, gguf_str *out);
/* Array element i of any integer type widened to int64 / any float type to double; -2 on type mismatch. */
int gguf_arr_i64(const gguf_file *f, const char *key, uint64_t i, int64_t *out);
int gguf_arr_f64(const gguf_file *f, const char *key, uint64_t i, double *out);

/* Tensors. */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

const char *gguf_vtype_name(enum gguf_vtype t);
int gguf_str_eq(gguf_str s, const char *cstr);

#endif
