/* The headers openinfer-sys binds (bindgen input). */
#include <openinfer/common.h>
#include <openinfer/device.h>
#include <openinfer/engine.h>
#include <openinfer/executor.h>
#include <openinfer/hash.h>
#include <openinfer/host.h>
#include <openinfer/model.h>
#include <openinfer/server.h>
/* The experimental API (the reference model) is bound too: it is exported
 * under OPENINFER_EXPERIMENTAL_0.1 and may change in any release. */
#define OI_EXPERIMENTAL 1
#include <openinfer/experimental.h>
