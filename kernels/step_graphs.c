/* step_graphs.c - decode work recorded as graphs and replayed (see step_graphs.h). */
#include "kernels/step_graphs.h"

#include <string.h>

void sg_init(sg_table *t, const sg_device *dev, int on, int split)
{
    memset(t, 0, sizeof *t);
    t->dev = *dev;
    t->on = on;
    t->split = split > 0 ? split : 0;
}

static void drop_all(sg_table *t)
{
    for (int i = 0; i < SG_CACHE; i++) {
        if (t->ent[i].exec) t->dev.destroy_exec(t->dev.ud, t->ent[i].exec);
        t->ent[i].exec = NULL;
    }
}

/* Graphs off for good: what is kept is released (a recording in progress is the caller's). */
static void turn_off(sg_table *t)
{
    t->on = 0;
    drop_all(t);
}

void sg_free(sg_table *t)
{
    if (t->recording) {
        void *g = NULL;
        t->recording = 0;
        if (t->dev.end(t->dev.ud, &g) == 0 && g) t->dev.destroy_graph(t->dev.ud, g);
    }
    drop_all(t);
}

int sg_begin(sg_table *t)
{
    if (!t->on || t->recording) return 0;
    if (t->dev.begin(t->dev.ud) != 0) {
        t->failures++;
        turn_off(t);
        return -1;
    }
    t->recording = 1;
    t->sig = 1469598103934665603ull;   /* FNV-1a's offset basis */
    t->n_calls = 0;
    return 0;
}

void sg_note(sg_table *t, const char *what)
{
    if (!t->recording) return;
    uint64_t v = (uint64_t)(uintptr_t)what;
    for (int i = 0; i < 8; i++) {
        t->sig ^= (v >> (8 * i)) & 0xff;
        t->sig *= 1099511628211ull;   /* FNV-1a's prime */
    }
    t->n_calls++;
}

int sg_split(const sg_table *t) { return t->recording && t->split > 0 && t->n_calls >= (uint32_t)t->split; }

/* The slot of this signature, or the one to build into (an empty one, else the least recently
 * used); *found says which. */
static sg_entry *slot_for(sg_table *t, uint64_t sig, uint32_t n_calls, int *found)
{
    sg_entry *victim = NULL;
    for (int i = 0; i < SG_CACHE; i++) {
        sg_entry *e = &t->ent[i];
        if (e->exec && e->sig == sig && e->n_calls == n_calls) {
            *found = 1;
            return e;
        }
        if (!victim || (victim->exec && (!e->exec || e->last_use < victim->last_use))) victim = e;
    }
    *found = 0;
    return victim;
}

int sg_flush(sg_table *t)
{
    if (!t->recording) return 0;
    t->recording = 0;
    void *g = NULL;
    if (t->dev.end(t->dev.ud, &g) != 0 || !g) {
        t->failures++;
        turn_off(t);
        return -1;
    }
    if (t->n_calls == 0) {   /* nothing recorded: nothing to run */
        t->dev.destroy_graph(t->dev.ud, g);
        return 0;
    }
    int found;
    sg_entry *e = slot_for(t, t->sig, t->n_calls, &found);
    int updated = 0;
    if (found) {
        if (t->dev.update(t->dev.ud, e->exec, g) == 0) updated = 1;
        else t->refused++;
    }
    if (!updated) {
        if (e->exec) t->dev.destroy_exec(t->dev.ud, e->exec);
        e->exec = t->dev.instantiate(t->dev.ud, g);
        if (!e->exec) {   /* the device short (of memory): once more without the other kept graphs */
            drop_all(t);
            e->exec = t->dev.instantiate(t->dev.ud, g);
        }
        if (!e->exec) {
            t->dev.destroy_graph(t->dev.ud, g);
            t->failures++;
            turn_off(t);
            return -1;
        }
        e->sig = t->sig;
        e->n_calls = t->n_calls;
        t->builds++;
    } else {
        t->updates++;
    }
    e->last_use = ++t->clock;
    t->dev.destroy_graph(t->dev.ud, g);
    if (t->dev.launch(t->dev.ud, e->exec) != 0) {
        t->failures++;
        turn_off(t);
        return -1;
    }
    t->segments++;
    t->calls += t->n_calls;
    t->win_segments++;
    t->win_builds += !updated;
    if (t->win_segments == SG_SETTLE) {
        if (t->win_builds * 2 > t->win_segments) {   /* shapes change too often to pay */
            t->gave_up = 1;
            turn_off(t);
        }
        t->win_segments = t->win_builds = 0;
    }
    return 0;
}
