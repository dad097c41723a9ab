/* test_config.c - config tables: precedence, every type's parser and error
 * line, --help/--version, JSON/INI dumps, and the real exit statuses. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_boot.h"
#include "pd_config.h"
#include "pd_time.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    char *name;
    int64_t delta;
    uint64_t kv_blocks;
    bool verbose;
    double ratio;
    uint64_t arena;        /* bytes */
    uint64_t timeout_ns;
    int mode;
    char *admin_socket;
} tcfg_t;

static const char *const modes[] = { "fast", "slow", "off", NULL };

static const pd_cfg_field_t fields[] = {
    PD_CFG_ROW(tcfg_t, name, "name", STRING, "alpha", "a name", 0, 0, NULL),
    PD_CFG_ROW(tcfg_t, delta, "delta", INT, "-5", "signed", -100, 100, NULL),
    PD_CFG_ROW(tcfg_t, kv_blocks, "kv-blocks", UINT, "1024", "KV blocks", 1, 1e6, NULL),
    PD_CFG_ROW(tcfg_t, verbose, "verbose", BOOL, "false", "chatty", 0, 0, NULL),
    PD_CFG_ROW(tcfg_t, ratio, "ratio", DOUBLE, "0.5", "a fraction", 0, 1, NULL),
    PD_CFG_ROW(tcfg_t, arena, "arena", SIZE, "64MiB", "arena size", 0, 0, NULL),
    PD_CFG_ROW(tcfg_t, timeout_ns, "timeout", DURATION, "30s", "a timeout",
               1e6, 3600e9, NULL),
    PD_CFG_ROW(tcfg_t, mode, "mode", ENUM, "fast", "a mode", 0, 0, modes),
    PD_CFG_ROW(tcfg_t, admin_socket, "admin.socket", STRING, NULL, "socket", 0, 0, NULL),
    PD_CFG_END
};

static const pd_cfg_schema_t schema = {
    .prog = "pd-test", .summary = "config test", .version = "9.9",
    .fields = fields,
};

static char tmpdir[] = "/tmp/pd-test-config-XXXXXX";

static void clear_env(void)
{
    static const char *const vars[] = { "PD_NAME", "PD_DELTA", "PD_KV_BLOCKS",
        "PD_VERBOSE", "PD_RATIO", "PD_ARENA", "PD_TIMEOUT", "PD_MODE",
        "PD_ADMIN_SOCKET", "PD_CONFIG", NULL };
    for (int i = 0; vars[i]; i++)
        unsetenv(vars[i]);
}

static int setup(void **state)
{
    clear_env();
    return 0;
}

static int teardown(void **state)
{
    clear_env();
    return 0;
}

