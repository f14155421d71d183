/* The headers openinfer-sys binds (bindgen input). */
#include <openinfer/common.h>
#include <openinfer/device.h>
#include <openinfer/hash.h>
#include <openinfer/host.h>
#include <openinfer/engine.h>
#include <openinfer/server.h>
#include <openinfer/executor.h>
