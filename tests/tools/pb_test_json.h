/* pb_test_json.h - the pd-bench tests' reading of its --out JSON report
 * (test_pb_run.c, test_pb_work.c, test_pb_e2e.c). Include after cmocka.h
 * and cJSON. */
#ifndef PB_TEST_JSON_H
#define PB_TEST_JSON_H

#include <stdio.h>
#include <stdlib.h>

/* The whole file parsed (fails the test when it cannot be). */
static inline cJSON *load_json(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf;
    long n;
    cJSON *j;

    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    j = cJSON_Parse(buf);
    free(buf);
    assert_non_null(j);
    return j;
}

/* A number member of o (fails the test when it is missing or not one). */
static inline double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        fail_msg("JSON key %s is not a number", key);
    return v->valuedouble;
}

#endif
