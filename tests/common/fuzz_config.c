/* fuzz_config.c - config value parsing: the input is split at '\n' into
 * values; each is set on every key of a table covering all types (as a
 * CLI/env/file value would be), then the config is dumped as JSON and INI
 * and the INI is loaded back. */
#include "pd_config.h"

#include <cjson/cJSON.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *s;
    int64_t i;
    uint64_t u;
    bool b;
    double d;
    uint64_t size, dur;
    int e;
} fcfg_t;

static const char *const enums[] = { "a", "bb", "ccc", NULL };
static const pd_cfg_field_t fields[] = {
    PD_CFG_ROW(fcfg_t, s, "s", STRING, "x", "", 0, 0, NULL),
    PD_CFG_ROW(fcfg_t, i, "i", INT, "0", "", -1000, 1000, NULL),
    PD_CFG_ROW(fcfg_t, u, "u", UINT, "0", "", 0, 0, NULL),
    PD_CFG_ROW(fcfg_t, b, "b", BOOL, "false", "", 0, 0, NULL),
    PD_CFG_ROW(fcfg_t, d, "d", DOUBLE, "0", "", 0, 0, NULL),
    PD_CFG_ROW(fcfg_t, size, "size", SIZE, "1K", "", 0, 0, NULL),
    PD_CFG_ROW(fcfg_t, dur, "dur", DURATION, "1s", "", 0, 0, NULL),
    PD_CFG_ROW(fcfg_t, e, "e", ENUM, "a", "", 0, 0, enums),
    PD_CFG_END
};
static const pd_cfg_schema_t schema = { .prog = "fuzz", .fields = fields };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    fcfg_t c = { 0 };
    pd_cfg_result_t r;
    char *argv[] = { "fuzz", NULL };
    if (pd_config_load(&schema, &c, 1, argv, &r) != PD_OK)
        abort();
    pd_config_result_free(&r);
    char err[512];
    char *save = NULL;
    for (char *v = strtok_r(text, "\n", &save); v; v = strtok_r(NULL, "\n", &save)) {
        for (const pd_cfg_field_t *f = fields; f->name; f++)
            pd_config_set(&schema, &c, f->name, v, NULL, err, sizeof(err));
        uint64_t x;
        pd_parse_size(v, &x);
        pd_parse_duration(v, &x);
    }
    cJSON *j = pd_config_to_json(&schema, &c);
    char *js = cJSON_PrintUnformatted(j);
    cJSON *back = js ? cJSON_Parse(js) : NULL;
    if (back == NULL)
        abort(); /* the dump must always be valid JSON */
    cJSON_Delete(back);
    cJSON_free(js);
    cJSON_Delete(j);
    /* INI dump loads back (strings with newlines or ';' may not round
     * trip, so only the load's safety is checked) */
    char *ini = pd_config_to_ini(&schema, &c);
    char tmpl[] = "/tmp/pd-fuzz-cfg-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd >= 0 && ini != NULL) {
        if (write(fd, ini, strlen(ini)) < 0)
            abort();
        close(fd);
        char flag[64];
        snprintf(flag, sizeof(flag), "--config=%s", tmpl);
        char *argv2[] = { "fuzz", flag, NULL };
        fcfg_t d = { 0 };
        pd_config_load(&schema, &d, 2, argv2, &r);
        pd_config_result_free(&r);
        pd_config_free(&schema, &d);
        unlink(tmpl);
    }
    free(ini);
    pd_config_free(&schema, &c);
    free(text);
    return 0;
}
