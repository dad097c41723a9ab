/* pd_config.c - config tables: defaults < INI file < env < CLI. */
#include "pd_config.h"
#include "pd_sbuf.h"
#include "pd_time.h"

#include <cjson/cJSON.h>
#include <ini.h>

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

/* ---- value parsers ---------------------------------------------------- */

pd_status_t pd_parse_bool(const char *text, bool *value_p)
{
    static const char *const yes[] = { "true", "yes", "on", "1" };
    static const char *const no[] = { "false", "no", "off", "0" };
    if (text == NULL)
        return PD_ERR_BAD_INPUT;
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *value_p = true;
            return PD_OK;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *value_p = false;
            return PD_OK;
        }
    }
    return PD_ERR_BAD_INPUT;
}

/* Parse "<digits>[.<digits>]" at *s; advance *s. Integer part exact. */
static pd_status_t parse_decimal(const char **s, uint64_t *int_p, double *frac_p)
{
    const char *p = *s;
    if (!isdigit((unsigned char)*p))
        return PD_ERR_BAD_INPUT;
    uint64_t v = 0;
    while (isdigit((unsigned char)*p)) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return PD_ERR_BAD_INPUT;
        v = v * 10 + d;
        p++;
    }
    double frac = 0, scale = 0.1;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return PD_ERR_BAD_INPUT;
        while (isdigit((unsigned char)*p)) {
            frac += (*p - '0') * scale;
            scale /= 10;
            p++;
        }
    }
    *s = p;
    *int_p = v;
    *frac_p = frac;
    return PD_OK;
}

static pd_status_t scale_checked(uint64_t ipart, double frac, uint64_t mult,
                                 uint64_t *out_p)
{
    if (mult != 0 && ipart > UINT64_MAX / mult)
        return PD_ERR_BAD_INPUT;
    uint64_t v = ipart * mult;
    double f = frac * (double)mult;
    if (f >= 18446744073709551615.0 - (double)v)
        return PD_ERR_BAD_INPUT;
    *out_p = v + (uint64_t)f;
    return PD_OK;
}

pd_status_t pd_parse_size(const char *text, uint64_t *bytes_p)
{
    static const struct { const char *suffix; unsigned shift; } units[] = {
        { "", 0 },    { "b", 0 },
        { "k", 10 },  { "kb", 10 }, { "kib", 10 },
        { "m", 20 },  { "mb", 20 }, { "mib", 20 },
        { "g", 30 },  { "gb", 30 }, { "gib", 30 },
        { "t", 40 },  { "tb", 40 }, { "tib", 40 },
    };
    if (text == NULL)
        return PD_ERR_BAD_INPUT;
    const char *p = text;
    uint64_t ipart;
    double frac;
    if (parse_decimal(&p, &ipart, &frac) != PD_OK)
        return PD_ERR_BAD_INPUT;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(p, units[i].suffix) == 0)
            return scale_checked(ipart, frac, 1ULL << units[i].shift, bytes_p);
    }
    return PD_ERR_BAD_INPUT;
}

