#include "pd_status.h"

const char *pd_status_str(pd_status_t status)
{
    switch (status) {
#define PD_STATUS_CASE(name, val, text) case PD_##name: return text;
    PD_STATUS_LIST(PD_STATUS_CASE)
#undef PD_STATUS_CASE
    }
    return "unknown status";
}

const char *pd_status_name(pd_status_t status)
{
    switch (status) {
#define PD_STATUS_CASE(name, val, text) case PD_##name: return #name;
    PD_STATUS_LIST(PD_STATUS_CASE)
#undef PD_STATUS_CASE
    }
    return "UNKNOWN";
}

int pd_status_index(pd_status_t status)
{
    int v = (int)status;
    if (v > 1 || v < PD_STATUS_MIN)
        return PD_STATUS_COUNT - 1; /* folded into the last slot */
    return 1 - v;
}
