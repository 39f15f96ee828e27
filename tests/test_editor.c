/* test_editor.c - the input line's pieces that need no terminal: typed bytes decoded into
 * characters (an invalid byte never swallows the next character), and the input history kept in
 * its file between launches (bounded, escaped when read back, written whole, never through a link). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ui/editor.h"

/* Every character that bytes decode into. */
static int decode(const char *bytes, size_t n, unsigned *out)
{
    ed_utf8 d;
    memset(&d, 0, sizeof d);
    int k = 0;
    for (size_t i = 0; i < n; i++) k += ed_utf8_feed(&d, (unsigned char)bytes[i], out + k);
    return k;
}

Test(editor, an_invalid_byte_becomes_one_replacement_and_the_next_character_stays)
{
    unsigned c[16];
    int n = decode("a\xff" "b", 3, c);
    cr_assert_eq(n, 3);
    cr_expect(c[0] == 'a' && c[1] == 0xFFFD && c[2] == 'b');
    /* a sequence cut short: the byte that cannot continue it starts afresh */
    n = decode("\xc3" "x\xe2\x82" "y", 5, c);
    cr_assert_eq(n, 4);
    cr_expect(c[0] == 0xFFFD && c[1] == 'x' && c[2] == 0xFFFD && c[3] == 'y');
    /* valid characters of every length, and an overlong form refused */
    n = decode("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xc0\xaf", 11, c);
    cr_assert_eq(n, 5);
    cr_expect(c[0] == 0xE9 && c[1] == 0x20AC && c[2] == 0x1F600 && c[3] == 0xFFFD && c[4] == 0xFFFD);
}

static char dir[] = "/tmp/kvchat-edhist-XXXXXX";

static void make_dir(void) { cr_assert(mkdtemp(dir)); }
static void remove_dir(void)
{
    char cmd[100];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect(system(cmd) == 0);
}

Test(editor, history_survives_a_launch_with_newlines_and_backslashes, .init = make_dir, .fini = remove_dir)
{
    char path[200], err[600];
    snprintf(path, sizeof path, "%s/state/kvchat/history", dir);
    editor *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    cr_assert(a && b);
    ed_history_add(a, "first question");
    ed_history_add(a, "two\nlines \\n and a backslash \\");
    cr_assert_eq(ed_history_save(a, path, err, sizeof err), 0, "%s", err);
    ed_history_add(b, "typed before the file was read");
    cr_assert_eq(ed_history_load(b, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(b->n_hist, 3);
    cr_expect_str_eq(b->hist[0], "first question");
    cr_expect_str_eq(b->hist[1], "two\nlines \\n and a backslash \\");
    cr_expect_str_eq(b->hist[2], "typed before the file was read");
    cr_expect_eq(b->hist_pos, 3);
    ed_free(a);
    ed_free(b);
    free(a);
    free(b);
}

Test(editor, history_is_bounded_escaped_and_never_read_through_a_link, .init = make_dir, .fini = remove_dir)
{
    char path[200], link[200], err[600];
    snprintf(path, sizeof path, "%s/history", dir);
    editor *e = calloc(1, sizeof *e);
    cr_assert(e);
    for (int i = 0; i < ED_HISTORY_MAX + 50; i++) {
        char q[32];
        snprintf(q, sizeof q, "question %d", i);
        ed_history_add(e, q);
    }
    cr_expect_eq(e->n_hist, ED_HISTORY_MAX);
    cr_expect_str_eq(e->hist[0], "question 50");
    cr_assert_eq(ed_history_save(e, path, err, sizeof err), 0, "%s", err);
    ed_free(e);
    /* a control character written by someone else comes back visible, not raw */
    FILE *f = fopen(path, "a");
    cr_assert(f);
    fputs("clear \x1b[2J screen\n", f);
    fclose(f);
    cr_assert_eq(ed_history_load(e, path, err, sizeof err), 0, "%s", err);
    cr_expect_eq(e->n_hist, ED_HISTORY_MAX);
    cr_expect_str_eq(e->hist[e->n_hist - 1], "clear \\x1b[2J screen");
    cr_expect_str_eq(e->hist[0], "question 51");
    ed_free(e);
    /* a link at the history's place: refused unread, and a save replaces the link, not its target */
    snprintf(link, sizeof link, "%s/link", dir);
    cr_assert_eq(symlink(path, link), 0);
    cr_expect_eq(ed_history_load(e, link, err, sizeof err), -1);
    cr_expect(strstr(err, "link"), "%s", err);
    cr_expect_eq(e->n_hist, 0);
    ed_history_add(e, "new");
    cr_assert_eq(ed_history_save(e, link, err, sizeof err), 0, "%s", err);
    struct stat st;
    cr_assert_eq(lstat(link, &st), 0);
    cr_expect(S_ISREG(st.st_mode), "the link was followed");
    cr_assert_eq(stat(path, &st), 0);
    cr_expect(st.st_size > 1000, "the link's target was overwritten");
    ed_free(e);
    free(e);
}