pd_status_t pd_parse_duration(const char *text, uint64_t *ns_p)
{
    static const struct { const char *unit; uint64_t ns; } units[] = {
        /* longest first so "ms" is not read as "m" + "s" */
        { "ns", 1 }, { "us", PD_NS_PER_US }, { "ms", PD_NS_PER_MS },
        { "s", PD_NS_PER_S }, { "m", 60 * PD_NS_PER_S },
        { "h", 3600 * PD_NS_PER_S }, { "d", 86400 * PD_NS_PER_S },
    };
    if (text == NULL || *text == '\0')
        return PD_ERR_BAD_INPUT;
    if (strspn(text, "0123456789.") == strlen(text)) {
        /* a bare number means seconds */
        const char *q = text;
        uint64_t ipart;
        double frac;
        if (parse_decimal(&q, &ipart, &frac) != PD_OK || *q != '\0')
            return PD_ERR_BAD_INPUT;
        return scale_checked(ipart, frac, PD_NS_PER_S, ns_p);
    }
    const char *p = text;
    uint64_t total = 0;
    while (*p != '\0') {
        uint64_t ipart, part;
        double frac;
        if (parse_decimal(&p, &ipart, &frac) != PD_OK)
            return PD_ERR_BAD_INPUT;
        size_t ulen = 0;
        while (isalpha((unsigned char)p[ulen]))
            ulen++;
        uint64_t mult = 0;
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
            if (strlen(units[i].unit) == ulen &&
                strncasecmp(p, units[i].unit, ulen) == 0)
                mult = units[i].ns;
        }
        if (mult == 0)
            return PD_ERR_BAD_INPUT;
        p += ulen;
        if (scale_checked(ipart, frac, mult, &part) != PD_OK ||
            part > UINT64_MAX - total)
            return PD_ERR_BAD_INPUT;
        total += part;
    }
    *ns_p = total;
    return PD_OK;
}

const char *pd_format_duration(uint64_t ns, char *buf, size_t len)
{
    static const struct { const char *unit; uint64_t ns; } units[] = {
        { "h", 3600 * PD_NS_PER_S }, { "m", 60 * PD_NS_PER_S },
        { "s", PD_NS_PER_S }, { "ms", PD_NS_PER_MS }, { "us", PD_NS_PER_US },
    };
    if (ns != 0) {
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
            if (ns % units[i].ns == 0) {
                snprintf(buf, len, "%llu%s",
                         (unsigned long long)(ns / units[i].ns), units[i].unit);
                return buf;
            }
        }
    }
    snprintf(buf, len, "%lluns", (unsigned long long)ns);
    return buf;
}

/* ---- table access ----------------------------------------------------- */

static void *field_ptr(void *target, const pd_cfg_field_t *f)
{
    return (char *)target + f->offset;
}

static const void *field_cptr(const void *target, const pd_cfg_field_t *f)
{
    return (const char *)target + f->offset;
}

const pd_cfg_field_t *pd_config_find(const pd_cfg_schema_t *schema,
                                     const char *key)
{
    for (const pd_cfg_field_t *f = schema->fields; f->name != NULL; f++) {
        if (strcmp(f->name, key) == 0)
            return f;
    }
    return NULL;
}

static const char *type_name(pd_cfg_type_t t)
{
    switch (t) {
    case PD_CFG_STRING:   return "STRING";
    case PD_CFG_INT:      return "INT";
    case PD_CFG_UINT:     return "UINT";
    case PD_CFG_BOOL:     return "BOOL";
    case PD_CFG_DOUBLE:   return "NUM";
    case PD_CFG_SIZE:     return "SIZE";
    case PD_CFG_DURATION: return "DURATION";
    case PD_CFG_ENUM:     return "ENUM";
    }
    return "?";
}

static const char *expected_text(const pd_cfg_field_t *f)
{
    switch (f->type) {
    case PD_CFG_STRING:   return "a string";
    case PD_CFG_INT:      return "an integer";
    case PD_CFG_UINT:     return "an unsigned integer";
    case PD_CFG_BOOL:     return "true or false";
    case PD_CFG_DOUBLE:   return "a number";
    case PD_CFG_SIZE:     return "a size like 4096, 64KiB, 64MiB or 1G";
    case PD_CFG_DURATION: return "a duration like 500ms, 30s or 2m";
    case PD_CFG_ENUM:     return "one of";
    }
    return "?";
}

static bool has_range(const pd_cfg_field_t *f)
{
    return !(f->min == 0 && f->max == 0);
}

static void enum_list(const pd_cfg_field_t *f, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; f->enum_values && f->enum_values[i]; i++) {
        int n = snprintf(buf + off, len - off, "%s%s", i ? "|" : "",
                         f->enum_values[i]);
        if (n < 0 || (size_t)n >= len - off)
            break;
        off += (size_t)n;
    }
}

