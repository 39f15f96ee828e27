/* cmd_ask.c - `kvchat ask`: answer one question about a document under a KV-cache policy, then print
 * one line of metrics (and, with --show-pages, which pages of the document the answer attended). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "app/cli.h"
#include "app/commands.h"
#include "app/session.h"
#include "engine/snapshot.h"
#include "engine/tokenizer.h"

static void usage(void)
{
    printf("usage: kvchat ask -d DOCUMENT -q QUESTION [options]\n"
           "\n"
           "  -d, --doc FILE       the document (UTF-8 text)\n"
           "  -q, --question TEXT  the question, asked after the document in one user turn\n"
           "  -n N                 answer tokens at most (default 128)\n"
           "  --chat / --plain     force the model's chat template / the plain completion format (default:\n"
           "                       the chat template when the model file has one, else plain)\n"
           "  --policy SPEC        KV-cache policy, e.g. chess:preset=aggressive, quest:budget=1024, take+chess\n"
           "  --budget B           fraction of the context (0 < B < 1) or a token count\n"
           "  --page-size P        KV cache page size in tokens (default 32)\n"
           "  --show-pages         print the page map: how often each page of the document was attended\n"
           "  --show-events        print each answer page's entropy statistics and every backtracking event\n"
           "  --backtrack R        regenerate at most R uncertain pages per answer (default 2 with chess, else 0)\n"
           "  --thresholds T       a calibration file, or MEAN_H,VAR_H (default: the model's calibration)\n"
           "  --session NAME       keep the conversation in the store: create it, or continue it from its snapshot\n"
           "  --resume SESSION     continue a saved session (name or id; -d not needed) with the next question\n"
           "  --db PATH            the session database (default ~/.local/share/kvchat/kvchat.db)\n"
           "  -m MODEL  --ctx N  --threads N  --temp T (default 0: greedy)  --seed S  ...\n\n");
    cli_policy_help();
}

/* One character per document page: how often decode steps attended it, relative to the maximum. */
static void print_page_map(cli_runtime *rt, int64_t doc_tokens)
{
    int64_t n;
    const int64_t *map = pol_set_page_map(rt->ps, &n);
    const pol_step_stats *st = pol_set_stats(rt->ps);
    int P = kv_page_size(fwd_kv(rt->f));
    int64_t doc_pages = (doc_tokens + P - 1) / P;
    int64_t total = (fwd_pos(rt->f) + P - 1) / P;
    int64_t mx = 0, attended = 0;
    for (int64_t i = 0; i < n; i++) {
        if (map[i] > mx) mx = map[i];
        attended += map[i] > 0;
    }
    static const char ramp[] = " .:-=+*#%@";
    printf("page map: %lld pages of %d tokens (%lld hold the prompt), %lld attended at least once over %lld steps; "
           "one character per page, ' ' never .. '@' most\n",
           (long long)total, P, (long long)doc_pages, (long long)attended, (long long)st->steps);
    for (int64_t i = 0; i < total; i += 64) {
        printf("%6lld |", (long long)i);
        for (int64_t j = i; j < i + 64 && j < total; j++) {
            int64_t h = j < n ? map[j] : 0;
            int lvl = h == 0 || mx == 0 ? 0 : 1 + (int)((h * 8) / (mx + 1));
            putchar(ramp[lvl > 9 ? 9 : lvl]);
        }
        printf("|\n");
    }
    int nl;
    const int *last = pol_set_last_pages(rt->ps, &nl);
    printf("last step, first global layer: %d pages:", nl);
    for (int i = 0; i < nl && i < 64; i++) printf(" %d", last[i]);
    printf(nl > 64 ? " ...\n" : "\n");
}

