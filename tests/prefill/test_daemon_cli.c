/* test_daemon_cli.c - pd-prefill / pd-decode command line: --help and
 * --version exit 0 with text on stdout; bad flags, bad values, a missing
 * model or secret, a bad router address exit 2 with ONE line on stderr;
 * the qdot row sets the engine's integer-dot path (its boot line says so).
 * usage: test-daemon-cli PD_PREFILL PD_DECODE MODEL */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_bins[2], *g_model;

static void slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* Run bin with args (shell words); exit status, stdout and stderr. */
static int run(const char *bin, const char *args, char *out, size_t outcap, char *err,
               size_t errcap)
{
    char o[] = "/tmp/pd-cli-out-XXXXXX", e[] = "/tmp/pd-cli-err-XXXXXX";
    int fo = mkstemp(o), fe = mkstemp(e);
    assert_true(fo >= 0 && fe >= 0);
    close(fo);
    close(fe);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s %s >%s 2>%s </dev/null", bin, args, o, e);
    int st = system(cmd);
    slurp(o, out, outcap);
    slurp(e, err, errcap);
    unlink(o);
    unlink(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void test_help_version(void **state)
{
    (void)state;
    char out[65536], err[4096];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(run(g_bins[i], "--help", out, sizeof(out), err, sizeof(err)), 0);
        assert_non_null(strstr(out, "--router"));
        assert_non_null(strstr(out, "--kv-blocks"));
        assert_non_null(strstr(out, i == 0 ? "--lease-ttl" : "--transfer-timeout"));
        assert_int_equal(run(g_bins[i], "--version", out, sizeof(out), err, sizeof(err)), 0);
        assert_true(strlen(out) > 0);
    }
}

static void test_bad_usage(void **state)
{
    (void)state;
    char out[65536], err[4096], args[2048];
    const char *cases[] = {
        "--bogus",
        "--kv-blocks=abc",
        "--kv-blocks=0",
        "--kv-dtype=f8",
        "--qdot=fast",
        "--lease-ttl=forever",
        "--log.level=loud --insecure-no-auth --model=M",
        "--insecure-no-auth",                               /* no model */
        "--model=M",                                        /* no secret */
        "--model=M --secret=abcd",                          /* short secret */
        "--model=M --secret-file=/nonexistent/secret",
        "--model=M --insecure-no-auth --router=10.1.2.3:7000", /* not loopback */
        "--model=M --insecure-no-auth --router=not-an-address",
        "--model=M --insecure-no-auth --engine=nope",
        "--model=M --insecure-no-auth --kv-listen=203.0.113.77",  /* no interface has it */
        "--model=M --insecure-no-auth --kv-listen=nosuch-if0",
    };
    for (int i = 0; i < 2; i++)
        for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
            if (strstr(cases[k], "lease-ttl") && i == 1)
                continue; /* prefill-only key */
            char c[1024];
            snprintf(c, sizeof(c), "%s", cases[k]);
            char *m = strstr(c, "--model=M");
            if (m)
                snprintf(args, sizeof(args), "%.*s--model=%s%s", (int)(m - c), c, g_model, m + 9);
            else
                snprintf(args, sizeof(args), "%s", c);
            int rc = run(g_bins[i], args, out, sizeof(out), err, sizeof(err));
            if (rc != 2 || count_lines(err) != 1)
                fprintf(stderr, "%s %s -> rc %d, stderr: %s\n", g_bins[i], args, rc, err);
            assert_int_equal(rc, 2);
            assert_int_equal(count_lines(err), 1);
        }
}

/* qdot = PD_QDOT as a config row (pdctl passes no PD_* to the daemons): the
 * engine's boot line names the path it set (scalar and off exist on every
 * CPU; the row overrides the environment's PD_QDOT) */
static void test_qdot_row(void **state)
{
    (void)state;
    char out[65536], err[16384], args[2048];
    static const char *const rows[][2] = { { "scalar", "qdot path: scalar (" },
                                           { "off", "qdot path: off (" } };
    for (int i = 0; i < 2; i++)
        for (size_t k = 0; k < sizeof(rows) / sizeof(rows[0]); k++) {
            snprintf(args, sizeof(args), "--model=%s --insecure-no-auth --print-arena-bytes --qdot=%s",
                     g_model, rows[k][0]);
            char bin[1024];
            snprintf(bin, sizeof(bin), "PD_QDOT=vnni %s", g_bins[i]);
            assert_int_equal(run(bin, args, out, sizeof(out), err, sizeof(err)), 0);
            if (!strstr(err, rows[k][1]))
                fail_msg("%s --qdot=%s: no \"%s\" in: %s", g_bins[i], rows[k][0], rows[k][1], err);
        }
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    g_bins[0] = argv[1];
    g_bins[1] = argv[2];
    g_model = argv[3];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_version),
        cmocka_unit_test(test_bad_usage),
        cmocka_unit_test(test_qdot_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