/* A numeric value: `num` for the range check, the exact value for the
 * store (i for INT, u for UINT/SIZE/DURATION, num for DOUBLE). */
typedef struct {
    double num;
    int64_t i;
    uint64_t u;
} cfg_num_t;

static bool parse_num(pd_cfg_type_t type, const char *text, cfg_num_t *v)
{
    char *end;

    memset(v, 0, sizeof(*v));
    errno = 0;
    switch (type) {
    case PD_CFG_INT:
        v->i = strtoll(text, &end, 10);
        v->num = (double)v->i;
        return errno == 0 && end != text && *end == '\0' &&
               !isspace((unsigned char)text[0]);
    case PD_CFG_UINT:
        if (!isdigit((unsigned char)text[0]))
            return false;
        v->u = strtoull(text, &end, 10);
        v->num = (double)v->u;
        return errno == 0 && *end == '\0';
    case PD_CFG_DOUBLE:
        v->num = strtod(text, &end);
        return errno == 0 && end != text && *end == '\0' && isfinite(v->num) &&
               !isspace((unsigned char)text[0]);
    case PD_CFG_SIZE:
        if (pd_parse_size(text, &v->u) != PD_OK)
            return false;
        v->num = (double)v->u;
        return true;
    case PD_CFG_DURATION:
        if (pd_parse_duration(text, &v->u) != PD_OK)
            return false;
        v->num = (double)v->u;
        return true;
    default:
        return false;
    }
}

/* Parse `text` for field f and store it. On error fill err with
 * "prog: source: reason". */
static pd_status_t set_field(const pd_cfg_schema_t *schema, void *target,
                             const pd_cfg_field_t *f, const char *text,
                             const char *source, char *err, size_t err_len)
{
    void *p = field_ptr(target, f);
    char reason[384];

    if (text == NULL)
        text = "";
    switch (f->type) {
    case PD_CFG_STRING: {
        char *copy = strdup(text);
        if (copy == NULL)
            return PD_ERR_NO_MEMORY;
        free(*(char **)p);
        *(char **)p = copy;
        return PD_OK;
    }
    case PD_CFG_INT:
    case PD_CFG_UINT:
    case PD_CFG_DOUBLE:
    case PD_CFG_SIZE:
    case PD_CFG_DURATION: {
        cfg_num_t v;
        if (!parse_num(f->type, text, &v))
            goto bad_value;
        if (has_range(f) && (v.num < f->min || v.num > f->max))
            goto bad_range;
        if (f->type == PD_CFG_INT)
            *(int64_t *)p = v.i;
        else if (f->type == PD_CFG_DOUBLE)
            *(double *)p = v.num;
        else
            *(uint64_t *)p = v.u;
        return PD_OK;
    }
    case PD_CFG_BOOL:
        if (pd_parse_bool(text, (bool *)p) != PD_OK)
            goto bad_value;
        return PD_OK;
    case PD_CFG_ENUM:
        for (int i = 0; f->enum_values && f->enum_values[i]; i++) {
            if (strcasecmp(text, f->enum_values[i]) == 0) {
                *(int *)p = i;
                return PD_OK;
            }
        }
        {
            char list[256];
            enum_list(f, list, sizeof(list));
            snprintf(reason, sizeof(reason), "expected one of %s, got \"%.64s\"",
                     list, text);
        }
        goto fail;
    }
    snprintf(reason, sizeof(reason), "unsupported type");
    goto fail;

bad_value:
    snprintf(reason, sizeof(reason), "expected %s, got \"%.64s\"",
             expected_text(f), text);
    goto fail;
bad_range:
    if (f->type == PD_CFG_DURATION) {
        char a[32], b[32];
        snprintf(reason, sizeof(reason), "%.64s is out of range [%s, %s]", text,
                 pd_format_duration((uint64_t)f->min, a, sizeof(a)),
                 pd_format_duration((uint64_t)f->max, b, sizeof(b)));
    } else {
        snprintf(reason, sizeof(reason), "%.64s is out of range [%.15g, %.15g]",
                 text, f->min, f->max);
    }
fail:
    if (err != NULL && err_len > 0)
        snprintf(err, err_len, "%s: %s: %s",
                 schema->prog ? schema->prog : "pdserve", source, reason);
    return PD_ERR_BAD_INPUT;
}

