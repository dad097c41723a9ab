/* eng.c - the engine registry: name -> ops table. One line per engine. */
#include <string.h>

#include "eng.h"

extern const eng_ops_t eng_llama_ops;
extern const eng_ops_t eng_sim_ops;

static const eng_ops_t *const eng_registry[] = {
    &eng_llama_ops,
    &eng_sim_ops,
};

const eng_ops_t *eng_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof(eng_registry) / sizeof(eng_registry[0]); i++)
        if (strcmp(eng_registry[i]->name, name) == 0)
            return eng_registry[i];
    return NULL;
}
