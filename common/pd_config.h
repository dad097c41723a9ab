/* pd_config.h - one table per daemon drives CLI flags, env vars, the INI
 * file, --help, --version and `config show` (UCX config tables, nginx
 * ngx_command_t).
 *
 * This header also pulls in the generated build flags (PD_VERSION,
 * PD_HAVE_JEMALLOC, PD_SANITIZE, PD_DEBUG_POISON) from pd_build_config.h,
 * so `#include "pd_config.h"` is the one include for both.
 *
 * Keys are flat, lower-case, words joined with '-'; a '.' groups keys
 * ("admin.socket"). Sources, highest precedence first:
 *   1. CLI   --key=value, --key value; bools also --key / --no-key
 *   2. env   <env_prefix><KEY>, prefix default "PD_", key upper-cased with
 *            '-' and '.' turned into '_'  (admin.socket -> PD_ADMIN_SOCKET)
 *   3. file  --config FILE (or env <prefix>CONFIG), INI parsed by inih:
 *            `key = value` before any section is key "key"; inside
 *            `[admin]`, `socket = x` is key "admin.socket".
 *   4. the table's default text.
 * Values are stored into a caller struct at `offset`; storage per type:
 *   STRING   char *      (owned by the struct; pd_config_free releases)
 *   INT      int64_t     UINT uint64_t    BOOL bool    DOUBLE double
 *   SIZE     uint64_t    bytes; "4096", "64KiB", "64MiB", "1G", "2GB"
 *                        (K/M/G/T, with or without "iB"/"B", all powers of 2)
 *   DURATION uint64_t    nanoseconds; "500ms", "30s", "2m", "1h", "250us",
 *                        "10ns"; a bare number means seconds
 *   ENUM     int         index into enum_values
 * Errors produce ONE line naming the key and the source, e.g.
 *   pd-prefill: --kv-blocks: expected an unsigned integer, got "abc"
 * and exit status 2 (PD_CONFIG_EXIT_USAGE). */
#ifndef PD_CONFIG_H
#define PD_CONFIG_H

#include "pd_build_config.h"
#include "pd_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

typedef enum {
    PD_CFG_STRING,
    PD_CFG_INT,
    PD_CFG_UINT,
    PD_CFG_BOOL,
    PD_CFG_DOUBLE,
    PD_CFG_SIZE,
    PD_CFG_DURATION,
    PD_CFG_ENUM,
} pd_cfg_type_t;

/* One row of a config table. Tables end with a row whose name is NULL. */
typedef struct {
    const char *name;                /* "kv-blocks", "admin.socket" */
    pd_cfg_type_t type;
    const char *def;                 /* default as text; NULL = unset
                                        (NULL string, 0, false) */
    const char *help;                /* one line for --help */
    size_t offset;                   /* offsetof(target struct, field) */
    double min, max;                 /* numeric bounds (inclusive) for
                                        INT/UINT/DOUBLE/SIZE/DURATION;
                                        min == max == 0 means unbounded.
                                        SIZE/DURATION bounds in bytes/ns. */
    const char *const *enum_values;  /* ENUM: NULL-terminated names */
} pd_cfg_field_t;

/* Row helper: PD_CFG_ROW(pf_config_t, kv_blocks, "kv-blocks", UINT, "1024",
 *                        "KV blocks in the arena", 1, 1e9, NULL) */
#define PD_CFG_ROW(stype, field, key, type, def, help, min, max, enums)       \
    { (key), PD_CFG_##type, (def), (help), offsetof(stype, field),            \
      (min), (max), (enums) }
#define PD_CFG_END { NULL, PD_CFG_STRING, NULL, NULL, 0, 0, 0, NULL }

typedef struct {
    const char *prog;                /* "pd-prefill": prefix of every message */
    const char *summary;             /* one line under "usage:" in --help */
    const char *version;             /* --version text; NULL = PD_VERSION */
    const char *env_prefix;          /* NULL = "PD_" */
    const pd_cfg_field_t *fields;    /* ends with PD_CFG_END */
    bool allow_args;                 /* positional arguments accepted */
    /* Checks across keys or of what a value names (a secret file), run by
     * --check-config after every key passed its own, so it refuses what the
     * daemon would refuse at boot. PD_OK, or an error with the line (no
     * prog prefix) in err. NULL: none. */
    pd_status_t (*check)(const void *target, char *err, size_t err_len);
} pd_cfg_schema_t;

