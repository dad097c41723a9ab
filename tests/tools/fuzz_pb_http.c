/* Fuzz target: pd-bench's client-side decoders (HTTP/1.1 response parser
 * feeding the SSE parser), the bytes a hostile or broken server controls.
 * The first input byte picks the feed step so chunk boundaries vary. */
#include "pb_http.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t n_events;

static void on_event(void *arg, const char *d, size_t len)
{
    /* Events are NUL-terminated at len. */
    if (d[len] != '\0')
        abort();
    n_events++;
}

static void on_body(void *arg, const char *d, size_t len)
{
    pb_sse_t *s = arg;
    pb_sse_feed(s, d, len, on_event, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pb_http_resp_t *r;
    pb_sse_t sse;
    size_t step, off = 0, used;

    if (size < 1)
        return 0;
    step = (size_t)(data[0] % 64) + 1;
    data++;
    size--;
    r = malloc(sizeof(*r));
    if (r == NULL)
        return 0;
    pb_http_resp_init(r);
    pb_sse_init(&sse);
    while (off < size) {
        size_t n = size - off < step ? size - off : step;
        if (pb_http_resp_feed(r, (const char *)data + off, n, on_body, &sse,
                              &used) != PD_OK)
            break;
        if (used > n)
            abort();
        if (r->complete)
            break;
        off += n;
    }
    pb_http_resp_eof(r);
    if (r->complete && !r->headers_done)
        abort();
    pb_sse_fini(&sse);
    free(r);
    return 0;
}
