/* tokenizer.h - SentencePiece tokenization of GGUF vocabularies (through engine/spm_shim.cpp).
 *
 * The ModelProto is serialized by hand from tokenizer.ggml.* (pieces, scores, types; BPE trainer spec
 * with byte fallback; identity normalizer with add_dummy_prefix from tokenizer.ggml.add_space_prefix)
 * and loaded into libsentencepiece; a .model file can override it. Special tokens (CONTROL,
 * USER_DEFINED, UNKNOWN texts) are split out by this module before SentencePiece sees the text,
 * the way llama.cpp does, so prompt ids match it exactly. */
#ifndef KVCHAT_TOKENIZER_H
#define KVCHAT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"

typedef struct tok_vocab tok_vocab;

enum tok_type { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER_DEFINED = 4,
                TOK_UNUSED = 5, TOK_BYTE = 6 };

/* Build from the GGUF's tokenizer.ggml.* keys; if spm_model_path is not NULL, load that .model file
 * instead (it must have the same vocabulary size). 0 or -1 with a message. */
int tok_create(tok_vocab **out, const gguf_file *f, const char *spm_model_path, char *err, size_t errlen);
void tok_free(tok_vocab *v);
/* Write the vocabulary as a SentencePiece .model file (the same ModelProto tok_create builds), usable
 * with --tokenizer and by other SentencePiece tools. The file is replaced whole (common/files.h:
 * a link at path is replaced, not followed; a directory, FIFO or device is refused). 0, or -1 with
 * a message. */
int tok_export_model(const tok_vocab *v, const char *path, char *err, size_t errlen);

int32_t tok_n_vocab(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v);
int32_t tok_eos(const tok_vocab *v);
int32_t tok_eot(const tok_vocab *v);            /* <end_of_turn> or similar; -1 if none */
int tok_add_bos(const tok_vocab *v);            /* tokenizer.ggml.add_bos_token */
int tok_is_eog(const tok_vocab *v, int32_t id); /* EOS, EOT: end of generation */
enum tok_type tok_type_of(const tok_vocab *v, int32_t id);
/* Id of a token given its exact text, or -1. */
int32_t tok_find(const tok_vocab *v, const char *text);

/* Encode len bytes of UTF-8 text. add_bos: prepend BOS. parse_special: recognise CONTROL token texts
 * (USER_DEFINED texts are always recognised, as llama.cpp does). The result is malloc'd into *ids
 * (caller frees) with its count in *n. Returns 0, or -1 with a message (invalid UTF-8 is an error:
 * "invalid UTF-8 at byte 17"). */
int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_bos, int parse_special,
               int32_t **ids, size_t *n, char *err, size_t errlen);

/* Text of one token as it appears in output: NORMAL pieces with U+2581 turned into spaces, BYTE
 * pieces as their single raw byte, CONTROL/UNKNOWN/UNUSED as nothing unless render_special.
 * Writes at most cap bytes, returns the full length. */
size_t tok_piece_text(const tok_vocab *v, int32_t id, int render_special, char *buf, size_t cap);
/* The tokens of ids[0..n) whose texts (tok_piece_text) hold the first occurrence of text: [*lo, *hi).
 * 0, or -1 when text does not occur (or is empty) or out of memory. */
int tok_find_text(const tok_vocab *v, const int32_t *ids, size_t n, const char *text, int64_t *lo, int64_t *hi);
/* Raw piece string of a token (as stored in the vocabulary). */
const char *tok_piece(const tok_vocab *v, int32_t id);

/* Decode a whole id sequence into malloc'd NUL-terminated text (SentencePiece rules: the leading
 * space added by add_space_prefix is removed). */
char *tok_decode(const tok_vocab *v, const int32_t *ids, size_t n);

/* Streaming detokenizer: feed ids one at a time and receive only complete UTF-8 characters; bytes of
 * a character split across byte-fallback tokens are held back until it is complete. */
typedef struct tok_stream {
    const tok_vocab *v;
    int first;            /* strip the dummy-prefix space of the first piece when add_space_prefix */
    unsigned char pend[8];
    int npend;
} tok_stream;
void tok_stream_init(tok_stream *s, const tok_vocab *v);
/* Appends the printable text for id to out (capacity cap, NUL-terminated); returns bytes written. */
size_t tok_stream_feed(tok_stream *s, int32_t id, char *out, size_t cap);
/* Flush held-back bytes at the end (an incomplete character becomes U+FFFD). */
size_t tok_stream_flush(tok_stream *s, char *out, size_t cap);

/* Validate UTF-8; returns -1 if valid, else the offset of the first bad byte. */
int64_t tok_utf8_invalid_at(const char *s, size_t len);

#endif
