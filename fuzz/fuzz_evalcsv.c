/* fuzz_evalcsv.c - libFuzzer harness for the eval CSV reader (app/eval/evalres.c): `kvchat eval`
 * resumes from a CSV and `eval --report` redraws from one, whatever wrote it. Each input is written to
 * one file in a private temporary folder and read back; what is accepted is summarised, and the
 * summary (which `--report` prints to a terminal) must come through text_escape unchanged (no control
 * byte but newlines, no invalid UTF-8). A refusal must be a C string. Built and run by `make fuzz`. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/eval/evalres.h"
#include "common/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[4096];

static void remove_file(void)
{
    unlink(path);
    *strrchr(path, '/') = 0;
    rmdir(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!*path) {
        const char *tmp = getenv("TMPDIR");
        char dir[sizeof path - 16];
        if (snprintf(dir, sizeof dir, "%s/kvchat-fuzz-csv-XXXXXX", tmp && *tmp ? tmp : "/tmp") >= (int)sizeof dir)
            snprintf(dir, sizeof dir, "/tmp/kvchat-fuzz-csv-XXXXXX");
        if (!mkdtemp(dir)) __builtin_trap();
        snprintf(path, sizeof path, "%s/samples.csv", dir);
        atexit(remove_file);
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) __builtin_trap();
    eval_recs rs = { 0 };
    char err[512];
    if (evalres_read(path, &rs, err, sizeof err) != 0) {
        if (!memchr(err, 0, sizeof err)) __builtin_trap();
        evalres_free(&rs);
        return 0;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) __builtin_trap();
    evalres_summary_md(m, &rs);
    fclose(m);
    /* escaping it again (newlines kept) must change nothing: no C0, DEL, C1 or invalid UTF-8 left */
    char *again = malloc(4 * len + 1);
    if (!again) __builtin_trap();
    text_escape(buf, again, 4 * len + 1, TEXT_KEEP_NEWLINE);
    if (strlen(buf) != len || strcmp(buf, again)) __builtin_trap();
    free(again);
    free(buf);
    evalres_free(&rs);
    return 0;
}
