/* backend.c - what the engine asks of kernels/ besides the op table: a backend for the device
 * chosen, the weights prepared on it with a note of what a device converts, and the CPU kernels'
 * instruction set, so that nothing above kernels/ names a backend or includes a kernel header. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "common/quant.h"
#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/op_profile.h"

/* KVCHAT_PROFILE=1|sync puts the op profiler in front (kernels/op_profile.h); its report goes to
 * standard error when the backend is destroyed. */
void be_discard(be_backend *b)
{
    if (!b) return;
    op_profile_discard(b);
    be_free(b);
}

void be_host_run(be_backend *b, be_task_fn fn, void *ctx, int64_t n)
{
    tp_pool *pool = b && b->ops->host_pool ? b->ops->host_pool(b) : NULL;
    if (pool && n > 1) {
        tp_run(pool, fn, ctx, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
}

be_backend *be_create(int device, int n_threads, char *err, size_t errlen)
{
    int prof = op_profile_mode_from_env();
    if (prof < 0) {
        snprintf(err, errlen, "KVCHAT_PROFILE must be 1 (host time in each op), sync (each op waited for) or 0 (off)");
        return NULL;
    }
    be_backend *b = device == BE_DEVICE_CUDA ? be_cuda_create(n_threads, err, errlen) : be_cpu_create(n_threads, err, errlen);
    if (!b || !prof) return b;
    be_backend *pb = op_profile_wrap(b, prof, stderr);
    if (!pb) {
        b->ops->destroy(b);
        snprintf(err, errlen, "out of memory starting the op profiler");
    }
    return pb;
}

/* A device backend copies every weight it will multiply now (prepare), so a model too large for
 * the device is a clear error before anything runs; the GPU keeps most types as stored and converts
 * the others to f16 (docs/gpu.md): the note names them. The CPU reads the mapping in place. */
int be_prepare_weights(be_backend *b, const be_weight *const *w, int n, char *note, size_t note_cap, char *err,
                       size_t errlen)
{
    if (note_cap) note[0] = 0;
    if (!b->ops->prepare) return 0;
    if (b->ops->prepare(b, w, n, err, errlen)) return -1;
    char conv[160] = "";
    for (int i = 0; i < n; i++) {
        const char *name = quant_type_name(w[i]->type);
        if (be_gpu_weight_type(w[i]->type, w[i]->n_in) != w[i]->type && !strstr(conv, name))
            snprintf(conv + strlen(conv), sizeof conv - strlen(conv), "%s%s", conv[0] ? ", " : "", name);
    }
    if (conv[0] && note_cap)
        snprintf(note, note_cap, "%s weights are converted to f16 on the GPU (2 bytes a value)", conv);
    return 0;
}

void be_warming_up(be_backend *b, int on)
{
    op_profile_set_warming_up(b, on);
    if (!on) be_cuda_warmed_up(op_profile_inner(b));
}

int be_cpu_set_kernels(const char *isa, int no_simd, char *err, size_t errlen)
{
    const char *env = vd_isa_env_error();
    if (env) {
        snprintf(err, errlen, "%s", env);
        return -1;
    }
    if (isa && vd_set_isa_name(isa, err, errlen)) return -1;
    if (no_simd) vd_force_scalar(1);
    return 0;
}

const char *be_cpu_kernels(void) { return vd_isa_name(vd_isa_active()); }

void be_cpu_kernels_summary(char *buf, size_t cap) { vd_isa_summary(buf, cap); }

int be_cpu_threads(int n_threads) { return tp_threads_for(n_threads); }

void be_cpu_model(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown cpu");
    char e[300];
    FILE *f = files_open_read("/proc/cpuinfo", (uint64_t)1 << 20, "a CPU description", e, sizeof e);
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, cap, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

void be_describe(be_backend *b, char *buf, size_t cap)
{
    be_backend *in = op_profile_inner(b);
    if (in->ops->memory) {   /* device memory: a device backend, and CUDA is the only one */
        be_gpu g;
        char why[200];
        char set[200];
        be_cuda_settings(in, set, sizeof set);
        snprintf(buf, cap, "%s%s%s%s", be_cuda_gpu(&g, why, sizeof why) ? "a CUDA GPU" : g.name, set[0] ? " (" : "", set,
                 set[0] ? ")" : "");
        return;
    }
    snprintf(buf, cap, "CPU (%d thread%s)", b->n_threads, b->n_threads == 1 ? "" : "s");
}
