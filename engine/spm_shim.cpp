// spm_shim.cpp - extern "C" wrapper over libsentencepiece (see spm_shim.h). Kept deliberately thin:
// every tokenization decision lives in tokenizer.c; this file only crosses the language boundary and
// turns C++ exceptions and Status values into error strings.
#include "engine/spm_shim.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

struct spm_proc {
    sentencepiece::SentencePieceProcessor sp;
};

static void set_err(char *err, size_t errlen, const std::string &msg)
{
    std::snprintf(err, errlen, "%s", msg.c_str());
}

extern "C" spm_proc *spm_load_proto(const void *data, size_t len, char *err, size_t errlen)
{
    try {
        spm_proc *p = new spm_proc();
        auto st = p->sp.LoadFromSerializedProto(std::string(static_cast<const char *>(data), len));
        if (!st.ok()) {
            set_err(err, errlen, "SentencePiece rejected the vocabulary: " + st.ToString());
            delete p;
            return nullptr;
        }
        return p;
    } catch (const std::exception &e) {
        set_err(err, errlen, std::string("SentencePiece: ") + e.what());
        return nullptr;
    }
}

extern "C" void spm_free(spm_proc *p) { delete p; }

extern "C" int spm_piece_size(const spm_proc *p) { return p->sp.GetPieceSize(); }

extern "C" int spm_encode(const spm_proc *p, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap,
                          char *err, size_t errlen)
{
    try {
        std::vector<int> out;
        auto st = p->sp.Encode(std::string(text, len), &out);
        if (!st.ok()) {
            set_err(err, errlen, "SentencePiece encode failed: " + st.ToString());
            return -1;
        }
        if (*n + out.size() > *cap) {
            size_t nc = (*n + out.size()) * 2 + 16;
            int32_t *ni = static_cast<int32_t *>(std::realloc(*ids, nc * sizeof(int32_t)));
            if (!ni) {
                set_err(err, errlen, "out of memory");
                return -1;
            }
            *ids = ni;
            *cap = nc;
        }
        for (int id : out) (*ids)[(*n)++] = id;
        return 0;
    } catch (const std::exception &e) {
        set_err(err, errlen, std::string("SentencePiece: ") + e.what());
        return -1;
    }
}