pd_status_t pd_config_set(const pd_cfg_schema_t *schema, void *target,
                          const char *key, const char *value,
                          const char *source, char *err, size_t err_len)
{
    char src[160];
    const pd_cfg_field_t *f = pd_config_find(schema, key);
    if (source == NULL) {
        snprintf(src, sizeof(src), "--%s", key);
        source = src;
    }
    if (f == NULL) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "%s: %s: unknown key",
                     schema->prog ? schema->prog : "pdserve", source);
        return PD_ERR_NOT_FOUND;
    }
    return set_field(schema, target, f, value, source, err, err_len);
}

void pd_config_free(const pd_cfg_schema_t *schema, void *target)
{
    if (schema == NULL || target == NULL)
        return;
    for (const pd_cfg_field_t *f = schema->fields; f->name != NULL; f++) {
        if (f->type == PD_CFG_STRING) {
            char **sp = field_ptr(target, f);
            free(*sp);
            *sp = NULL;
        }
    }
}

/* ---- sources ---------------------------------------------------------- */

static const char *env_prefix(const pd_cfg_schema_t *schema)
{
    return schema->env_prefix ? schema->env_prefix : "PD_";
}

static void env_name(const pd_cfg_schema_t *schema, const char *key,
                     char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s", env_prefix(schema));
    size_t off = n < 0 ? 0 : (size_t)n;
    for (const char *k = key; *k && off + 1 < len; k++)
        buf[off++] = (*k == '-' || *k == '.') ? '_' : (char)toupper((unsigned char)*k);
    buf[off < len ? off : len - 1] = '\0';
}

typedef struct {
    const pd_cfg_schema_t *schema;
    void *target;
    const char *path;
    pd_status_t status;   /* first error */
    char err[512];
    int nomem;
} ini_ctx_t;

static int ini_cb(void *user, const char *section, const char *name,
                  const char *value)
{
    ini_ctx_t *ctx = user;
    char key[256], src[384];
    if (ctx->status != PD_OK)
        return 1; /* keep only the first error; inih reports its line */
    if (section != NULL && section[0] != '\0')
        snprintf(key, sizeof(key), "%s.%s", section, name);
    else
        snprintf(key, sizeof(key), "%s", name);
    snprintf(src, sizeof(src), "%s: %s", ctx->path, key);
    const pd_cfg_field_t *f = pd_config_find(ctx->schema, key);
    if (f == NULL) {
        snprintf(ctx->err, sizeof(ctx->err), "unknown key \"%s\"", key);
        ctx->status = PD_ERR_BAD_INPUT;
        return 0;
    }
    char err[512];
    pd_status_t s = set_field(ctx->schema, ctx->target, f, value, key, err,
                              sizeof(err));
    if (s != PD_OK) {
        /* drop the "prog: " prefix, it is added with the line number */
        const char *reason = strchr(err, ':');
        snprintf(ctx->err, sizeof(ctx->err), "%s", reason ? reason + 2 : err);
        ctx->status = s;
        return 0;
    }
    return 1;
}

#define PD_CONFIG_FILE_MAX (1 << 20)

