#ifndef OI_ENGINE_LAYOUT_H
#define OI_ENGINE_LAYOUT_H

#include "openinfer/engine.h"
#include "transfer/plan.h"

#define OI_MAX_SEGMENTS OI_LAYOUT_MAX_SEGMENTS
#define OI_MAX_ARENAS 4096

/* Validates the arenas of `o` (every rule of docs/api.md "Layouts") and
 * builds the runtime layout. On error nothing is allocated. `what` prefixes
 * messages ("register"). */
oi_status oi__layout_build(const oi_engine_options *o, const char *what, oi_layout *out);
void oi__layout_free(oi_layout *l);

#endif