static char *write_file(const char *name, const char *text)
{
    char *path;
    assert_true(asprintf(&path, "%s/%s", tmpdir, name) > 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Run pd_config_load on a NULL-terminated argument list. */
static pd_status_t load(tcfg_t *cfg, pd_cfg_result_t *res, ...)
{
    char *argv[32] = { "pd-test" };
    int argc = 1;
    va_list ap;
    va_start(ap, res);
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    memset(cfg, 0, sizeof(*cfg));
    return pd_config_load(&schema, cfg, argc, argv, res);
}

static void test_defaults(void **state)
{
    tcfg_t c;
    pd_cfg_result_t r;
    assert_int_equal(load(&c, &r, NULL), PD_OK);
    assert_int_equal(r.exit_code, PD_CONFIG_RUN);
    assert_string_equal(c.name, "alpha");
    assert_int_equal(c.delta, -5);
    assert_int_equal(c.kv_blocks, 1024);
    assert_false(c.verbose);
    assert_true(c.ratio == 0.5);
    assert_int_equal(c.arena, 64ULL << 20);
    assert_int_equal(c.timeout_ns, 30 * PD_NS_PER_S);
    assert_int_equal(c.mode, 0);
    assert_null(c.admin_socket);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
}

static void test_precedence(void **state)
{
    char *path = write_file("prec.ini",
        "kv-blocks = 10\n"
        "name = file\n"
        "ratio = 0.25\n"
        "timeout = 2m\n"
        "mode = slow\n"
        "[admin]\n"
        "socket = /tmp/from-file.sock\n");
    char *flag;
    assert_true(asprintf(&flag, "--config=%s", path) > 0);
    setenv("PD_KV_BLOCKS", "20", 1);
    setenv("PD_NAME", "env", 1);
    setenv("PD_MODE", "off", 1);

    tcfg_t c;
    pd_cfg_result_t r;
    assert_int_equal(load(&c, &r, flag, "--kv-blocks=30", "--mode", "fast", NULL), PD_OK);
    assert_int_equal(r.exit_code, PD_CONFIG_RUN);
    assert_int_equal(c.kv_blocks, 30);                 /* CLI > env > file */
    assert_string_equal(c.name, "env");                /* env > file */
    assert_int_equal(c.mode, 0);                       /* CLI (space form) */
    assert_true(c.ratio == 0.25);                      /* file > default */
    assert_int_equal(c.timeout_ns, 120 * PD_NS_PER_S);
    assert_string_equal(c.admin_socket, "/tmp/from-file.sock"); /* [section] */
    assert_int_equal(c.delta, -5);                     /* default */
    assert_string_equal(r.config_path, path);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);

    /* the file can also come from PD_CONFIG; flat dotted keys work too */
    char *path2 = write_file("flat.ini", "admin.socket = /tmp/flat.sock\nverbose = yes\n");
    setenv("PD_CONFIG", path2, 1);
    assert_int_equal(load(&c, &r, "--no-verbose", NULL), PD_OK);
    assert_string_equal(c.admin_socket, "/tmp/flat.sock");
    assert_false(c.verbose);                           /* CLI --no- wins */
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    assert_int_equal(load(&c, &r, NULL), PD_OK);
    assert_true(c.verbose);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);

    free(flag);
    free(path);
    free(path2);
}

typedef struct {
    const char *arg;
    const char *message;
} bad_case_t;