static pd_status_t load_file(const pd_cfg_schema_t *schema, void *target,
                             const char *path, pd_cfg_result_t *res)
{
    ini_ctx_t ctx = { .schema = schema, .target = target, .path = path,
                      .status = PD_OK };
    const char *prog = schema->prog ? schema->prog : "pdserve";
    /* a regular file of bounded size: --config=/dev/urandom or a FIFO
     * must not hang or eat memory */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY); /* FIFOs: no wait */
    FILE *fp = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (fp == NULL) {
        if (fd >= 0)
            close(fd);
        snprintf(res->message, sizeof(res->message), "%s: --config: cannot open \"%s\"",
                 prog, path);
        return PD_ERR_IO;
    }
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_size > PD_CONFIG_FILE_MAX) {
        bool reg = S_ISREG(sb.st_mode);
        fclose(fp);
        snprintf(res->message, sizeof(res->message),
                 "%s: --config: \"%s\" is %s", prog, path,
                 reg ? "larger than 1 MiB" : "not a regular file");
        return PD_ERR_BAD_INPUT;
    }
    int line = ini_parse_file(fp, ini_cb, &ctx);
    fclose(fp);
    if (line < 0) {
        snprintf(res->message, sizeof(res->message), "%s: --config: cannot %s \"%s\"",
                 prog, line == -1 ? "open" : "read", path);
        return line == -1 ? PD_ERR_IO : PD_ERR_NO_MEMORY;
    }
    if (line > 0) {
        if (ctx.status == PD_OK)
            snprintf(ctx.err, sizeof(ctx.err), "syntax error");
        snprintf(res->message, sizeof(res->message), "%.64s: %.200s:%d: %.200s",
                 prog, path, line, ctx.err);
        return ctx.status == PD_ERR_NO_MEMORY ? PD_ERR_NO_MEMORY : PD_ERR_BAD_INPUT;
    }
    return PD_OK;
}

char *pd_config_help(const pd_cfg_schema_t *schema)
{
    pd_sbuf_t sb = PD_SBUF_INIT;
    const char *prog = schema->prog ? schema->prog : "pdserve";
    char envv[160];
    pd_sbuf_printf(&sb, "usage: %s [--config FILE] [--key=value ...]%s\n", prog,
              schema->allow_args ? " [ARG ...]" : "");
    if (schema->summary)
        pd_sbuf_printf(&sb, "%s\n", schema->summary);
    pd_sbuf_printf(&sb, "\nEvery key can also be set as env %s<KEY> (upper case, "
                   "'-' and '.' -> '_')\nor in the INI file (`key = value`, or "
                   "`[section]` + `key` for \"section.key\").\n"
                   "Precedence: flag > env > file > default.\n\n",
              env_prefix(schema));
    pd_sbuf_printf(&sb, "  %-34s %s\n", "-h, --help", "show this help and exit");
    pd_sbuf_printf(&sb, "  %-34s %s\n", "--version", "print the version and exit");
    pd_sbuf_printf(&sb, "  %-34s %s\n", "--check-config",
                   "check every key and value given (and the secret, as at boot), print \"configuration ok\" and exit");
    env_name(schema, "config", envv, sizeof(envv));
    pd_sbuf_printf(&sb, "  %-34s INI config file (env %s)\n", "--config FILE", envv);
    for (const pd_cfg_field_t *f = schema->fields; f->name != NULL; f++) {
        char flag[128], extra[320];
        size_t off = 0;
        if (f->type == PD_CFG_BOOL)
            snprintf(flag, sizeof(flag), "--[no-]%s", f->name);
        else
            snprintf(flag, sizeof(flag), "--%s=%s", f->name, type_name(f->type));
        extra[0] = '\0';
        if (f->type == PD_CFG_ENUM) {
            char list[256];
            enum_list(f, list, sizeof(list));
            off += (size_t)snprintf(extra + off, sizeof(extra) - off, "one of %s; ",
                                    list);
        }
        if (has_range(f) && f->type != PD_CFG_ENUM && off < sizeof(extra)) {
            if (f->type == PD_CFG_DURATION) {
                char a[32], b[32];
                off += (size_t)snprintf(extra + off, sizeof(extra) - off,
                                        "range %s..%s; ",
                                        pd_format_duration((uint64_t)f->min, a, sizeof(a)),
                                        pd_format_duration((uint64_t)f->max, b, sizeof(b)));
            } else {
                off += (size_t)snprintf(extra + off, sizeof(extra) - off,
                                        "range %.15g..%.15g; ", f->min, f->max);
            }
        }
        if (off < sizeof(extra))
            snprintf(extra + off, sizeof(extra) - off, "default %s",
                     f->def ? (f->def[0] ? f->def : "\"\"") : "unset");
        env_name(schema, f->name, envv, sizeof(envv));
        pd_sbuf_printf(&sb, "  %-34s %s\n  %-34s (%s; env %s)\n", flag,
                  f->help ? f->help : "", "", extra, envv);
    }
    return pd_sbuf_finish(&sb, NULL);
}

