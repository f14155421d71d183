/* libopeninfer — the whole public API. Include this one header. */
#ifndef OPENINFER_OPENINFER_H
#define OPENINFER_OPENINFER_H

#include "openinfer/common.h"
#include "openinfer/device.h"
#include "openinfer/engine.h"
#include "openinfer/executor.h"
#include "openinfer/hash.h"
#include "openinfer/host.h"
#include "openinfer/server.h"

#endif
