/* cmd_info.c - `kvchat info`: what a model file is: architecture, hyperparameters, tokenizer, tensor
 * types with their counts and sizes (and every tensor with --tensors). */
#include <stdio.h>
#include <string.h>

#include "engine/chat.h"
#include "app/cli.h"
#include "app/commands.h"
#include "common/quant.h"

int cmd_info(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    int list = 0;
    const char *export_path = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_common(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--tensors")) {
            list = 1;
        } else if (!strcmp(argv[i], "--export-tokenizer")) {
            if (!(export_path = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs("usage: kvchat info [-m MODEL] [--tensors] [--tokenizer FILE.model] [--export-tokenizer OUT.model]\n",
                  stderr);
            return 0;
        } else {
            cli_err("info: unknown option %s", argv[i]);
            return 1;
        }
    }
    cli_runtime rt;
    if (cli_open(&rt, &o, 0) != 0) return 1;
    const model *m = rt.m;
    const model_hparams *hp = &m->hp;
    const tok_vocab *v = m->vocab;
    printf("file            %s (%.1f MiB, GGUF v%u)\n", m->path, (double)gguf_file_size(m->gguf) / 1048576.0,
           gguf_version(m->gguf));
    printf("name            %s\n", m->name[0] ? m->name : "(none)");
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
    printf("output          %s\n", m->output.data == m->tok_embd.data ? "tied to token_embd" : "separate matrix");
    printf("weights         %.1f MiB\n", (double)m->weight_bytes / 1048576.0);
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
            printf("  %-32.*s %-5s [", (int)t->name.len, t->name.ptr, quant_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ", %lld" : "%lld", (long long)t->ne[d]);
            printf("] %.2f MiB\n", (double)t->nbytes / 1048576.0);
        }
    }
    int rc = 0;
    if (export_path) {
        char err[512];
        if (tok_export_model(v, export_path, err, sizeof err) != 0) {
            cli_err("info: %s", err);
            rc = 1;
        } else {
            printf("tokenizer       written to %s\n", export_path);
        }
    }
    cli_close(&rt);
    return rc;
}
