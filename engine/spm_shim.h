/* spm_shim.h - C view of the SentencePiece C++ library: load a model (serialized ModelProto bytes:
 * a .model file's contents), encode text to ids. The only C++ in kvchat is the implementation of this header. */
#ifndef KVCHAT_SPM_SHIM_H
#define KVCHAT_SPM_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spm_proc spm_proc;

spm_proc *spm_load_proto(const void *data, size_t len, char *err, size_t errlen);
void spm_free(spm_proc *p);
int spm_piece_size(const spm_proc *p);
/* Encode len bytes; appends ids to *ids (realloc'd, capacity *cap) after *n existing ones. 0 or -1. */
int spm_encode(const spm_proc *p, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap, char *err,
               size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
