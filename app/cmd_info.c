/* cmd_info.c - `kvchat info`: what a model file is: architecture, hyperparameters, tokenizer, tensor
 * types with their counts and sizes (and every tensor with --tensors), and the device that would run
 * it. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "engine/chat.h"
#include "engine/prompt.h"
#include "app/cli.h"
#include "common/text.h"
#include "app/commands.h"
#include "common/quant.h"
#include "kernels/backend.h"

typedef struct info_opts {
    const char *model_path, *tokenizer_path, *export_path, *isa;
    int list, no_simd, device, n_threads;
} info_opts;

#define I(field) offsetof(info_opts, field)
static const opt_def info_defs[] = {
    { "--model", "-m", OPT_STR, I(model_path), 0, 0, NULL, 0, "MODEL", "the GGUF file (default: the default model)", NULL },
    { "--tokenizer", NULL, OPT_STR, I(tokenizer_path), 0, 0, NULL, 0, "FILE.model",
      "a SentencePiece model replacing the file's vocabulary", NULL },
    { "--tensors", NULL, OPT_FLAG, I(list), 0, 0, NULL, 0, NULL, "list every tensor", NULL },
    { "--isa", NULL, OPT_STR, I(isa), 0, 0, NULL, 0, "NAME", "the kernels to report: scalar, avx2, avxvnni or avx512", NULL },
    { "--no-simd", NULL, OPT_FLAG, I(no_simd), 0, 0, NULL, 0, NULL, "the portable kernels", NULL },
    { "--device", NULL, OPT_CHOICE, I(device), 0, 0, "auto|cpu|cuda", 0, NULL,
      "the device to report: auto (the default) is the GPU when one is present", NULL },
    { "--threads", "-t", OPT_INT, I(n_threads), 1, 256, NULL, 0, "N", "CPU threads to report (default: all cores)", NULL },
    { "--export-tokenizer", NULL, OPT_STR, I(export_path), 0, 0, NULL, 0, "OUT.model",
      "write the vocabulary as a SentencePiece model file", NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef I

/* What the commands would run the model on under --device (auto: the GPU when one is present and
 * can start; engine/run.c also leaves for the CPU a GPU too small for the weights). 0, or 1 after
 * a message when --device cuda cannot run. */
static int print_device(const info_opts *io, uint64_t gpu_weights)
{
    be_gpu g;
    char why[300] = "";
    if (io->device != CLI_DEV_CPU && be_cuda_gpu(&g, why, sizeof why) == 0) {
        double gib = 1024.0 * 1024.0 * 1024.0;
        printf("device          %s: CUDA device 0 of %d, compute %d.%d, %.1f GiB (%.1f GiB free)\n", g.name, g.count,
               g.cc_major, g.cc_minor, (double)g.total / gib, (double)g.free / gib);
        if (gpu_weights > g.free)
            printf("                the weights need more than is free: %s\n",
                   io->device == CLI_DEV_AUTO ? "the model runs on the CPU" : "--device cuda fails");
        return 0;
    }
    if (io->device == CLI_DEV_CUDA) {
        cli_err("info: --device cuda: %s", why);
        return 1;
    }
    int n = be_cpu_threads(io->n_threads);
    printf("device          CPU, %s kernels, %d thread%s%s%s%s\n", be_cpu_kernels(), n, n == 1 ? "" : "s",
           why[0] ? " (" : "", why, why[0] ? ")" : "");
    return 0;
}