/* The figures of one answer, as JSON for the message row. */
static void metrics_json(char *buf, size_t cap, const cli_runtime *rt, int64_t prompt, const gen_result *gr,
                         double prefill_s, double decode_s, int resumed, double restore_ms)
{
    kv_stats ks;
    kv_get_stats(fwd_kv(rt->f), &ks);
    snprintf(buf, cap,
             "{\"policy\": \"%s\", \"prompt_tokens\": %lld, \"answer_tokens\": %lld, \"prefill_s\": %.3f, "
             "\"decode_s\": %.3f, \"kv_bytes\": %llu, \"kv_full_bytes\": %llu, \"events\": %d, \"regenerated\": %d, "
             "\"resumed_from_snapshot\": %s, \"restore_ms\": %.1f}",
             pol_set_spec(rt->ps)->text, (long long)prompt, (long long)gr->n_gen, prefill_s, decode_s,
             (unsigned long long)ks.bytes_resident, (unsigned long long)ks.bytes_full, gr->events, gr->regenerated,
             resumed ? "true" : "false", restore_ms);
}

int cmd_ask(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;   /* answers are reproducible unless --temp asks otherwise */
    const char *doc = NULL, *question = NULL, *session_name = NULL, *resume = NULL, *db_path = NULL;
    int64_t n_predict = 128;
    int show_pages = 0, format = -1;   /* 1 chat template, 0 plain, -1 decide from the file */
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_common(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "-d") || !strcmp(a, "--doc")) {
            if (!(doc = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--question")) {
            if (!(question = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            const char *v = cli_need_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 1 << 20, &n_predict)) return 1;
        } else if (!strcmp(a, "--chat")) {
            format = 1;
        } else if (!strcmp(a, "--plain")) {
            format = 0;
        } else if (!strcmp(a, "--show-pages")) {
            show_pages = 1;
        } else if (!strcmp(a, "--session")) {
            if (!(session_name = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--resume")) {
            if (!(resume = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            cli_err("ask: unknown option %s (see kvchat ask --help)", a);
            return 1;
        }
    }
    if (!question || (!doc && !resume)) {
        cli_err("ask: give -d DOCUMENT and -q QUESTION (or --resume SESSION -q QUESTION)");
        return 1;
    }
    if (session_name && resume) {
        cli_err("ask: give --session NAME (create or continue) or --resume SESSION, not both");
        return 1;
    }
    if (session_name && !*session_name) {
        cli_err("ask: --session needs a name");
        return 1;
    }
    if (!*question || tok_utf8_invalid_at(question, strlen(question)) >= 0) {
        cli_err("ask: the question is %s", *question ? "not valid UTF-8" : "empty");
        return 1;
    }
    if (cli_finish_common(&o)) return 1;
    db_path = o.db;
    size_t dlen = 0;
    char *text = NULL;
    if (doc) {
        if (!(text = cli_read_text_file(doc, &dlen))) return 1;
        if (dlen == 0) {
            cli_err("ask: %s is empty", doc);
            free(text);
            return 1;
        }
    }
    cli_runtime rt;
    if (cli_open(&rt, &o, 1) != 0) {
        free(text);
        return 1;
    }
    int rc = 1;
    char err[1024], mpath_buf[1024], key[256], msha[65] = "";
    const char *mpath = o.model_path ? o.model_path : cli_default_model_path(mpath_buf, sizeof mpath_buf);
    int32_t *ids = NULL, *hist = NULL, *seq = NULL;
    size_t n_ids = 0;
    int64_t n_hist = 0, leaf = 0, model_id = 0, doc_id = 0;
    float *logits = NULL;
    samp *s = NULL;
    store *db = NULL;
    store_session ss;
    store_message *path = NULL;
    int n_path = 0, have_sess = 0, resumed = 0;
    double restore_ms = 0;
    cli_answer ans = { 0 };
    int32_t nv = rt.m->hp.n_vocab;
    logits = malloc(sizeof(float) * (size_t)nv);
    s = samp_create(&o.sp, nv);
    if (!logits || !s) {
        cli_err("ask: out of memory");
        goto done;
    }

    /* ---- the session: find or create, check it is this model and document, take its settings */
    if (session_name || resume) {
        if (!(db = sess_db_open(db_path)) || sess_model(db, mpath, rt.m, &model_id, msha)) goto done;
        int f = store_session_find(db, resume ? resume : session_name, &ss);
        if (f < 0) {
            cli_err("ask: %s", store_error(db));
            goto done;
        }
        if (f == 1 && resume) {
            cli_err("ask: no session '%s' (kvchat sessions list shows them)", resume);
            goto done;
        }
        have_sess = f == 0;
        if (have_sess) {
            if (strcmp(ss.model_sha, msha) != 0) {
                cli_err("ask: session %lld was made with another model (%s); pass -m with that file", (long long)ss.id,
                        ss.model_path);
                goto done;
            }
            if (text) {
                char dsha[65];
                snap_sha256_bytes(text, dlen, dsha);
                if (strcmp(dsha, ss.doc_sha) != 0) {
                    cli_err("ask: session %lld is about %s, not %s (start another session for this document)",
                            (long long)ss.id, ss.doc_title, doc);
                    goto done;
                }
            }
            int want = !strcmp(ss.format, "chat");
            if (format >= 0 && format != want) {
                cli_err("ask: session %lld writes its turns in the %s format", (long long)ss.id, ss.format);
                goto done;
            }
            format = want;
            if (!o.policy && cli_set_policy(&rt, ss.policy, ss.budget)) goto done;
            if (store_latest_message(db, ss.id, &leaf) || (leaf && store_message_path(db, leaf, &path, &n_path))) {
                cli_err("ask: %s", store_error(db));
                goto done;
            }
            /* a question left without an answer (an interrupted turn) is superseded by this one */
            if (n_path > 0 && strcmp(path[n_path - 1].role, "assistant") != 0) {
                leaf = path[n_path - 1].parent;
                n_path--;
            }
        }
    }
    if (format < 0) format = gguf_find_key(rt.m->gguf, "tokenizer.chat_template") >= 0;

    /* ---- the cache: restored from the snapshot after the last answer, when one exists */
    sess_prefill_key(pol_set_spec(rt.ps), key, sizeof key);
    if (have_sess && leaf) {
        void *data;
        size_t len;
        int g = store_snapshot_get(db, leaf, key, &data, &len);
        if (g < 0) {
            cli_err("ask: %s", store_error(db));
            goto done;
        }
        if (g == 0 && !o.page_size && snap_page_size(data, len) > 0 &&
            snap_page_size(data, len) != kv_page_size(fwd_kv(rt.f)) && cli_reopen_fwd(&rt, &o, snap_page_size(data, len))) {
            free(data);
            goto done;
        }
        if (g == 0) {
            snap_identity id;
            snap_identity_of(rt.f, msha, &id);
            double t = cli_now();
            int bad = snap_restore(rt.f, s, data, len, &id, &hist, &n_hist, err, sizeof err);
            restore_ms = (cli_now() - t) * 1e3;
            free(data);
            if (bad) {
                cli_err("ask: cannot resume session %lld: %s", (long long)ss.id, err);
                goto done;
            }
            resumed = 1;
            fprintf(stderr, "session %lld: restored %lld tokens (%s) from a %.1f MiB snapshot in %.0f ms\n",
                    (long long)ss.id, (long long)n_hist, key, (double)len / (1024.0 * 1024.0), restore_ms);
        } else if (!text) {
            /* no snapshot under this prefill policy: the conversation is prefilled again from its text */
            size_t L;
            if (!(text = cli_read_text_file(ss.doc_path, &L))) goto done;
            dlen = L;
        }
    }

    /* ---- the tokens to evaluate now */
    int64_t kv0 = fwd_pos(rt.f);
    if (resumed) {
        int32_t *cont = NULL;
        size_t n_cont = 0;
        if (sess_continue_tokens(&rt, format, question, &cont, &n_cont, err, sizeof err)) {
            cli_err("ask: %s", err);
            goto done;
        }
        n_ids = (size_t)(n_hist - kv0) + n_cont;   /* sampled but never evaluated, then the new turn */
        ids = malloc(sizeof(int32_t) * (n_ids > 0 ? n_ids : 1));
        if (!ids) {
            free(cont);
            cli_err("ask: out of memory");
            goto done;
        }
        memcpy(ids, hist + kv0, sizeof(int32_t) * (size_t)(n_hist - kv0));
        memcpy(ids + (n_hist - kv0), cont, sizeof(int32_t) * n_cont);
        free(cont);
    } else if (have_sess && leaf) {
        if (sess_full_tokens(&rt, format, text, path, n_path, question, &ids, &n_ids, err, sizeof err)) {
            cli_err("ask: %s", err);
            goto done;
        }
    } else if (cli_doc_prompt(&rt, text, question, format, &ids, &n_ids, err, sizeof err)) {
        cli_err("ask: %s", err);
        goto done;
    }
    if (kv0 + (int64_t)n_ids + 1 > fwd_n_ctx(rt.f)) {
        cli_err("ask: the %s and question are %lld tokens, longer than the context of %lld tokens",
                kv0 ? "conversation" : "document", (long long)(kv0 + (int64_t)n_ids), (long long)fwd_n_ctx(rt.f));
        goto done;
    }
    if (pol_set_check(rt.ps, kv0 + (int64_t)n_ids, err, sizeof err)) {
        cli_err("ask: %s", err);
        goto done;
    }
    if (!resumed) samp_reset(s);
    for (size_t i = 0; i < n_ids; i++) samp_accept(s, ids[i]);
    pol_set_probe_is_question(rt.ps, 1);   /* document and question are prefilled together */
    cli_install_sigint();
    double t0 = cli_now();
    if (fwd_eval(rt.f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, &cli_interrupted, err, sizeof err)) {
        cli_err("ask: %s", cli_interrupted ? "interrupted during prefill" : err);
        if (cli_interrupted) rc = 130;
        goto done;
    }
    double t1 = cli_now();
    gen_result gr;
    const char *stop_note;
    if (cli_stream_answer(&rt, s, logits, ids[n_ids - 1], n_predict, o.show_events, &gr, &stop_note, &ans, err,
                          sizeof err)) {
        cli_err("ask: %s", err);
        goto done;
    }
    double t2 = cli_now();
    if (show_pages) print_page_map(&rt, kv0 + (int64_t)n_ids);
    fflush(stdout);
    kv_stats ks;
    kv_get_stats(fwd_kv(rt.f), &ks);
    const pol_step_stats *st = pol_set_stats(rt.ps);
    int64_t steps = st->steps;
    double mib = 1024.0 * 1024.0;
    int64_t n_glob = pol_set_env(rt.ps)->n_global;
    /* pages a step attends, per global layer and KV head, averaged over the steps */
    double denom = (double)steps * (double)n_glob * rt.m->hp.n_head_kv;
    double per = denom > 0 ? (double)st->pages_sum / denom : 0;
    double avail = denom > 0 ? (double)st->pages_total_sum / denom : 0;
    int64_t peak_layer = 0;
    for (int i = 0; i < n_glob; i++) {
        int64_t t = kv_peak_layer_tokens(fwd_kv(rt.f), pol_set_env(rt.ps)->global[i]);
        if (t > peak_layer) peak_layer = t;
    }
    fprintf(stderr,
            "policy %s | context %lld tokens | KV held %.2f MiB vs full %.2f MiB (peak %.2f MiB, %s; peak per global "
            "layer and KV head %lld tokens) | pages/step "
            "%.1f of %.0f | KV read/step %.2f MiB | prefill %.1f tok/s | decode %.1f tok/s (%lld tokens)%s\n",
            pol_set_spec(rt.ps)->text, (long long)ks.positions, (double)ks.bytes_resident / mib,
            (double)ks.bytes_full / mib, (double)ks.bytes_peak / mib,
            pol_set_saves_memory(rt.ps) ? "tokens dropped" : "selection keeps every page", (long long)peak_layer, per, avail,
            steps > 0 ? (double)st->bytes_touched_total / (double)steps / mib : 0.0, (double)n_ids / (t1 - t0),
            steps > 0 ? (double)steps / (t2 - t1) : 0.0, (long long)gr.n_gen, stop_note);
    char desc[1024];
    pol_set_describe(rt.ps, desc, sizeof desc);
    if (desc[0]) fprintf(stderr, "%s\n", desc);
    rc = cli_interrupted ? 130 : 0;

    /* ---- the turn goes into the session: both messages, the events, a snapshot after the answer.
     * A failure here is reported (exit status 1) but the answer above stands. */
    if (db) {
        int64_t sid = have_sess ? ss.id : 0, um, am, snap_id;
        char title[256], mj[1024];
        snprintf(title, sizeof title, "%.200s", question);
        if (!have_sess) {
            if (sess_document(db, model_id, doc, text, dlen, (int64_t)n_ids, &doc_id)) {
                rc = 1;
                goto done;
            }
            char budget[32] = "";
            if (o.budget) snprintf(budget, sizeof budget, "%s", o.budget);
            if (store_session_create(db, session_name, title, model_id, doc_id, pol_set_spec(rt.ps)->text, budget,
                                     format ? "chat" : "plain", &sid)) {
                cli_err("ask: session not saved: %s", store_error(db));
                rc = 1;
                goto done;
            }
        }
        metrics_json(mj, sizeof mj, &rt, kv0 + (int64_t)n_ids, &gr, t1 - t0, t2 - t1, resumed, restore_ms);
        int n_ev;
        const unc_event *ev = unc_events(rt.mon, &n_ev);
        if (ans.oom || store_message_add(db, sid, leaf, "user", question, pol_set_spec(rt.ps)->text, NULL, &um) ||
            store_message_add(db, sid, um, "assistant", ans.text ? ans.text : "", pol_set_spec(rt.ps)->text, mj,
                              &am) ||
            store_events_put(db, am, ev, n_ev)) {
            cli_err("ask: session not saved: %s", ans.oom ? "out of memory" : store_error(db));
            rc = 1;
            goto done;
        }
        /* the sequence's ids: what the cache held before, this turn's prompt, the answer */
        int64_t n_seq = kv0 + (int64_t)n_ids + ans.n;
        seq = malloc(sizeof(int32_t) * (size_t)(n_seq > 0 ? n_seq : 1));
        if (!seq) {
            cli_err("ask: session not saved: out of memory");
            rc = 1;
            goto done;
        }
        if (kv0) memcpy(seq, hist, sizeof(int32_t) * (size_t)kv0);
        memcpy(seq + kv0, ids, sizeof(int32_t) * n_ids);
        memcpy(seq + kv0 + n_ids, ans.ids, sizeof(int32_t) * (size_t)ans.n);
        snap_identity id;
        snap_identity_of(rt.f, msha, &id);
        void *data;
        size_t len;
        double t3 = cli_now();
        if (snap_save(rt.f, s, &id, seq, n_seq, &data, &len, err, sizeof err)) {
            cli_err("ask: session saved without a snapshot: %s", err);
            rc = 1;
            goto done;
        }
        int bad = store_snapshot_put(db, sid, am, key, n_seq, data, len, &snap_id);
        free(data);
        if (bad) {
            cli_err("ask: session saved without a snapshot: %s", store_error(db));
            rc = 1;
            goto done;
        }
        fprintf(stderr, "session %lld%s%s%s: turn saved (messages %lld, %lld), snapshot of %lld tokens, %.1f MiB in %.0f ms\n",
                (long long)sid, session_name ? " (" : "", session_name ? session_name : "", session_name ? ")" : "",
                (long long)um, (long long)am, (long long)n_seq, (double)len / mib, (cli_now() - t3) * 1e3);
    }
done:
    cli_answer_free(&ans);
    store_messages_free(path, n_path);
    store_close(db);
    samp_free(s);
    free(logits);
    free(ids);
    free(hist);
    free(seq);
    free(text);
    cli_close(&rt);
    return rc;
}
