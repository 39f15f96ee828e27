/* keymap.c - remappable keys of the interface (see keymap.h). Control keys are kept as their
 * character codes (1..26), everything else as ncurses key codes (KEY_F(n), KEY_PPAGE, ...), which
 * never overlap. */
#include "ui/keymap.h"

#include <ncurses.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name, *help;
} actions[KA_COUNT] = {
    [KA_HELP] = { "help", "this help" },
    [KA_SEEN] = { "seen", "what the model sees: held, evicted and attended text" },
    [KA_SESSIONS] = { "sessions", "saved sessions: search, resume, rename, export, delete" },
    [KA_POLICY] = { "policy", "pick the prefill and decode-time policy" },
    [KA_SETTINGS] = { "settings", "sampling, answer length, budget (live; s saves)" },
    [KA_OPEN] = { "open", "pick a document to open" },
    [KA_REGEN] = { "regen", "another answer to the last question (a branch)" },
    [KA_SCROLL_UP] = { "scroll_up", "scroll the conversation back" },
    [KA_SCROLL_DOWN] = { "scroll_down", "scroll the conversation forward" },
    [KA_TOP] = { "top", "the conversation's start" },
    [KA_BOTTOM] = { "bottom", "the conversation's end (the newest)" },
    [KA_FIND] = { "find", "search the conversation (again: an older match)" },
    [KA_MOUSE] = { "mouse", "mouse capture on/off (off: the terminal selects text)" },
    [KA_QUIT] = { "quit", "leave kvchat" },
};

void keymap_default(keymap *km)
{
    km->key[KA_HELP] = KEY_F(1);
    km->key[KA_SEEN] = KEY_F(2);
    km->key[KA_SESSIONS] = KEY_F(3);
    km->key[KA_POLICY] = KEY_F(4);
    km->key[KA_SETTINGS] = KEY_F(5);
    km->key[KA_OPEN] = KEY_F(6);
    km->key[KA_REGEN] = KEY_F(7);
    km->key[KA_SCROLL_UP] = KEY_PPAGE;
    km->key[KA_SCROLL_DOWN] = KEY_NPAGE;
    km->key[KA_TOP] = KEY_HOME;
    km->key[KA_BOTTOM] = KEY_END;
    km->key[KA_FIND] = 6;   /* ^F */
    km->key[KA_MOUSE] = KEY_F(8);
    km->key[KA_QUIT] = KEY_F(10);
}

int keymap_action(const char *name)
{
    for (int i = 0; i < KA_COUNT; i++)
        if (!strcmp(actions[i].name, name)) return i;
    return -1;
}

const char *keymap_action_name(int action) { return action >= 0 && action < KA_COUNT ? actions[action].name : "?"; }
const char *keymap_action_help(int action) { return action >= 0 && action < KA_COUNT ? actions[action].help : "?"; }

/* The code of a key name, or 0 when the name is not a key kvchat can bind. */
static int parse_key(const char *s)
{
    if ((s[0] == 'F' || s[0] == 'f') && s[1]) {
        char *end;
        long n = strtol(s + 1, &end, 10);
        if (!*end && n >= 1 && n <= 12) return KEY_F(n);
        return 0;
    }
    if (s[0] == '^' && s[1] && !s[2]) {
        int c = s[1] >= 'a' && s[1] <= 'z' ? s[1] - 'a' + 'A' : s[1];
        if (c < 'A' || c > 'Z') return 0;
        return c - 'A' + 1;
    }
    if (!strcasecmp(s, "PgUp")) return KEY_PPAGE;
    if (!strcasecmp(s, "PgDn")) return KEY_NPAGE;
    if (!strcasecmp(s, "Ins")) return KEY_IC;
    if (!strcasecmp(s, "Home")) return KEY_HOME;
    if (!strcasecmp(s, "End")) return KEY_END;
    return 0;
}

int keymap_bind(keymap *km, int action, const char *key_name, char *err, size_t errlen)
{
    int code = parse_key(key_name);
    if (!code) {
        snprintf(err, errlen, "'%s' is not a key kvchat can bind (F1..F12, ^A..^Z, PgUp, PgDn, Home, End, Ins)",
                 key_name);
        return -1;
    }
    /* ^C stops, ^D and ^Q leave, ^H is Backspace, ^I Tab, ^J a newline, ^M Enter, and the readline
     * keys ^A ^E ^K ^R ^U ^W ^Y edit the input */
    static const char reserved[] = { 1, 3, 4, 5, 8, 9, 10, 11, 13, 17, 18, 21, 23, 25 };
    if (code < 32 && memchr(reserved, code, sizeof reserved)) {
        snprintf(err, errlen, "%s is reserved (Ctrl-C stops, Ctrl-D and Ctrl-Q leave, the others edit the input)",
                 key_name);
        return -1;
    }
    km->key[action] = code;
    return 0;
}

int keymap_check(const keymap *km, char *err, size_t errlen)
{
    for (int i = 0; i < KA_COUNT; i++)
        for (int j = i + 1; j < KA_COUNT; j++)
            if (km->key[i] == km->key[j]) {
                char k[16];
                keymap_key_name(km->key[i], k, sizeof k);
                snprintf(err, errlen, "%s is bound to both %s and %s", k, actions[i].name, actions[j].name);
                return -1;
            }
    return 0;
}

int keymap_lookup(const keymap *km, int code, int is_key)
{
    if (!is_key && (code < 1 || code > 26)) return -1;
    if (is_key && code < KEY_MIN) return -1;
    for (int i = 0; i < KA_COUNT; i++)
        if (km->key[i] == code) return i;
    return -1;
}

void keymap_key_name(int code, char *buf, size_t cap)
{
    if (code >= 1 && code <= 26)
        snprintf(buf, cap, "^%c", 'A' + code - 1);
    else if (code >= KEY_F(1) && code <= KEY_F(12))
        snprintf(buf, cap, "F%d", code - KEY_F0);
    else if (code == KEY_PPAGE)
        snprintf(buf, cap, "PgUp");
    else if (code == KEY_NPAGE)
        snprintf(buf, cap, "PgDn");
    else if (code == KEY_IC)
        snprintf(buf, cap, "Ins");
    else if (code == KEY_HOME)
        snprintf(buf, cap, "Home");
    else if (code == KEY_END)
        snprintf(buf, cap, "End");
    else
        snprintf(buf, cap, "?");
}
