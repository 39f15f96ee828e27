/* sess_fixture.c - the session tests' shared fixture (see sess_fixture.h). */
#include "tests/sess_fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sess_fixture_copy(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    cr_assert(in && out);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    cr_assert(fclose(out) == 0);
}

void sess_fixture_open(sess_fixture *x)
{
    snprintf(x->dir, sizeof x->dir, "/tmp/kvchat-sess-XXXXXX");
    cr_assert(mkdtemp(x->dir));
    snprintf(x->db_path, sizeof x->db_path, "%s/s.db", x->dir);
    snprintf(x->doc, sizeof x->doc, "%s/doc.txt", x->dir);
    sess_fixture_copy(SESS_FIXTURE_TD "prompts/p2.txt", x->doc);
    char err[600];
    x->db = store_open(x->db_path, err, sizeof err);
    cr_assert(x->db, "%s", err);
    store_persist_init(&x->sp, x->db);
}

void sess_fixture_close(sess_fixture *x)
{
    store_close(x->db);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", x->dir);
    cr_expect(system(cmd) == 0);
}

session *sess_fixture_session(const char *spec, const store_persist *sp, const char *stop, int64_t n_predict)
{
    run_config rc;
    memset(&rc, 0, sizeof rc);
    rc.model_path = SESS_FIXTURE_TD "tiny/tiny-gemma3-q4_k_m.gguf";
    rc.device = BE_DEVICE_CPU;
    rc.n_threads = 1;
    rc.n_ctx = 4096;
    rc.page_size = 8;
    char err[600];
    cr_assert(pol_parse(&rc.policy, spec, NULL, err, sizeof err) == 0, "%s", err);
    rc.sp = samp_params_default();
    rc.sp.temperature = 0;
    run *r = run_create(&rc, err, sizeof err);
    cr_assert(r, "%s", err);
    sess_config c;
    memset(&c, 0, sizeof c);
    c.backtrack = 0;
    c.n_predict = n_predict;
    c.format = SESS_FORMAT_AUTO;
    if (stop) snprintf(c.stop[c.n_stop++], sizeof c.stop[0], "%s", stop);
    session *s = sess_create(r, &c, err, sizeof err);
    cr_assert(s, "%s", err);
    if (sp) cr_assert(sess_attach_store(s, &sp->ops) == 0, "%s", sess_error(s));
    return s;
}

void sess_fixture_ask(session *s, const char *q)
{
    int rc = sess_ask(s, q);
    cr_assert(rc == SESS_OK, "ask '%s': %d %s", q, rc, sess_error(s));
}