static void test_cli_errors(void **state)
{
    static const bad_case_t cases[] = {
        { "--kv-blocks=abc", "pd-test: --kv-blocks: expected an unsigned integer, got \"abc\"" },
        { "--kv-blocks=-1", "pd-test: --kv-blocks: expected an unsigned integer, got \"-1\"" },
        { "--kv-blocks=0", "pd-test: --kv-blocks: 0 is out of range [1, 1000000]" },
        { "--kv-blocks=99999999999999999999", "pd-test: --kv-blocks: expected an unsigned integer, got \"99999999999999999999\"" },
        { "--delta=1.5", "pd-test: --delta: expected an integer, got \"1.5\"" },
        { "--delta=-101", "pd-test: --delta: -101 is out of range [-100, 100]" },
        { "--verbose=maybe", "pd-test: --verbose: expected true or false, got \"maybe\"" },
        { "--ratio=x", "pd-test: --ratio: expected a number, got \"x\"" },
        { "--ratio=2", "pd-test: --ratio: 2 is out of range [0, 1]" },
        { "--ratio=nan", "pd-test: --ratio: expected a number, got \"nan\"" },
        { "--arena=12XB", "pd-test: --arena: expected a size like 4096, 64KiB, 64MiB or 1G, got \"12XB\"" },
        { "--arena=", "pd-test: --arena: expected a size like 4096, 64KiB, 64MiB or 1G, got \"\"" },
        { "--arena=99999999999T", "pd-test: --arena: expected a size like 4096, 64KiB, 64MiB or 1G, got \"99999999999T\"" },
        { "--timeout=5parsecs", "pd-test: --timeout: expected a duration like 500ms, 30s or 2m, got \"5parsecs\"" },
        { "--timeout=2h", "pd-test: --timeout: 2h is out of range [1ms, 1h]" },
        { "--mode=medium", "pd-test: --mode: expected one of fast|slow|off, got \"medium\"" },
        { "--bogus=1", "pd-test: unknown flag --bogus (see --help)" },
        { "--no-kv-blocks", "pd-test: unknown flag --no-kv-blocks (see --help)" },
        { "-x", "pd-test: unknown flag -x (see --help)" },
        { "stray", "pd-test: unexpected argument \"stray\" (see --help)" },
        { "--kv-blocks", "pd-test: --kv-blocks: missing value" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tcfg_t c;
        pd_cfg_result_t r;
        pd_status_t s = load(&c, &r, cases[i].arg, NULL);
        if (s != PD_ERR_BAD_INPUT || strcmp(r.message, cases[i].message) != 0)
            fail_msg("case %s: status %d message \"%s\"", cases[i].arg, s, r.message);
        assert_int_equal(r.exit_code, PD_CONFIG_EXIT_USAGE);
        assert_null(strchr(r.message, '\n'));
        pd_config_result_free(&r);
        pd_config_free(&schema, &c);
    }
}

static void test_env_and_file_errors(void **state)
{
    tcfg_t c;
    pd_cfg_result_t r;

    setenv("PD_KV_BLOCKS", "abc", 1);
    assert_int_equal(load(&c, &r, NULL), PD_ERR_BAD_INPUT);
    assert_string_equal(r.message,
        "pd-test: PD_KV_BLOCKS: expected an unsigned integer, got \"abc\"");
    assert_int_equal(r.exit_code, 2);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    /* CLI still overrides a bad env?  No: every source must be valid. */
    unsetenv("PD_KV_BLOCKS");

    char *path = write_file("unknown.ini", "name = x\nnope = 1\n");
    char *flag, *expect;
    assert_true(asprintf(&flag, "--config=%s", path) > 0);
    assert_int_equal(load(&c, &r, flag, NULL), PD_ERR_BAD_INPUT);
    assert_true(asprintf(&expect, "pd-test: %s:2: unknown key \"nope\"", path) > 0);
    assert_string_equal(r.message, expect);
    assert_int_equal(r.exit_code, 2);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    free(flag); free(expect); free(path);

    path = write_file("badval.ini", "[admin]\nsocket = /x\n\ntimeout = soon\n");
    assert_true(asprintf(&flag, "--config=%s", path) > 0);
    assert_int_equal(load(&c, &r, flag, NULL), PD_ERR_BAD_INPUT);
    assert_true(asprintf(&expect, "pd-test: %s:4: unknown key \"admin.timeout\"", path) > 0);
    assert_string_equal(r.message, expect);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    free(flag); free(expect); free(path);

    path = write_file("badval2.ini", "timeout = soon\n");
    assert_true(asprintf(&flag, "--config=%s", path) > 0);
    assert_int_equal(load(&c, &r, flag, NULL), PD_ERR_BAD_INPUT);
    assert_true(asprintf(&expect, "pd-test: %s:1: timeout: expected a duration like "
                         "500ms, 30s or 2m, got \"soon\"", path) > 0);
    assert_string_equal(r.message, expect);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    free(flag); free(expect); free(path);

    path = write_file("syntax.ini", "[unterminated\n");
    assert_true(asprintf(&flag, "--config=%s", path) > 0);
    assert_int_equal(load(&c, &r, flag, NULL), PD_ERR_BAD_INPUT);
    assert_non_null(strstr(r.message, ":1: syntax error"));
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    free(flag); free(path);

    assert_int_equal(load(&c, &r, "--config", "/nonexistent/pd.ini", NULL), PD_ERR_IO);
    assert_string_equal(r.message,
                        "pd-test: --config: cannot open \"/nonexistent/pd.ini\"");
    assert_int_equal(r.exit_code, 2);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
}

static void test_help_version(void **state)
{
    tcfg_t c;
    pd_cfg_result_t r;
    assert_int_equal(load(&c, &r, "--kv-blocks=abc", "--help", NULL), PD_OK);
    assert_int_equal(r.exit_code, PD_CONFIG_EXIT_OK);
    assert_non_null(strstr(r.text, "usage: pd-test"));
    assert_non_null(strstr(r.text, "--kv-blocks=UINT"));
    assert_non_null(strstr(r.text, "env PD_KV_BLOCKS"));
    assert_non_null(strstr(r.text, "env PD_ADMIN_SOCKET"));
    assert_non_null(strstr(r.text, "one of fast|slow|off"));
    assert_non_null(strstr(r.text, "--[no-]verbose"));
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);

    assert_int_equal(load(&c, &r, "--version", NULL), PD_OK);
    assert_int_equal(r.exit_code, PD_CONFIG_EXIT_OK);
    assert_string_equal(r.text, "pd-test 9.9\n");
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
}

