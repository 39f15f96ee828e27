/* step_graphs.h - a device backend's decode work recorded as graphs and replayed (the CUDA
 * backend's KVCHAT_CUDA_GRAPH=on, kernels/cuda/backend_cuda.cu).
 *
 * Between two waits, a decode step's launches and copies are recorded (stream capture) instead of
 * issued one by one; at the next wait (or after `split` recorded calls, so the device starts on the
 * first part while the host records the next) the recording becomes a segment that runs as one
 * launch. Each segment is looked up by its signature, the sequence of call sites that recorded it
 * (every checked call names its site with a string constant, whose address stands for the site;
 * identical names may share one) and their count: a step like the one before it finds the
 * executable graph the last one left and updates it in place (new kernel parameters, grid sizes and
 * copy sizes), which costs far less than building one; a new shape builds one into the least
 * recently used of SG_CACHE slots (a step split into segments has a shape for each). A build the
 * device refuses (out of memory) is tried once more after the other kept graphs are released. A
 * table that keeps building (more than half of a window of SG_SETTLE segments) stops recording: its
 * steps change shape too often for graphs to pay.
 *
 * The device is reached through function pointers, so this bookkeeping is plain C, tested on the
 * host (tests/test_step_graphs.c) with a recorder standing in for the device. */
#ifndef KVCHAT_STEP_GRAPHS_H
#define KVCHAT_STEP_GRAPHS_H

#include <stdint.h>

#define SG_CACHE 64
#define SG_SETTLE 256   /* the window of segments over which a table that keeps building gives up */

typedef struct sg_device {
    void *ud;
    int (*begin)(void *ud);                            /* start recording: 0, or -1 (nothing recorded) */
    int (*end)(void *ud, void **graph);                /* stop: the recorded graph, or -1 (the recording is lost) */
    int (*update)(void *ud, void *exec, void *graph);  /* exec now runs graph's work: 0, or -1 (shapes differ) */
    void *(*instantiate)(void *ud, void *graph);       /* an executable graph, or NULL */
    int (*launch)(void *ud, void *exec);               /* 0, or -1 */
    void (*destroy_graph)(void *ud, void *graph);
    void (*destroy_exec)(void *ud, void *exec);
} sg_device;

typedef struct sg_entry {
    uint64_t sig;
    uint32_t n_calls;
    void *exec;        /* NULL: the slot is empty */
    uint64_t last_use;
} sg_entry;

typedef struct sg_table {
    sg_device dev;
    int on;              /* recording in use (turned off for good by a device failure or giving up) */
    int split;           /* recorded calls after which sg_split says to end the segment (0: never) */
    int recording;
    uint64_t sig;        /* the segment being recorded: its signature so far */
    uint32_t n_calls;    /* and its calls */
    sg_entry ent[SG_CACHE];
    uint64_t clock;
    /* what happened so far (for tests and figures) */
    uint64_t segments;        /* segments launched */
    uint64_t calls;           /* calls they recorded */
    uint64_t updates;         /* segments run by updating a kept graph */
    uint64_t builds;          /* segments that built a graph (new shape, or an update refused) */
    uint64_t refused;         /* updates the device refused (each then built) */
    uint64_t failures;        /* device failures (recording, building or launching), each turning graphs off */
    int gave_up;              /* turned off for building too often */
    uint32_t win_segments, win_builds;   /* the current window's */
} sg_table;

/* on: record at all (0: every call is a no-op and the backend issues as before); split as above. */
void sg_init(sg_table *t, const sg_device *dev, int on, int split);
/* Releases every kept graph; a recording still open is ended and dropped (its work never runs). */
void sg_free(sg_table *t);
/* Start recording if on and not recording: 0, or -1 when the device refused (graphs are then off;
 * nothing was recorded, the caller issues as before). */
int sg_begin(sg_table *t);
/* A call recorded at the site `what` (a string constant). No-op when not recording. */
void sg_note(sg_table *t, const char *what);
/* 1 when the segment being recorded has reached `split` calls (the caller ends it with sg_flush
 * and may begin another). */
int sg_split(const sg_table *t);
/* End the recording and run it: 0 (also when nothing was being recorded, or it recorded nothing),
 * or -1 when the device failed: the recorded work did not run and never will (graphs are then off;
 * the caller treats the device as lost). */
int sg_flush(sg_table *t);

#endif
