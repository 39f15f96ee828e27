/* fuzz_evalcsv.c - libFuzzer harness for the eval CSV reader (app/eval/evalres.c): `kvchat eval`
 * resumes from a CSV and `eval --report` redraws from one, whatever wrote it. Each input is written to
 * one file in a private temporary folder and read back; what is accepted is summarised, and the
 * summary (which `--report` prints to a terminal) must hold no control byte but newlines. A refusal
 * must be a C string. Built and run by `make fuzz`. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/eval/evalres.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

static void remove_file(void)
{
    unlink(path);
    *strrchr(path, '/') = 0;
    rmdir(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!*path) {
        char dir[] = "/tmp/kvchat-fuzz-csv-XXXXXX";
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
    for (size_t i = 0; i < len; i++)
        if (buf[i] != '\n' && ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)) __builtin_trap();
    free(buf);
    evalres_free(&rs);
    return 0;
}
