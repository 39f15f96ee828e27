/* pick.h - the CPU backend's pick (kernels/backend.h, be_pick): the best candidates of a row of
 * logits and its entropy, in the sampler's arithmetic (common/logit_pick.h). */
#ifndef KVCHAT_CPU_PICK_H
#define KVCHAT_CPU_PICK_H

#include "kernels/backend.h"

void cpu_pick_row(be_pick *p);

#endif
