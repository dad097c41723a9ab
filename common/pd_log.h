/* pd_log.h - leveled logging with wall + monotonic timestamps, a component
 * and an optional request id. One line per call, written with one write(2)
 * so lines from several threads never interleave. Target: stderr (default)
 * or a file; the level can be changed at run time (admin `log level`).
 * Every field is escaped (pd_log_escape) at every level: client bytes in a
 * message cannot start a line of their own or carry terminal escapes.
 *
 * Libraries (common, proto, kvxfer, engine) log at DEBUG/TRACE only and
 * return statuses; daemons decide what the operator sees. */
#ifndef PD_LOG_H
#define PD_LOG_H

#include <stdatomic.h>
#include <stddef.h>
#include "pd_status.h"

typedef enum {
    PD_LOG_ERROR = 0,
    PD_LOG_WARN  = 1,
    PD_LOG_INFO  = 2,
    PD_LOG_DEBUG = 3,
    PD_LOG_TRACE = 4,
} pd_log_level_t;

extern _Atomic int pd_log_level_g;

/* Open `path` for appending as the log target (NULL or "-" = stderr).
 * Expected errors: PD_ERR_IO (cannot open). */
pd_status_t pd_log_open(const char *path);
/* Open the path given to pd_log_open again (logrotate moved the file:
 * SIGHUP, pd_loop). No-op for stderr; on failure the old file stays.
 * Expected errors: PD_ERR_IO. */
pd_status_t pd_log_reopen(void);
void pd_log_close(void);
void pd_log_set_level(pd_log_level_t level);
pd_log_level_t pd_log_get_level(void);
/* "error|warn|info|debug|trace" -> level. PD_ERR_BAD_INPUT otherwise. */
pd_status_t pd_log_level_parse(const char *text, pd_log_level_t *level_p);

/* Line format (log.format): text (the default, below) or json: one object
 * per line {"ts","mono","level","comp","req"?,"msg"} plus every
 * "key=value" word of the message as its own field (a number when it is
 * one), so logfmt-style lines (the router's access line) are structured. */
typedef enum { PD_LOG_FORMAT_TEXT = 0, PD_LOG_FORMAT_JSON = 1 } pd_log_format_t;
extern const char *const pd_log_format_names[]; /* for the config ENUM row */
void pd_log_set_format(pd_log_format_t f);

/* A daemon's log at boot: set the level named by `level` and the format,
 * and open `file` (NULL: stderr). PD_ERR_BAD_INPUT with one line on stderr
 * naming prog and the option. */
pd_status_t pd_log_boot(const char *prog, const char *level, int format, const char *file);
const char *pd_log_level_name(pd_log_level_t level);

/* Copies n bytes of in to out (cap > 0, always NUL-terminated) so that
 * they cannot end or forge a log line or drive a terminal: control bytes
 * (< 0x20, 0x7f) become \n, \r, \t or \xNN, C1 controls in UTF-8
 * (0xc2 0x80-0x9f) \u00NN. Returns the length written (cut short at cap,
 * never inside an escape). pd_log_write applies it to every line's request
 * id and message, so callers may log client bytes as they are. */
size_t pd_log_escape(const char *in, size_t n, char *out, size_t cap);

void pd_log_write(pd_log_level_t level, const char *component,
                  const char *request_id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define pd_log(level, component, request_id, ...)                             \
    do {                                                                      \
        if ((int)(level) <= atomic_load_explicit(&pd_log_level_g,             \
                                                 memory_order_relaxed))       \
            pd_log_write((level), (component), (request_id), __VA_ARGS__);    \
    } while (0)

#define PD_LOG_ERR(comp, ...)   pd_log(PD_LOG_ERROR, comp, NULL, __VA_ARGS__)
#define PD_LOG_WARN(comp, ...)  pd_log(PD_LOG_WARN, comp, NULL, __VA_ARGS__)
#define PD_LOG_INFO(comp, ...)  pd_log(PD_LOG_INFO, comp, NULL, __VA_ARGS__)
#define PD_LOG_DEBUG(comp, ...) pd_log(PD_LOG_DEBUG, comp, NULL, __VA_ARGS__)
#define PD_LOG_TRACE(comp, ...) pd_log(PD_LOG_TRACE, comp, NULL, __VA_ARGS__)

#endif