__attribute__((format(printf, 3, 4)))
static void set_usage(pd_cfg_result_t *res, const pd_cfg_schema_t *schema,
                      const char *fmt, ...)
{
    char tmp[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    snprintf(res->message, sizeof(res->message), "%.64s: %.400s",
             schema->prog ? schema->prog : "pdserve", tmp);
}

pd_status_t pd_config_load(const pd_cfg_schema_t *schema, void *target,
                           int argc, char **argv, pd_cfg_result_t *res)
{
    pd_status_t status;
    const char *config_path = NULL;
    char envv[160];

    memset(res, 0, sizeof(*res));
    res->exit_code = PD_CONFIG_RUN;
    bool check_only = false;

    /* Pass 1: --help, --version, --config. --help wins over everything. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            break;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            res->text = pd_config_help(schema);
            if (res->text == NULL)
                return PD_ERR_NO_MEMORY;
            res->exit_code = PD_CONFIG_EXIT_OK;
            return PD_OK;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            break;
        if (strcmp(a, "--version") == 0) {
            const char *v = schema->version ? schema->version : PD_VERSION;
            if (asprintf(&res->text, "%s %s\n",
                         schema->prog ? schema->prog : "pdserve", v) < 0) {
                res->text = NULL;
                return PD_ERR_NO_MEMORY;
            }
            res->exit_code = PD_CONFIG_EXIT_OK;
            return PD_OK;
        }
        if (strcmp(a, "--check-config") == 0)
            check_only = true;
        if (strcmp(a, "--config") == 0) {
            if (i + 1 >= argc) {
                set_usage(res, schema, "--config: missing value");
                goto err_usage;
            }
            config_path = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            config_path = a + 9;
        }
    }
    if (config_path == NULL) {
        env_name(schema, "config", envv, sizeof(envv));
        const char *e = getenv(envv);
        if (e != NULL && e[0] != '\0')
            config_path = e;
    }

    /* Defaults. */
    for (const pd_cfg_field_t *f = schema->fields; f->name != NULL; f++) {
        if (f->def == NULL) {
            if (f->type == PD_CFG_STRING) {
                char **sp = field_ptr(target, f);
                free(*sp);
                *sp = NULL;
            }
            continue;
        }
        char src[160];
        snprintf(src, sizeof(src), "default of %s", f->name);
        status = set_field(schema, target, f, f->def, src, res->message,
                           sizeof(res->message));
        if (status != PD_OK)
            return status == PD_ERR_BAD_INPUT ? PD_ERR_INTERNAL : status;
    }

    /* File. */
    if (config_path != NULL) {
        res->config_path = config_path;
        status = load_file(schema, target, config_path, res);
        if (status != PD_OK) {
            res->exit_code = PD_CONFIG_EXIT_USAGE;
            return status;
        }
    }

    /* Env. */
    for (const pd_cfg_field_t *f = schema->fields; f->name != NULL; f++) {
        env_name(schema, f->name, envv, sizeof(envv));
        const char *e = getenv(envv);
        if (e == NULL)
            continue;
        status = set_field(schema, target, f, e, envv, res->message,
                           sizeof(res->message));
        if (status != PD_OK) {
            res->exit_code = PD_CONFIG_EXIT_USAGE;
            return status;
        }
    }

    /* CLI. */
    res->args = calloc((size_t)(argc > 0 ? argc : 1), sizeof(char *));
    if (res->args == NULL)
        return PD_ERR_NO_MEMORY;
    bool only_args = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_args || a[0] != '-' || a[1] == '\0') {
            if (!schema->allow_args) {
                set_usage(res, schema, "unexpected argument \"%.64s\" (see --help)", a);
                goto err_usage;
            }
            res->args[res->n_args++] = argv[i];
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_args = true;
            continue;
        }
        if (a[1] != '-') {
            set_usage(res, schema, "unknown flag %.64s (see --help)", a);
            goto err_usage;
        }
        if (strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0 || strcmp(a, "--check-config") == 0)
            continue;

        char key[256];
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t klen = eq ? (size_t)(eq - name) : strlen(name);
        if (klen >= sizeof(key)) {
            set_usage(res, schema, "unknown flag %.64s (see --help)", a);
            goto err_usage;
        }
        memcpy(key, name, klen);
        key[klen] = '\0';
        const char *value = eq ? eq + 1 : NULL;
        char src[300];
        snprintf(src, sizeof(src), "--%s", key);

        const pd_cfg_field_t *f = pd_config_find(schema, key);
        if (f == NULL && strncmp(key, "no-", 3) == 0) {
            f = pd_config_find(schema, key + 3);
            if (f != NULL && f->type == PD_CFG_BOOL && value == NULL) {
                *(bool *)field_ptr(target, f) = false;
                continue;
            }
            f = NULL;
        }
        if (f == NULL) {
            set_usage(res, schema, "unknown flag --%.64s (see --help)", key);
            goto err_usage;
        }
        if (value == NULL) {
            if (f->type == PD_CFG_BOOL) {
                value = "true";
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                set_usage(res, schema, "%s: missing value", src);
                goto err_usage;
            }
        }
        status = set_field(schema, target, f, value, src, res->message,
                           sizeof(res->message));
        if (status != PD_OK) {
            res->exit_code = PD_CONFIG_EXIT_USAGE;
            return status;
        }
    }
    if (res->n_args == 0) {
        /* nothing to hand over: do not make every early exit of a daemon
         * (which never calls pd_config_result_free) leak it */
        free(res->args);
        res->args = NULL;
    }
    if (check_only) {
        /* --check-config: every key and value passed its checks (pdctl
         * check runs this with a deployment file's values) */
        char cerr[sizeof(res->message) - 64] = "";
        if (schema->check != NULL && schema->check(target, cerr, sizeof(cerr)) != PD_OK) {
            snprintf(res->message, sizeof(res->message), "%s: %s",
                     schema->prog ? schema->prog : "pdserve", cerr);
            goto err_usage;
        }
        if (asprintf(&res->text, "%s: configuration ok\n",
                     schema->prog ? schema->prog : "pdserve") < 0) {
            res->text = NULL;
            return PD_ERR_NO_MEMORY;
        }
        res->exit_code = PD_CONFIG_EXIT_OK;
    }
    return PD_OK;

