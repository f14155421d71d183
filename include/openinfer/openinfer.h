/* libopeninfer — the whole public API. Include this one header. The
 * experimental API (experimental.h) is visible only with OI_EXPERIMENTAL
 * defined before it. */
#ifndef OPENINFER_OPENINFER_H
#define OPENINFER_OPENINFER_H

#include "openinfer/common.h"
#include "openinfer/device.h"
#include "openinfer/disk.h"
#include "openinfer/engine.h"
#include "openinfer/executor.h"
#include "openinfer/experimental.h"
#include "openinfer/hash.h"
#include "openinfer/host.h"
#include "openinfer/model.h"
#include "openinfer/server.h"

#endif