#define PD_CONFIG_RUN        (-1)    /* go on running */
#define PD_CONFIG_EXIT_OK      0     /* --help / --version printed */
#define PD_CONFIG_EXIT_USAGE   2     /* bad flag, key or value */

typedef struct {
    int exit_code;          /* PD_CONFIG_RUN / _EXIT_OK / _EXIT_USAGE */
    char *text;             /* EXIT_OK: text for stdout (owned, malloc) */
    char message[512];      /* EXIT_USAGE: the one error line, no '\n' */
    int n_args;             /* positional arguments (allow_args) */
    char **args;            /* pointers into argv; owned array */
    const char *config_path;/* the --config file used, or NULL */
} pd_cfg_result_t;

/* Load defaults, the INI file, env and CLI (in that order, so later wins)
 * into `target` (zeroed by the caller or by an earlier pd_config_free).
 * Always fills *res; free it with pd_config_result_free. Returns PD_OK when
 * res->exit_code says RUN or EXIT_OK, PD_ERR_BAD_INPUT on a usage error
 * (res->message names the key), PD_ERR_IO if the file cannot be read,
 * PD_ERR_NO_MEMORY. A schema error (bad default) is PD_ERR_INTERNAL.
 * Never exits, never prints. */
pd_status_t pd_config_load(const pd_cfg_schema_t *schema, void *target,
                           int argc, char **argv, pd_cfg_result_t *res);
void pd_config_result_free(pd_cfg_result_t *res);

/* Daemon convenience: pd_config_load, then print help/version to stdout
 * and exit(0), or print the message to stderr and exit(2). Returns only
 * when the daemon should run; res is then owned by the caller. */
void pd_config_load_or_exit(const pd_cfg_schema_t *schema, void *target,
                            int argc, char **argv, pd_cfg_result_t *res);

/* Set one key from text (as a CLI/env/file value would). `source` names
 * the origin in messages (e.g. "--kv-blocks"; NULL = "--<key>").
 * PD_ERR_NOT_FOUND (unknown key) or PD_ERR_BAD_INPUT (bad value), with
 * "prog: source: reason" in err (may be NULL). */
pd_status_t pd_config_set(const pd_cfg_schema_t *schema, void *target,
                          const char *key, const char *value,
                          const char *source, char *err, size_t err_len);

/* Find a row by key, NULL if absent. */
const pd_cfg_field_t *pd_config_find(const pd_cfg_schema_t *schema,
                                     const char *key);

/* Free the STRING fields of target (sets them to NULL). NULL-safe. */
void pd_config_free(const pd_cfg_schema_t *schema, void *target);

/* --help text (malloc'd; NULL on ENOMEM). */
char *pd_config_help(const pd_cfg_schema_t *schema);

/* Effective config as a JSON object {key: value}: numbers for
 * INT/UINT/DOUBLE/SIZE (bytes), DURATION as text ("1500ms", re-parsable),
 * ENUM/STRING as strings (unset string: null), BOOL as bools.
 * NULL on ENOMEM. */
struct cJSON *pd_config_to_json(const pd_cfg_schema_t *schema,
                                const void *target);

/* Effective config as INI text that pd_config_load reads back to the same
 * values (malloc'd; NULL on ENOMEM). */
char *pd_config_to_ini(const pd_cfg_schema_t *schema, const void *target);

/* Value parsers shared with other modules (pdctl, admin `set` commands).
 * PD_ERR_BAD_INPUT on bad text or overflow. */
pd_status_t pd_parse_size(const char *text, uint64_t *bytes_p);
pd_status_t pd_parse_duration(const char *text, uint64_t *ns_p);
pd_status_t pd_parse_bool(const char *text, bool *value_p);
/* Format ns as "1.5s", "250ms", "2m", ... into buf; returns buf. */
const char *pd_format_duration(uint64_t ns, char *buf, size_t len);

#endif
