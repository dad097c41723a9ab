/* test_log.c - pd_log's two line formats: text (escaped, one line per
 * call) and log.format = json (one object per line that a JSON parser
 * reads back, key=value words as fields, every byte of client text kept
 * inside its string). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "pd_log.h"

static char path[] = "/tmp/pd-test-log-XXXXXX";

/* the lines written since the last call, as one string */
static char *drain(void)
{
    static long off;
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, off, SEEK_SET);
    char *b = calloc(1, (size_t)(end - off) + 1);
    assert_int_equal(fread(b, 1, (size_t)(end - off), f), (size_t)(end - off));
    fclose(f);
    off = end;
    return b;
}

static int setup(void **st)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(pd_log_open(path), PD_OK);
    pd_log_set_level(PD_LOG_INFO);
    return 0;
}

static int teardown(void **st)
{
    pd_log_close();
    unlink(path);
    return 0;
}

static void test_text(void **st)
{
    pd_log_set_format(PD_LOG_FORMAT_TEXT);
    pd_log(PD_LOG_WARN, "router", "r\n1", "evil\nINFO forged\x1b[2J k=v");
    char *b = drain();
    assert_int_equal(strchr(b, '\n') - b + 1, (long)strlen(b)); /* one line */
    assert_non_null(strstr(b, " warn  router [req=r\\n1] evil\\nINFO forged\\x1b[2J k=v\n"));
    free(b);
}

static void test_json(void **st)
{
    pd_log_set_format(PD_LOG_FORMAT_JSON);
    pd_log(PD_LOG_INFO, "router", "req-\"7\"",
           "access client=127.0.0.1:5 status=200 ttft_ms=12.5 total_ms=-1.0 prefill=p0 "
           "odd=01 msg=shadowed x=\"q\\ bad=\xff\xfe utf8=\xc3\xa9\xe2\x82\xac ctl=\x01");
    char *b = drain();
    assert_int_equal(strchr(b, '\n') - b + 1, (long)strlen(b));
    cJSON *j = cJSON_Parse(b);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "level")->valuestring, "info");
    assert_string_equal(cJSON_GetObjectItem(j, "comp")->valuestring, "router");
    assert_string_equal(cJSON_GetObjectItem(j, "req")->valuestring, "req-\"7\"");
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "mono")));
    assert_int_equal(strlen(cJSON_GetObjectItem(j, "ts")->valuestring), 27);
    /* the words as fields: numbers as numbers, the rest as strings */
    assert_string_equal(cJSON_GetObjectItem(j, "client")->valuestring, "127.0.0.1:5");
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "status")));
    assert_int_equal(cJSON_GetObjectItem(j, "status")->valueint, 200);
    assert_true(cJSON_GetObjectItem(j, "ttft_ms")->valuedouble == 12.5);
    assert_true(cJSON_GetObjectItem(j, "total_ms")->valuedouble == -1.0);
    assert_string_equal(cJSON_GetObjectItem(j, "odd")->valuestring, "01");
    assert_string_equal(cJSON_GetObjectItem(j, "x")->valuestring, "\"q\\");
    assert_string_equal(cJSON_GetObjectItem(j, "bad")->valuestring, "\xef\xbf\xbd\xef\xbf\xbd");
    assert_string_equal(cJSON_GetObjectItem(j, "utf8")->valuestring, "\xc3\xa9\xe2\x82\xac");
    assert_string_equal(cJSON_GetObjectItem(j, "ctl")->valuestring, "\x01");
    /* a key that would shadow a fixed field stays in msg only */
    const char *msg = cJSON_GetObjectItem(j, "msg")->valuestring;
    assert_non_null(strstr(msg, "msg=shadowed"));
    assert_non_null(strstr(msg, "access client="));
    int n_msg = 0;
    for (cJSON *c = j->child; c != NULL; c = c->next)
        n_msg += strcmp(c->string, "msg") == 0;
    assert_int_equal(n_msg, 1);
    cJSON_Delete(j);
    free(b);
}

/* the longest message, all of it needing escapes, many fields: still one
 * line of valid JSON (cut, never broken) */
static void test_json_long(void **st)
{
    pd_log_set_format(PD_LOG_FORMAT_JSON);
    char big[4096];
    size_t k = 0;
    while (k + 8 < sizeof(big)) {
        memcpy(big + k, "k=\x01\x02\x03 ", 6);
        k += 6;
    }
    big[k] = '\0';
    pd_log(PD_LOG_ERROR, "x", NULL, "%s", big);
    char *b = drain();
    assert_int_equal(strchr(b, '\n') - b + 1, (long)strlen(b));
    cJSON *j = cJSON_Parse(b);
    assert_non_null(j);
    assert_null(cJSON_GetObjectItem(j, "req"));
    cJSON_Delete(j);
    free(b);
    pd_log_set_format(PD_LOG_FORMAT_TEXT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_json_long),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
