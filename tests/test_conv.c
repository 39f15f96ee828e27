/* test_conv.c - the conversation pane's text: what is kept is what is drawn (control characters and
 * stray bytes escaped as everywhere kvchat prints, tabs as spaces), so the wrapping counts the
 * cells the terminal uses; a character split across two streamed pieces is joined, not escaped. */
#include <criterion/criterion.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
#include "ui/conv.h"

static void utf8_locale(void)
{
    if (!setlocale(LC_CTYPE, "C.UTF-8")) setlocale(LC_CTYPE, "");
}

/* A row as the terminal draws it: no control byte (which it would draw as ^X or act on), and so as
 * many cells as its characters' display widths (text_width, wcwidth). */
static int widest, raw_controls;
static void measure(void *ud, const char *p, int bytes)
{
    char row[256];
    snprintf(row, sizeof row, "%.*s", bytes, p);
    for (int i = 0; i < bytes; i++) raw_controls += (unsigned char)p[i] < 0x20 || p[i] == 0x7f;
    int w = text_width(row);
    if (w > widest) widest = w;
}

Test(conv, control_characters_are_kept_escaped_and_wrap_at_the_width_drawn, .init = utf8_locale)
{
    conv c;
    memset(&c, 0, sizeof c);
    conv_add(&c, E_ANSWER, "ab\x01" "cd\tef\x1e" "g\x7f\xff h\n\x1b[2J");
    cr_assert_eq(c.n, 1);
    cr_expect_str_eq(c.e[0].text, "ab\\x01cd    ef\\x1eg\\x7f\\xff h\n\\x1b[2J");
    /* every row fits: no cell the terminal draws is left uncounted */
    const char *rowsy = "\x01\x02\x03\x04\x05\x06\x07\x08 \x0b\x0c\x0e\x0f\x10\x11 \x12\x13\x14\x15";
    conv_add(&c, E_USER, rowsy);
    for (int width = 4; width <= 30; width++) {
        widest = raw_controls = 0;
        conv_wrap(c.e[1].text, width, measure, NULL);
        cr_expect_eq(raw_controls, 0, "a control byte reaches the terminal");
        cr_expect_leq(widest, width, "a row of %d cells at width %d", widest, width);
    }
    conv_free(&c);
}

Test(conv, a_character_split_across_two_pieces_is_joined, .init = utf8_locale)
{
    conv c;
    memset(&c, 0, sizeof c);
    conv_append(&c, "the \xe6\x97");        /* 日 in two tokens */
    conv_append(&c, "\xa5 day\xe2");
    conv_append_mark(&c, " [uncertain] ");  /* an event between: the held byte cannot be finished */
    conv_append(&c, "\x80\x94 end");         /* continuation bytes with no start */
    cr_assert_eq(c.n, 1);
    cr_expect_str_eq(c.e[0].text, "the \xe6\x97\xa5 day\\xe2\x1e [uncertain] \x1f\\x80\\x94 end");
    conv_free(&c);
}
