/* gguf_write.h - writing a GGUF file (version 3), the reader's counterpart (engine/gguf.h).
 *
 * Metadata and tensor descriptions are collected first (the metadata is serialized as it is
 * given: a vocabulary of 262144 pieces is a few MiB); gguf_w_begin writes the header to a
 * temporary file beside the destination, then the tensors' bytes are streamed in table order
 * (gguf_w_data, any piece size), so a file larger than memory never is held whole; gguf_w_finish
 * renames it into place (common/files.h's files_atomic). The destination is never followed if it
 * is a symbolic link (it is replaced, with overwrite), an existing file is refused unless overwrite
 * is set, and a directory, FIFO, device or socket there is always refused. The writer never seeks,
 * so gguf_w_begin_stream can write to a pipe. */
#ifndef KVCHAT_GGUF_WRITE_H
#define KVCHAT_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/gguf.h"

typedef struct gguf_writer gguf_writer;

/* NULL when out of memory. alignment: of the data section and every tensor (a power of two; 0:
 * the format's default 32, written as general.alignment only when it is not 32). */
gguf_writer *gguf_writer_create(uint32_t alignment);
/* Frees the writer; an unfinished file is removed. NULL is a no-op. */
void gguf_writer_free(gguf_writer *w);

/* Metadata, in the order given. Each returns 0, or -1 (a duplicate key, an empty key, out of
 * memory); the first failure is kept and reported again by gguf_w_begin. */
int gguf_w_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_w_i8(gguf_writer *w, const char *key, int8_t v);
int gguf_w_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_w_i16(gguf_writer *w, const char *key, int16_t v);
int gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_w_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_w_f32(gguf_writer *w, const char *key, float v);
int gguf_w_bool(gguf_writer *w, const char *key, int v);
int gguf_w_str(gguf_writer *w, const char *key, const char *v);
int gguf_w_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_w_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_w_f64(gguf_writer *w, const char *key, double v);
/* An array of n numbers or bools of type elem, packed little-endian at data (bools: bytes 0/1). */
int gguf_w_arr(gguf_writer *w, const char *key, enum gguf_vtype elem, const void *data, uint64_t n);
/* An array of n NUL-terminated strings. */
int gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
/* The i-th metadata entry of src, key and value as they are (nested arrays included). */
int gguf_w_copy_kv(gguf_writer *w, const gguf_file *src, int64_t i);

/* A tensor of type `type` (common/quant.h) and shape ne[0..n_dims) (ne[0] fastest; a multiple of
 * the type's block size). 0, or -1 (a bad shape or type, a duplicate name). */
int gguf_w_tensor(gguf_writer *w, const char *name, int n_dims, const int64_t *ne, uint32_t type);
/* Bytes of tensor i as the file will hold them; the total of every tensor's. */
uint64_t gguf_w_tensor_bytes(const gguf_writer *w, int i);
uint64_t gguf_w_data_bytes(const gguf_writer *w);

/* Create PATH.XXXXXX beside path and write the header. 0; -1 with a message (path is a directory,
 * FIFO, device or socket, or cannot be written); -2 when path exists and overwrite is 0 (nothing is
 * created). */
int gguf_w_begin(gguf_writer *w, const char *path, int overwrite, char *err, size_t errlen);
/* The same to an open stream (standard output, a pipe), name standing for it in messages. The
 * stream is flushed by gguf_w_finish, never closed; an unfinished stream holds part of a file. */
int gguf_w_begin_stream(gguf_writer *w, FILE *f, const char *name, char *err, size_t errlen);
/* The next n bytes of tensor data, in the order the tensors were added (padding between tensors is
 * written here). 0, or -1 with a message (a write error, more bytes than the tensors hold). */
int gguf_w_data(gguf_writer *w, const void *bytes, size_t n, char *err, size_t errlen);
/* Check every byte was given, flush to disk and move the file to its path. 0, or -1 with a message
 * (the temporary file is removed; -2 when the path appeared meanwhile and overwrite is 0). */
int gguf_w_finish(gguf_writer *w, char *err, size_t errlen);

#endif
