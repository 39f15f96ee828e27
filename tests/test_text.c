/* test_text.c - text that reaches a terminal: control characters shown escaped (C0, DEL, C1, bytes
 * that are no UTF-8), newlines and tabs kept only when asked, display widths (wide CJK, combining
 * marks), and columns cut and padded to an exact width. */
#include <criterion/criterion.h>
#include <locale.h>
#include <string.h>

#include "common/text.h"

static void utf8_locale(void)
{
    if (!setlocale(LC_CTYPE, "C.UTF-8")) setlocale(LC_CTYPE, "");
}

Test(text, control_characters_are_shown_escaped, .init = utf8_locale)
{
    char out[256];
    text_escape("title\x1b[2J\x07 end", out, sizeof out, 0);
    cr_expect_str_eq(out, "title\\x1b[2J\\x07 end");
    text_escape("a\nb\tc\x7f", out, sizeof out, 0);
    cr_expect_str_eq(out, "a\\x0ab\\x09c\\x7f");
    text_escape("a\nb\tc", out, sizeof out, TEXT_KEEP_NEWLINE | TEXT_KEEP_TAB);
    cr_expect_str_eq(out, "a\nb\tc");
    text_escape("csi \xc2\x9b" "31m", out, sizeof out, 0);   /* U+009B, the 8-bit CSI */
    cr_expect_str_eq(out, "csi \\x9b31m");
    text_escape("bad \xff\xfe byte", out, sizeof out, 0);
    cr_expect_str_eq(out, "bad \\xff\\xfe byte");
    text_escape("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", out, sizeof out, 0);   /* kept as is */
    cr_expect_str_eq(out, "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");
    for (size_t cap = 1; cap < 12; cap++) {   /* a small buffer cuts on a character boundary */
        char small[12];
        memset(small, 'x', sizeof small);
        text_escape("\x1b\x1b\xe6\x97\xa5", small, cap, 0);
        cr_expect(strlen(small) < cap, "cap %zu", cap);
        cr_expect(strlen(small) % 4 == 0 || strlen(small) == 11, "cap %zu: '%s' cut inside an escape", cap, small);
    }
}

Test(text, widths_count_display_columns, .init = utf8_locale)
{
    cr_expect_eq(text_width("abc"), 3);
    cr_expect_eq(text_width("\xe6\x97\xa5\xe6\x9c\xac"), 4, "two wide CJK characters");
    cr_expect_eq(text_width("e\xcc\x81"), 1, "a combining accent takes no column");
    cr_expect_eq(text_width("\x1b"), 4, "an escape is shown as \\x1b");
}

Test(text, fit_cuts_and_pads_to_an_exact_width, .init = utf8_locale)
{
    char out[128];
    text_fit("short", 8, out, sizeof out);
    cr_expect_str_eq(out, "short   ");
    text_fit("a title that is far too long", 10, out, sizeof out);
    cr_expect_str_eq(out, "a title...");
    text_fit("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe9\xa1\x8c", 7, out, sizeof out);
    cr_expect_eq(text_width(out), 7, "'%s' is %d columns", out, text_width(out));
    text_fit("x\x1b[2Jy", 12, out, sizeof out);
    cr_expect_str_eq(out, "x\\x1b[2Jy   ");
}