static void test_parsers(void **state)
{
    uint64_t v;
    bool b;
    assert_int_equal(pd_parse_size("4096", &v), PD_OK); assert_int_equal(v, 4096);
    assert_int_equal(pd_parse_size("64MiB", &v), PD_OK); assert_int_equal(v, 64ULL << 20);
    assert_int_equal(pd_parse_size("1G", &v), PD_OK); assert_int_equal(v, 1ULL << 30);
    assert_int_equal(pd_parse_size("2gb", &v), PD_OK); assert_int_equal(v, 2ULL << 30);
    assert_int_equal(pd_parse_size("1.5K", &v), PD_OK); assert_int_equal(v, 1536);
    assert_int_equal(pd_parse_size("16EiB", &v), PD_ERR_BAD_INPUT);
    assert_int_equal(pd_parse_size("-1", &v), PD_ERR_BAD_INPUT);
    assert_int_equal(pd_parse_size(" 1", &v), PD_ERR_BAD_INPUT);
    assert_int_equal(pd_parse_size("1 K", &v), PD_ERR_BAD_INPUT);
    assert_int_equal(pd_parse_size("17179869184T", &v), PD_ERR_BAD_INPUT);

    assert_int_equal(pd_parse_duration("500ms", &v), PD_OK); assert_int_equal(v, 500 * PD_NS_PER_MS);
    assert_int_equal(pd_parse_duration("30s", &v), PD_OK); assert_int_equal(v, 30 * PD_NS_PER_S);
    assert_int_equal(pd_parse_duration("2m", &v), PD_OK); assert_int_equal(v, 120 * PD_NS_PER_S);
    assert_int_equal(pd_parse_duration("1m30s", &v), PD_OK); assert_int_equal(v, 90 * PD_NS_PER_S);
    assert_int_equal(pd_parse_duration("1.5s", &v), PD_OK); assert_int_equal(v, 1500 * PD_NS_PER_MS);
    assert_int_equal(pd_parse_duration("250us", &v), PD_OK); assert_int_equal(v, 250 * PD_NS_PER_US);
    assert_int_equal(pd_parse_duration("10", &v), PD_OK); assert_int_equal(v, 10 * PD_NS_PER_S);
    assert_int_equal(pd_parse_duration("1h", &v), PD_OK); assert_int_equal(v, 3600 * PD_NS_PER_S);
    assert_int_equal(pd_parse_duration("", &v), PD_ERR_BAD_INPUT);
    assert_int_equal(pd_parse_duration("ms", &v), PD_ERR_BAD_INPUT);
    assert_int_equal(pd_parse_duration("5x", &v), PD_ERR_BAD_INPUT);
    assert_int_equal(pd_parse_duration("-5s", &v), PD_ERR_BAD_INPUT);
    assert_int_equal(pd_parse_duration("99999999999999h", &v), PD_ERR_BAD_INPUT);

    char buf[32];
    assert_string_equal(pd_format_duration(1500 * PD_NS_PER_MS, buf, sizeof(buf)), "1500ms");
    assert_string_equal(pd_format_duration(120 * PD_NS_PER_S, buf, sizeof(buf)), "2m");
    assert_string_equal(pd_format_duration(7, buf, sizeof(buf)), "7ns");
    assert_string_equal(pd_format_duration(0, buf, sizeof(buf)), "0ns");

    assert_int_equal(pd_parse_bool("On", &b), PD_OK); assert_true(b);
    assert_int_equal(pd_parse_bool("0", &b), PD_OK); assert_false(b);
    assert_int_equal(pd_parse_bool("y", &b), PD_ERR_BAD_INPUT);
}