err_usage:
    res->exit_code = PD_CONFIG_EXIT_USAGE;
    return PD_ERR_BAD_INPUT;
}

void pd_config_result_free(pd_cfg_result_t *res)
{
    if (res == NULL)
        return;
    free(res->text);
    free(res->args);
    res->text = NULL;
    res->args = NULL;
    res->n_args = 0;
}

void pd_config_load_or_exit(const pd_cfg_schema_t *schema, void *target,
                            int argc, char **argv, pd_cfg_result_t *res)
{
    pd_status_t status = pd_config_load(schema, target, argc, argv, res);
    if (status == PD_OK && res->exit_code == PD_CONFIG_EXIT_OK) {
        fputs(res->text, stdout);
        fflush(stdout);
        pd_config_result_free(res);
        pd_config_free(schema, target);
        exit(0);
    }
    if (status != PD_OK) {
        if (res->message[0] == '\0')
            snprintf(res->message, sizeof(res->message), "%s: %s",
                     schema->prog ? schema->prog : "pdserve",
                     pd_status_str(status));
        fprintf(stderr, "%s\n", res->message);
        pd_config_result_free(res);
        pd_config_free(schema, target);
        exit(PD_CONFIG_EXIT_USAGE);
    }
}

/* ---- dumps ------------------------------------------------------------ */

