/* act_mirror.h - device twins of the forward pass's activation buffers, for a device backend.
 *
 * The forward pass keeps its activations in host buffers and hands their addresses to the ops. A
 * device backend binds each buffer to a device twin, runs its ops on the twins and leaves their
 * outputs there; the host copy is brought up to date only when the host says it is about to read
 * (am_host_read) or write (am_host_write) a range. Each buffer remembers one interval of bytes that
 * are newer on the device and one that is newer on the host; at most one of the two is non-empty,
 * so the rules stay few:
 *   - an op reading a range first uploads what is newer on the host (am_dev_in);
 *   - an op writing a range marks it newer on the device (am_dev_out);
 *   - a host read downloads what of its range is newer on the device;
 *   - a host write (announced before it happens, and writing every byte of its range) first
 *     downloads the bytes newer on the device that it will not overwrite, then marks its range
 *     newer on the host; a host that reads the range before writing it announces the read first;
 *   - a host read announced early (am_host_prefetch) starts its download without waiting; the
 *     bytes count as the host's after the next wait, whoever makes it, unless an op writes the
 *     twin first; a host write or an unbind waits for such a download still in flight.
 * The device is reached through function pointers, so this is plain C, tested on the host
 * (tests/test_act_mirror.c) with host memory standing in for the device. */
#ifndef KVCHAT_ACT_MIRROR_H
#define KVCHAT_ACT_MIRROR_H

#include <stddef.h>
#include <stdint.h>

typedef struct am_device {
    void *ud;
    void *(*alloc)(void *ud, size_t bytes);   /* NULL when out of memory */
    void (*release)(void *ud, void *p);
    /* Ordered with the device's work; download may return before the copy is done, until wait. */
    void (*upload)(void *ud, void *dst, const void *src, size_t bytes);
    void (*download)(void *ud, void *dst, const void *src, size_t bytes);
    void (*wait)(void *ud);                    /* every copy and op issued so far has finished */
    /* Called with each bound buffer (pin: 1; 0 when it could be, -1 when not: it stays as it was)
     * and, if that succeeded, before it is unbound (pin: 0), e.g. to page-lock it. A buffer another
     * table has locked (a second backend's twin of the same host memory) is not locked again, so
     * that this table's unbind does not unlock it under the other. */
    int (*pin)(void *ud, void *host, size_t bytes, int pin);
} am_device;

typedef struct am_buf {
    char *host, *dev;
    size_t bytes;
    size_t dlo, dhi;   /* [dlo, dhi): newer on the device (empty when dlo >= dhi) */
    size_t hlo, hhi;   /* [hlo, hhi): newer on the host */
    int up_pending;    /* an upload from the host copy may still be in flight (until the next wait) */
    size_t flo, fhi;   /* [flo, fhi): fetched, a download issued whose bytes are the host's after the
                          next wait (empty: none, or cancelled by an op writing the twin) */
    int down_pending;  /* a fetch's download into the host copy may still be in flight */
    size_t clo, chi;   /* [clo, chi): inside [dlo, dhi) but current on the host too (a fetch that
                          landed in its middle, which [dlo, dhi) cannot leave out) */
    int pinned;        /* the host copy was page-locked at bind by this table (am_bind, am_bind_blank with
                          pin, where the device can) */
} am_buf;

typedef struct am_table {
    am_device dev;
    am_buf *b;
    int n, cap;
    uint64_t bytes;                  /* device bytes of the twins */
    uint64_t up_bytes, down_bytes;   /* bytes copied so far each way (for tests and figures) */
    uint64_t waits;                  /* host reads and writes that waited for the device */
    /* Changes of any twin's device bytes so far: ops' writes (am_dev_out), uploads of host-newer
     * bytes, binds and unbinds. A backend that derives something from a twin's device bytes (the
     * CUDA backend's 8-bit codes of a product's input) keeps it while this count stays the same. */
    uint64_t dev_changes;
} am_table;

/* One range the host reads. */
typedef struct am_range {
    const void *p;
    size_t bytes;
} am_range;

void am_init(am_table *t, const am_device *dev);
void am_free(am_table *t);
/* Give host[0, bytes) a device twin; its host content is what counts until an op writes the twin.
 * 0, or -1 when the device (or the host) is out of memory. Binding a bound buffer again is an error. */
int am_bind(am_table *t, void *host, size_t bytes);
/* As am_bind, for a buffer whose bytes mean nothing until an op writes them (rows that only ops
 * compute): neither copy counts as newer, so nothing goes up at first use (nor at an op's first
 * write of part of it, which would otherwise send the rest). The host copy is page-locked with pin
 * (the host reads large parts of it: the forward pass's activations); without, its copies go
 * through the driver's bounce buffer (the host reads a little of it now and then: CHESS's rows). */
int am_bind_blank(am_table *t, void *host, size_t bytes, int pin);
/* Forget the twin (the host copy is NOT brought up to date: the owner is freeing the buffer). */
void am_unbind(am_table *t, void *host);
/* 1 when [p, p + bytes) lies in a bound buffer this table page-locked (am_device.pin succeeded at
 * bind), 0 otherwise (unbound, blank without pin, or locked by no one or by another table). */
int am_pinned(const am_table *t, const void *p, size_t bytes);
/* 1 if [p, p + bytes) lies in a bound buffer. A range that straddles a buffer's end is a bug in the
 * caller and aborts with a message. */
int am_bound(const am_table *t, const void *p, size_t bytes);
/* The device address of [p, p + bytes) for an op that reads it (uploading what the host changed), or
 * NULL when the range is not bound. */
const void *am_dev_in(am_table *t, const void *p, size_t bytes);
/* The device address of [p, p + bytes) for an op that writes all of it (and may read it: the range
 * is brought up to date on the device first), or NULL when it is not bound. */
void *am_dev_out(am_table *t, void *p, size_t bytes);
/* The host is about to read these ranges: their bytes newer on the device are copied back, with one
 * wait for all of them. Unbound ranges are left alone. */
void am_host_read(am_table *t, const am_range *r, int n);
/* The host will read these ranges later: what of them is newer on the device is copied back now,
 * without waiting, and counts as current on the host once the device has been waited for (by an
 * am_host_read, or by the backend, which says so with am_waited). An op writing the buffer before
 * then cancels the fetch (its bytes are read again when asked for). At most one fetch a buffer is
 * in flight; a range of a buffer with one is left for am_host_read. */
void am_host_prefetch(am_table *t, const am_range *r, int n);
/* The backend waited for everything issued so far (its own wait, not the table's). */
void am_waited(am_table *t);
/* The host is about to write every byte of [p, p + bytes). It reads none of them unless it announced
 * that read first (am_host_read): bytes the write covers are not brought back. */
void am_host_write(am_table *t, void *p, size_t bytes);

#endif