static void test_dumps_roundtrip(void **state)
{
    tcfg_t c, d;
    pd_cfg_result_t r;
    assert_int_equal(load(&c, &r, "--name=with space", "--delta=-7", "--kv-blocks=77",
                          "--verbose", "--ratio=0.125", "--arena=3MiB",
                          "--timeout=1500ms", "--mode=off",
                          "--admin.socket=/run/pd.sock", NULL), PD_OK);
    pd_config_result_free(&r);

    cJSON *j = pd_config_to_json(&schema, &c);
    assert_non_null(j);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    cJSON *p = cJSON_Parse(text);
    assert_non_null(p);
    assert_string_equal(cJSON_GetObjectItem(p, "name")->valuestring, "with space");
    assert_int_equal(cJSON_GetObjectItem(p, "delta")->valuedouble, -7);
    assert_int_equal(cJSON_GetObjectItem(p, "kv-blocks")->valuedouble, 77);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(p, "verbose")));
    assert_int_equal(cJSON_GetObjectItem(p, "arena")->valuedouble, 3 << 20);
    assert_string_equal(cJSON_GetObjectItem(p, "timeout")->valuestring, "1500ms");
    assert_string_equal(cJSON_GetObjectItem(p, "mode")->valuestring, "off");
    assert_string_equal(cJSON_GetObjectItem(p, "admin.socket")->valuestring, "/run/pd.sock");
    cJSON_Delete(p);
    cJSON_free(text);

    char *ini = pd_config_to_ini(&schema, &c);
    assert_non_null(ini);
    char *path = write_file("dump.ini", ini);
    free(ini);
    char *flag;
    assert_true(asprintf(&flag, "--config=%s", path) > 0);
    assert_int_equal(load(&d, &r, flag, NULL), PD_OK);
    assert_string_equal(d.name, c.name);
    assert_int_equal(d.delta, c.delta);
    assert_int_equal(d.kv_blocks, c.kv_blocks);
    assert_int_equal(d.verbose, c.verbose);
    assert_true(d.ratio == c.ratio);
    assert_int_equal(d.arena, c.arena);
    assert_int_equal(d.timeout_ns, c.timeout_ns);
    assert_int_equal(d.mode, c.mode);
    assert_string_equal(d.admin_socket, c.admin_socket);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    pd_config_free(&schema, &d);
    free(flag);
    free(path);

    /* unset string shows as null */
    assert_int_equal(load(&c, &r, NULL), PD_OK);
    j = pd_config_to_json(&schema, &c);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "admin.socket")));
    cJSON_Delete(j);
    char err[256];
    assert_int_equal(pd_config_set(&schema, &c, "nope", "1", NULL, err, sizeof(err)),
                     PD_ERR_NOT_FOUND);
    assert_string_equal(err, "pd-test: --nope: unknown key");
    assert_int_equal(pd_config_set(&schema, &c, "kv-blocks", "5", NULL, err, sizeof(err)),
                     PD_OK);
    assert_int_equal(c.kv_blocks, 5);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
}

static void test_positional_args(void **state)
{
    pd_cfg_schema_t s2 = schema;
    s2.allow_args = true;
    tcfg_t c = { 0 };
    pd_cfg_result_t r;
    char *argv[] = { "pd-test", "a", "--kv-blocks=3", "--", "--b", NULL };
    assert_int_equal(pd_config_load(&s2, &c, 5, argv, &r), PD_OK);
    assert_int_equal(r.n_args, 2);
    assert_string_equal(r.args[0], "a");
    assert_string_equal(r.args[1], "--b");
    assert_int_equal(c.kv_blocks, 3);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
}

