/* const_copies.h - device copies of small inputs that stay the same from call to call (a layer's
 * norm weights; a step's positions, the same for every layer's qk_rope and attention) for the
 * CUDA backend (kernels/cuda/backend_cuda.cu).
 *
 * A copy is keyed by the host address and kept with the host bytes it holds, so a call costs a
 * comparison instead of a copy while those bytes stay the same; new or changed bytes are sent again
 * (or written on the device by the caller: cc_claim). Bytes the caller says never change (cc_fix)
 * are not compared either: 16 KiB a norm, twice a layer, at the 7B shape.
 * The device is reached through three functions, so the table is plain C and is tested on the host
 * (tests/test_const_copies.c) with host memory standing in for the device. */
#ifndef KVCHAT_CONST_COPIES_H
#define KVCHAT_CONST_COPIES_H

#include <stddef.h>
#include <stdint.h>

typedef struct cc_device {
    void *ud;
    void *(*alloc)(void *ud, size_t bytes);                              /* NULL when out of memory */
    void (*release)(void *ud, void *p);
    int (*upload)(void *ud, void *dst, const void *src, size_t bytes);   /* 0, or -1: not sent */
} cc_device;

typedef struct cc_copy {
    const void *host;   /* the key; NULL: an empty slot */
    size_t bytes;       /* 0: a tombstone (its allocation failed): found, and made again next time */
    size_t room;        /* bytes allocated (seen and dev): fewer bytes later reuse them, so a copy
                         * whose length changes (a step's positions: a prompt's chunk, then one
                         * token) is not freed and made again, which would wait for the device */
    void *seen;         /* the host bytes the device copy holds */
    void *dev;
    int stale;          /* the last upload failed: the device may hold neither bytes */
    size_t fixed;       /* bytes the caller said never change (cc_fix; 0: none): not compared again */
} cc_copy;

typedef struct cc_table {
    cc_device dev;
    cc_copy *slots;     /* open addressing on host, a power of two, at most half full */
    int cap, n;
    uint64_t bytes;     /* device bytes held */
    uint64_t uploads;   /* copies sent so far (for tests and figures) */
} cc_table;

enum cc_status { CC_OK, CC_NO_HOST_MEMORY, CC_NO_DEVICE_MEMORY, CC_NOT_SENT };

void cc_init(cc_table *t, const cc_device *dev);
/* Releases every device copy once. */
void cc_free(cc_table *t);
/* The device copy of host[0, bytes) (bytes > 0), brought up to date; NULL with *status saying why. A copy sent
 * now is ordered before later device work by the upload function (one stream). A copy of more
 * bytes under the same key whose first `bytes` are the same serves as it is. */
const void *cc_get(cc_table *t, const void *host, size_t bytes, enum cc_status *status);
/* As cc_get, but new or changed bytes are not sent: *write is then 1, the copy counts as holding
 * host[0, bytes) and the caller writes them into it on the device itself (from a launch's
 * parameters: a decode step's positions, which qk_rope carries) before later device work reads it
 * (one stream); 0 when the copy holds them already. A caller whose write did not happen (its launch
 * failed) calls cc_unwritten. */
const void *cc_claim(cc_table *t, const void *host, size_t bytes, int *write, enum cc_status *status);
/* The copy of host that cc_claim asked the caller to write was not written: sent at its next use. */
void cc_unwritten(cc_table *t, const void *host);
/* As cc_get, for bytes that stay the same at host for the life of the table (a model's norm
 * weights): later calls under host for at most those bytes are answered without comparing them
 * (calls for more are compared and sent as cc_get's). */
const void *cc_fix(cc_table *t, const void *host, size_t bytes, enum cc_status *status);

#endif
