/* Fuzz target: the client-side decoders of common/pd_httpc (HTTP/1.1 response parser
 * feeding the SSE parser), the bytes a hostile or broken server controls.
 * The first input byte picks the feed step so chunk boundaries vary. */
#include "pd_httpc.h"

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
    pd_sse_t *s = arg;
    pd_sse_feed(s, d, len, on_event, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pd_httpc_resp_t *r;
    pd_sse_t sse;
    size_t step, off = 0, used;

    if (size < 1)
        return 0;
    step = (size_t)(data[0] % 64) + 1;
    data++;
    size--;
    r = malloc(sizeof(*r));
    if (r == NULL)
        return 0;
    pd_httpc_resp_init(r, 1u << 20);
    pd_sse_init(&sse);
    while (off < size) {
        size_t n = size - off < step ? size - off : step;
        if (pd_httpc_resp_feed(r, (const char *)data + off, n, on_body, &sse,
                              &used) != PD_OK)
            break;
        if (used > n)
            abort();
        if (r->complete)
            break;
        off += n;
    }
    pd_httpc_resp_eof(r);
    if (r->complete && !r->headers_done)
        abort();
    pd_sse_fini(&sse);
    free(r);
    return 0;
}