int cmd_info(int argc, char **argv)
{
    info_opts io = { 0 };
    opt_group g[] = { { info_defs, &io, NULL } };
    int r = cli_parse(argc, argv,
                      "kvchat info [-m MODEL] [--tensors] [--device auto|cpu|cuda] [--tokenizer FILE.model] "
                      "[--export-tokenizer OUT.model]",
                      "What a model file is: architecture, hyperparameters, tokenizer, tensor types, and the device "
                      "that would run it.", g, 1, NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
    if (cli_set_kernels(io.isa, io.no_simd) != 0) return 1;
    cli_opts o;
    cli_opts_init(&o);
    o.model_path = io.model_path;
    char pathbuf[1024], err[600];
    const char *path = cli_model_path(&o, pathbuf, sizeof pathbuf);
    if (!path) return 1;
    model *m;
    model_load_opts lo = { io.tokenizer_path };
    if (model_load(&m, path, &lo, err, sizeof err) != 0) {
        cli_err("%s", err);
        return 1;
    }
    int list = io.list;
    const char *export_path = io.export_path;
    const model_hparams *hp = &m->hp;
    const tok_vocab *v = m->vocab;
    /* names and strings from the file are shown escaped: a model file is untrusted input */
    char mpath[3100], name[800];
    text_escape(m->path, mpath, sizeof mpath, 0);
    text_escape(m->name[0] ? m->name : "(none)", name, sizeof name, 0);
    printf("file            %s (%.1f MiB, GGUF v%u)\n", mpath, (double)gguf_file_size(m->gguf) / 1048576.0,
           gguf_version(m->gguf));
    printf("name            %s\n", name);
    printf("architecture    %s\n", m->arch_name);
    printf("layers          %d\n", hp->n_layer);
    printf("embedding       %d\n", hp->n_embd);
    printf("heads           %d query, %d key/value (head size %d)\n", hp->n_head, hp->n_head_kv, hp->head_dim);
    printf("feed-forward    %d (%s)\n", hp->n_ff, hp->gelu ? "GeGLU" : "SwiGLU");
    printf("context         %d (training)\n", hp->n_ctx_train);
    printf("rope            base %g, %s pairs, scale %g\n", hp->rope_base, hp->rope_neox ? "half-split" : "adjacent",
           1.0 / hp->rope_freq_scale);
    if (hp->n_swa) {
        int n_swa_layers = 0;
        for (int il = 0; il < hp->n_layer; il++) n_swa_layers += m->layers[il].is_swa;
        printf("sliding window  %d tokens on %d of %d layers (local rope base %g)\n", hp->n_swa, n_swa_layers,
               hp->n_layer, hp->rope_base_swa);
    }
    printf("rms eps         %g\n", hp->norm_eps);
    if (hp->final_softcap > 0) printf("final softcap   %g\n", hp->final_softcap);
    printf("vocabulary      %d (bos %d, eos %d, eot %d, add bos %s)\n", tok_n_vocab(v), tok_bos(v), tok_eos(v),
           tok_eot(v), tok_add_bos(v) ? "yes" : "no");
    gguf_str tmpl;
    printf("chat template   %s (%s)\n", chat_family_name(chat_family_for(m->gguf)),
           gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl) == 0 ? "from the file" : "none in the file: by architecture");
    /* what ask and the interface write a conversation in (README "The default model") */
    printf("prompt form     %s\n", prompt_has_template(m)
                                        ? "the chat template (the file has one)"
                                        : "plain, DOCUMENT / Question: Q / Answer: (no template in the file: a base model)");
    printf("output          %s\n", m->output.data == m->tok_embd.data ? "tied to token_embd" : "separate matrix");
    printf("weights         %.1f MiB\n", (double)m->weight_bytes / 1048576.0);
    /* what the CUDA backend holds of the products' weights (docs/gpu.md), in either build */
    uint64_t gpu = 0;
    {
        const be_weight *w[4096];
        int n = model_matmul_weights(m, w, 4096);
        char kept[160] = "", conv[160] = "";
        for (int i = 0; i < n && i < 4096; i++) {
            uint32_t t = w[i]->type;
            char *names = be_gpu_weight_type(t, w[i]->n_in) == t ? kept : conv;
            gpu += be_gpu_weight_bytes(t, w[i]->n_in, w[i]->n_out);
            if (!strstr(names, quant_type_name(t)))
                snprintf(names + strlen(names), 160 - strlen(names), "%s%s", names[0] ? ", " : "", quant_type_name(t));
        }
        printf("on a GPU        %.1f MiB of weights (%s%s%s%s%s)\n", (double)gpu / 1048576.0, kept,
               kept[0] ? " as stored" : "", kept[0] && conv[0] ? "; " : "", conv, conv[0] ? " converted to f16 at load" : "");
    }
    char kern[200];
    be_cpu_kernels_summary(kern, sizeof kern);
    printf("kernels         %s\n", kern);
    int rc = print_device(&io, gpu);
    /* Tensor types: count and bytes. */
    uint64_t cnt[GGML_TYPE_MAX_ID] = { 0 }, bytes[GGML_TYPE_MAX_ID] = { 0 };
    int64_t nt = gguf_n_tensors(m->gguf);
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        if (t->type < GGML_TYPE_MAX_ID) {
            cnt[t->type]++;
            bytes[t->type] += t->nbytes;
        }
    }
    printf("tensor types   ");
    for (int ty = 0; ty < GGML_TYPE_MAX_ID; ty++)
        if (cnt[ty]) printf(" %s x%llu (%.1f MiB)", quant_type_name((uint32_t)ty), (unsigned long long)cnt[ty],
                            (double)bytes[ty] / 1048576.0);
    putchar('\n');
    if (list) {
        for (int64_t i = 0; i < nt; i++) {
            const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
            char tn[600], tfit[700];
            snprintf(tn, sizeof tn, "%.*s", (int)t->name.len, t->name.ptr);
            text_fit(tn, 32, tfit, sizeof tfit);
            printf("  %s %-5s [", tfit, quant_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ", %lld" : "%lld", (long long)t->ne[d]);
            printf("] %.2f MiB\n", (double)t->nbytes / 1048576.0);
        }
    }
    if (export_path) {
        if (tok_export_model(v, export_path, err, sizeof err) != 0) {
            cli_err("info: %s", err);
            rc = 1;
        } else {
            char shown[1100];
            text_escape(export_path, shown, sizeof shown, 0);
            printf("tokenizer       written to %s\n", shown);
        }
    }
    model_free(m);
    return rc;
}
