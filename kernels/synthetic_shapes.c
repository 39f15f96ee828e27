/* synthetic_shapes.c - the model shapes `kvchat bench --synthetic` knows (kernels/synthetic.h);
 * plain C, so both builds can name them in their messages. */
#include "kernels/synthetic.h"

#include <string.h>

static const synth_shape shapes[] = {
    /* Llama 3 8B: 32 layers, 4096 dims, 32 query heads and 8 KV heads of 128, SwiGLU FFN 14336 */
    { "llama-8b", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0f },
};

const synth_shape *synth_shape_find(const char *name)
{
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (!strcmp(shapes[i].name, name)) return &shapes[i];
    return NULL;
}

const char *synth_shape_names(void) { return "llama-8b"; }

const char *synth_policy_name(int policy)
{
    switch (policy) {
    case SYNTH_FULL: return "full";
    case SYNTH_CHESS: return "chess:preset=aggressive";
    case SYNTH_QUEST: return "quest";
    case SYNTH_TAKE: return "take";
    }
    return "?";
}

const char *synth_gemm_name(int gemm)
{
    switch (gemm) {
    case SYNTH_GEMM_OWN: return "own";
    case SYNTH_GEMM_TC: return "tc";
    case SYNTH_GEMM_CUBLAS: return "cublas";
    }
    return "?";
}

int synth_policy_find(const char *name, size_t n)
{
    for (int k = SYNTH_FULL; k <= SYNTH_QUEST; k++) {
        const char *s = synth_policy_name(k);
        size_t bare = strcspn(s, ":");   /* a policy's name alone stands for the preset the model runs */
        if ((strlen(s) == n || bare == n) && !strncmp(name, s, n)) return k;
    }
    return -1;
}
