/* keymap.h - the interface's remappable keys: each action has a default key, and the settings file
 * may bind another ("key.sessions = F9", "key.policy = ^P"). Keys are function keys F1..F12,
 * control keys ^A..^Z (except those that edit, stop or quit: ^A ^C ^D ^E ^H ^I ^J ^K ^M ^Q ^R ^U
 * ^W ^Y), PgUp, PgDn, Home, End, Ins. */
#ifndef KVCHAT_UI_KEYMAP_H
#define KVCHAT_UI_KEYMAP_H

#include <stddef.h>

typedef enum {
    KA_HELP,
    KA_SEEN,
    KA_SESSIONS,
    KA_POLICY,
    KA_SETTINGS,
    KA_OPEN,
    KA_REGEN,
    KA_SCROLL_UP,
    KA_SCROLL_DOWN,
    KA_TOP,
    KA_BOTTOM,
    KA_FIND,
    KA_MOUSE,
    KA_QUIT,
    KA_COUNT
} key_action;

typedef struct keymap {
    int key[KA_COUNT];       /* the ncurses key code of each action */
} keymap;

void keymap_default(keymap *km);
/* The action named name ("sessions"), or -1. */
int keymap_action(const char *name);
const char *keymap_action_name(int action);
/* A one-line description of the action, for the help screen. */
const char *keymap_action_help(int action);
/* Bind action to the key named key_name. 0, or -1 with a message (unknown key name, or a key
 * reserved for editing). */
int keymap_bind(keymap *km, int action, const char *key_name, char *err, size_t errlen);
/* After all bindings: 0, or -1 with a message when one key is bound to two actions. */
int keymap_check(const keymap *km, char *err, size_t errlen);
/* The action bound to key code, or -1. is_key: ncurses reported a key code (not a character). */
int keymap_lookup(const keymap *km, int code, int is_key);
/* The key's name ("F3", "^P", "PgUp"). */
void keymap_key_name(int code, char *buf, size_t cap);

#endif
