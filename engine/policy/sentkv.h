/* sentkv.h - the sentence splitter of SentKVCompress, exposed for tests (the policy itself is
 * registered as "sentkv" in policy.c). */
#ifndef KVCHAT_SENTKV_H
#define KVCHAT_SENTKV_H

#include <stdint.h>

/* Cut tok[start..n) into segments: each ends after the boundary token within +-delta of the ideal
 * end (start + len) with the best 0.7 * weight + 0.3 * (1 - |ideal - end| / delta), or at the ideal end
 * when the window holds no boundary. Without flush, stops where the window is not complete yet.
 * Writes the exclusive end of each segment to ends (at most max_ends) and returns how many. */
int64_t sentkv_split(const float *weight, const int32_t *tok, int64_t n, int64_t start, int len, int delta, int flush,
                     int64_t *ends, int64_t max_ends);

#endif