static void value_text(const pd_cfg_field_t *f, const void *target, char *buf,
                       size_t len, bool *is_null)
{
    const void *p = field_cptr(target, f);
    *is_null = false;
    switch (f->type) {
    case PD_CFG_STRING: {
        const char *s = *(char *const *)p;
        *is_null = s == NULL;
        snprintf(buf, len, "%s", s ? s : "");
        break;
    }
    case PD_CFG_INT:
        snprintf(buf, len, "%lld", (long long)*(const int64_t *)p);
        break;
    case PD_CFG_UINT:
    case PD_CFG_SIZE:
        snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)p);
        break;
    case PD_CFG_BOOL:
        snprintf(buf, len, "%s", *(const bool *)p ? "true" : "false");
        break;
    case PD_CFG_DOUBLE:
        snprintf(buf, len, "%.17g", *(const double *)p);
        break;
    case PD_CFG_DURATION:
        pd_format_duration(*(const uint64_t *)p, buf, len);
        break;
    case PD_CFG_ENUM: {
        int i = *(const int *)p;
        const char *name = NULL;
        for (int j = 0; f->enum_values && f->enum_values[j]; j++)
            if (j == i)
                name = f->enum_values[j];
        snprintf(buf, len, "%s", name ? name : "?");
        break;
    }
    }
}

struct cJSON *pd_config_to_json(const pd_cfg_schema_t *schema,
                                const void *target)
{
    cJSON *obj = cJSON_CreateObject();
    if (obj == NULL)
        return NULL;
    for (const pd_cfg_field_t *f = schema->fields; f->name != NULL; f++) {
        const void *p = field_cptr(target, f);
        cJSON *v = NULL;
        char buf[512];
        bool is_null;
        switch (f->type) {
        case PD_CFG_INT:
            v = cJSON_CreateNumber((double)*(const int64_t *)p);
            break;
        case PD_CFG_UINT:
        case PD_CFG_SIZE:
            v = cJSON_CreateNumber((double)*(const uint64_t *)p);
            break;
        case PD_CFG_DOUBLE:
            v = cJSON_CreateNumber(*(const double *)p);
            break;
        case PD_CFG_BOOL:
            v = cJSON_CreateBool(*(const bool *)p);
            break;
        case PD_CFG_STRING:
        case PD_CFG_DURATION:
        case PD_CFG_ENUM:
            value_text(f, target, buf, sizeof(buf), &is_null);
            v = is_null ? cJSON_CreateNull() : cJSON_CreateString(buf);
            break;
        }
        if (v == NULL || !cJSON_AddItemToObject(obj, f->name, v)) {
            cJSON_Delete(v);
            cJSON_Delete(obj);
            return NULL;
        }
    }
    return obj;
}

char *pd_config_to_ini(const pd_cfg_schema_t *schema, const void *target)
{
    pd_sbuf_t sb = PD_SBUF_INIT;
    pd_sbuf_printf(&sb, "; effective configuration of %s\n",
              schema->prog ? schema->prog : "pdserve");
    for (const pd_cfg_field_t *f = schema->fields; f->name != NULL; f++) {
        char buf[1024];
        bool is_null;
        value_text(f, target, buf, sizeof(buf), &is_null);
        if (f->help)
            pd_sbuf_printf(&sb, "; %s\n", f->help);
        if (is_null)
            pd_sbuf_printf(&sb, "; %s = (unset)\n", f->name);
        else
            pd_sbuf_printf(&sb, "%s = %s\n", f->name, buf);
    }
    return pd_sbuf_finish(&sb, NULL);
}
