/* test_files.c - common/files.c, the one way kvchat writes a file: a regular file or a link at the
 * destination is replaced (the link itself, never its target); a directory, FIFO or device there
 * is refused, also when it appears while the file is being written; a file that must be new is
 * never put over anything; appending never goes through a link or into a FIFO. Files go to a fresh
 * directory under /tmp. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/files.h"

static char dir[256];

static void mkdir_tmp(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvchat-files-XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp");
}

static void rm_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(files, .init = mkdir_tmp, .fini = rm_dir);

static int entries_in_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    cr_assert(p && fscanf(p, "%d", &n) == 1);
    pclose(p);
    return n;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static void expect_text(const char *path, const char *text)
{
    char buf[64] = "";
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    cr_assert(fgets(buf, sizeof buf, f) || !*text);
    fclose(f);
    cr_expect_str_eq(buf, text, "%s", path);
}

Test(files, a_fifo_or_directory_put_there_while_writing_is_not_replaced)
{
    char path[300], err[600];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    files_atomic fa;
    cr_assert_eq(files_atomic_open(&fa, path, err, sizeof err), 0, "%s", err);
    fputs("new", fa.f);
    cr_assert_eq(mkfifo(path, 0600), 0);   /* appears while the file is written */
    cr_assert_eq(files_atomic_commit(&fa, err, sizeof err), -1);
    cr_expect(strstr(err, path) && strstr(err, "is a FIFO"), "%s", err);
    struct stat st;
    cr_assert(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO is still there");
    cr_expect_eq(entries_in_dir(), 1, "the temporary file is removed");
    unlink(path);
    cr_assert_eq(files_atomic_open(&fa, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(mkdir(path, 0700), 0);
    cr_assert_eq(files_atomic_commit(&fa, err, sizeof err), -1);
    cr_expect(strstr(err, "is a directory"), "%s", err);
    cr_assert(lstat(path, &st) == 0 && S_ISDIR(st.st_mode));
    cr_expect_eq(entries_in_dir(), 1);
}

Test(files, what_is_not_a_file_or_link_is_refused_when_opening)
{
    char path[300], err[600];
    files_atomic fa;
    snprintf(path, sizeof path, "%s/fifo", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    cr_expect_eq(files_atomic_open(&fa, path, err, sizeof err), -1);
    cr_expect(strstr(err, "fifo is a FIFO, not a file kvchat replaces"), "%s", err);
    cr_expect_eq(files_atomic_open_new(&fa, path, err, sizeof err), -1, "a FIFO is refused, not 'already exists'");
    cr_expect(strstr(err, "is a FIFO"), "%s", err);
    files_atomic_abort(&fa);   /* nothing to remove: harmless */
    cr_expect_eq(files_atomic_open(&fa, "/dev/null", err, sizeof err), -1);
    cr_expect(strstr(err, "/dev/null is a character device"), "%s", err);
    cr_expect_eq(entries_in_dir(), 1);
}

Test(files, a_link_is_replaced_never_followed_and_a_new_file_replaces_nothing)
{
    char path[300], target[300], err[600];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    snprintf(target, sizeof target, "%s/target.txt", dir);
    put(target, "keep me");
    cr_assert_eq(symlink(target, path), 0);
    files_atomic fa;
    cr_assert_eq(files_atomic_open_new(&fa, path, err, sizeof err), -2, "a link is something there");
    cr_assert_eq(files_atomic_open(&fa, path, err, sizeof err), 0, "%s", err);
    fputs("new", fa.f);
    cr_assert_eq(files_atomic_commit(&fa, err, sizeof err), 0, "%s", err);
    struct stat st;
    cr_assert(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "the link itself is replaced");
    expect_text(path, "new");
    expect_text(target, "keep me");
    /* a new file whose name is taken while it is written: the other file is kept */
    char fresh[300];
    snprintf(fresh, sizeof fresh, "%s/fresh.txt", dir);
    cr_assert_eq(files_atomic_open_new(&fa, fresh, err, sizeof err), 0, "%s", err);
    fputs("mine", fa.f);
    put(fresh, "theirs");
    cr_assert_eq(files_atomic_commit(&fa, err, sizeof err), -2);
    cr_expect(strstr(err, "already exists"), "%s", err);
    expect_text(fresh, "theirs");
    cr_expect_eq(entries_in_dir(), 3);
}

Test(files, appending_never_goes_through_a_link_or_into_a_fifo)
{
    char path[300], link[300], fifo[300], err[600];
    int fresh = -1;
    snprintf(path, sizeof path, "%s/log.csv", dir);
    snprintf(link, sizeof link, "%s/link.csv", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.csv", dir);
    FILE *f = files_append(path, &fresh, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_expect_eq(fresh, 1);
    fputs("a\n", f);
    cr_assert_eq(files_close(f, path, err, sizeof err), 0, "%s", err);
    f = files_append(path, &fresh, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_expect_eq(fresh, 0);
    fputs("b\n", f);
    cr_assert_eq(files_close(f, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(symlink(path, link), 0);
    cr_expect_null(files_append(link, &fresh, err, sizeof err));
    cr_expect(strstr(err, "is a symbolic link"), "%s", err);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_expect_null(files_append(fifo, &fresh, err, sizeof err), "a FIFO is refused, never waited on");
    cr_expect(strstr(err, "is a FIFO"), "%s", err);
    cr_expect_null(files_append("/dev/full", &fresh, err, sizeof err));
    cr_expect(strstr(err, "is a character device"), "%s", err);
    char buf[16] = "";
    FILE *r = fopen(path, "r");
    cr_assert(r);
    size_t n = fread(buf, 1, sizeof buf - 1, r);
    buf[n] = 0;
    fclose(r);
    cr_expect_str_eq(buf, "a\nb\n");
}

Test(files, the_folders_above_a_path_are_made_and_a_file_in_the_way_is_an_error)
{
    mkdir_tmp();
    char path[512], mid[512];
    snprintf(path, sizeof path, "%s/a/b/c/history", dir);
    cr_assert_eq(files_make_parents(path), 0);
    snprintf(mid, sizeof mid, "%s/a/b/c", dir);
    struct stat st;
    cr_expect(stat(mid, &st) == 0 && S_ISDIR(st.st_mode), "%s was not made", mid);
    cr_expect(stat(path, &st) != 0, "the path itself is not made");
    cr_expect_eq(files_make_parents(path), 0, "folders already there are fine");
    snprintf(path, sizeof path, "%s/plain", dir);
    put(path, "x");
    snprintf(path, sizeof path, "%s/plain/d/history", dir);
    cr_expect_eq(files_make_parents(path), -1, "a file where a folder must be");
    rm_dir();
}