/* The real exit statuses, in a child process. */
static int run_child(const char *arg, char *out, size_t out_len)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        tcfg_t c = { 0 };
        pd_cfg_result_t r;
        char *argv[] = { "pd-test", (char *)arg, NULL };
        pd_config_load_or_exit(&schema, &c, 2, argv, &r);
        _exit(42);
    }
    close(pfd[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < out_len && (k = read(pfd[0], out + n, out_len - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = '\0';
    close(pfd[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* Issue 12: a config file must be a regular file of at most 1 MiB (no
 * hang on /dev/urandom or a FIFO); --check-config validates and stops; a
 * daemon that exits early without pd_config_result_free leaks nothing
 * (args is only kept when there are positional arguments). */
static void test_file_kinds_and_check(void **state)
{
    tcfg_t c;
    pd_cfg_result_t r;
    assert_int_equal(load(&c, &r, "--kv-blocks=7", "--name=x", NULL), PD_OK);
    assert_null(r.args);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);

    assert_int_equal(load(&c, &r, "--config=/dev/urandom", NULL), PD_ERR_BAD_INPUT);
    assert_non_null(strstr(r.message, "not a regular file"));
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    char fifo[256];
    snprintf(fifo, sizeof(fifo), "%s/fifo", tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    char *flag;
    assert_true(asprintf(&flag, "--config=%s", fifo) > 0);
    assert_int_equal(load(&c, &r, flag, NULL), PD_ERR_BAD_INPUT); /* at once */
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    free(flag);
    unlink(fifo);
    char *big = malloc((2u << 20) + 1);
    assert_non_null(big);
    memset(big, '#', 2u << 20);
    big[2u << 20] = '\0';
    char *path = write_file("big.ini", big);
    free(big);
    assert_true(asprintf(&flag, "--config=%s", path) > 0);
    assert_int_equal(load(&c, &r, flag, NULL), PD_ERR_BAD_INPUT);
    assert_non_null(strstr(r.message, "larger than 1 MiB"));
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    free(flag);
    free(path);

    assert_int_equal(load(&c, &r, "--check-config", "--kv-blocks=9", NULL), PD_OK);
    assert_int_equal(r.exit_code, PD_CONFIG_EXIT_OK);
    assert_non_null(strstr(r.text, "configuration ok"));
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
    assert_int_equal(load(&c, &r, "--check-config", "--kv-blocks=abc", NULL), PD_ERR_BAD_INPUT);
    assert_int_equal(r.exit_code, 2);
    pd_config_result_free(&r);
    pd_config_free(&schema, &c);
}

static void test_exit_status(void **state)
{
    char out[8192];
    assert_int_equal(run_child("--help", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "usage: pd-test"));
    assert_int_equal(run_child("--version", out, sizeof(out)), 0);
    assert_string_equal(out, "pd-test 9.9\n");
    assert_int_equal(run_child("--kv-blocks=abc", out, sizeof(out)), 2);
    assert_string_equal(out, "pd-test: --kv-blocks: expected an unsigned integer, got \"abc\"\n");
    assert_int_equal(run_child("--what", out, sizeof(out)), 2);
    assert_string_equal(out, "pd-test: unknown flag --what (see --help)\n");
    assert_int_equal(run_child("--kv-blocks=9", out, sizeof(out)), 42);
}

/* pd_boot: the one loopback rule of router and daemons (they differed on
 * "localhost" prefixes before), and the ready file. */
static void test_boot_helpers(void **state)
{
    (void)state;
    static const char *const yes[] = { "127.0.0.1:7000", "127.1.2.3:1", "localhost:80",
                                       "localhost", "[::1]:9000", ":7000", "7000" };
    static const char *const no[] = { "10.1.2.3:7000", "localhostile.example:80",
                                      "0.0.0.0:7000", "[::]:80", "[::1", "example.com",
                                      "128.0.0.1:1" };
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (!pd_addr_is_loopback(yes[i]))
            fail_msg("%s should be loopback", yes[i]);
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        if (pd_addr_is_loopback(no[i]))
            fail_msg("%s should not be loopback", no[i]);
    assert_false(pd_addr_is_loopback(NULL));
    char path[] = "/tmp/pd-ready-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(pd_ready_file_write(path, "{\"pid\":1}"), PD_OK);
    FILE *f = fopen(path, "r");
    char line[64] = "";
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    assert_string_equal(line, "{\"pid\":1}\n");
    unlink(path);
    assert_int_equal(pd_ready_file_write("/nonexistent-dir/ready", "x"), PD_ERR_IO);
}

int main(void)
{
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_precedence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_env_and_file_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parsers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_kinds_and_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dumps_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_positional_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exit_status, setup, teardown),
        cmocka_unit_test(test_boot_helpers),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
