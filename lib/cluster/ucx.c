/* UCX loaded at run time: see ucx.h. */
#include "cluster/ucx.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

oi_ucx_api oi__ucx;

/* Each function of the table: its name and where its pointer goes. */
static const struct {
  const char *name;
  size_t offset;
} ucx_symbols[] = {
#define OI_UCX_SYMBOL(name) {#name, offsetof(oi_ucx_api, name)},
    OI_UCX_FUNCS(OI_UCX_SYMBOL)
#undef OI_UCX_SYMBOL
};

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static bool loaded;

#if defined(__SANITIZE_THREAD__)
#define OI_UCX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define OI_UCX_TSAN 1
#endif
#endif

/* A ThreadSanitizer build: UCX 1.13 installs its memory hooks from
 * libucs's constructor, as its environment says (UCX_MEM_EVENTS, read
 * there and nowhere else), by patching the code of libc's mmap, munmap and
 * madvise. glibc calls madvise on a thread's stack as the thread ends, after
 * TSan has dropped the thread's state, and the hook's lock then crashes the
 * process in TSan's interceptor. In such a build the loader turns the events
 * off for the UCX it loads, unless the environment already says something
 * or UCX is loaded already (docs/cluster.md, "Loading UCX"). Normal builds
 * leave UCX's configuration alone. */
static void tsan_quiet_ucx(void) {
#ifdef OI_UCX_TSAN
  void *already = dlopen(OI_UCS_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
  if (already) {
    dlclose(already);
    return;
  }
  setenv("UCX_MEM_EVENTS", "no", 0);
#endif
}

oi_status oi__ucx_open(const char *ucp_soname, const char *ucs_soname, oi_ucx_api *api) {
  memset(api, 0, sizeof(*api));
  tsan_quiet_ucx();
  dlerror();
  /* RTLD_LOCAL: UCX's symbols stay out of the global namespace, so nothing
   * else in the process binds to them by accident. Never dlclose'd (UCX
   * does not support being unloaded: its hooks and threads stay). */
  void *ucp = dlopen(ucp_soname, RTLD_NOW | RTLD_LOCAL);
  if (!ucp) {
    const char *e = dlerror();
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "cluster: the peer transport needs UCX and %s could not be loaded (%s); "
                    "install UCX (Debian: libucx0)",
                    ucp_soname, e ? e : "no dlerror");
  }
  /* ucs_* live in libucs, a dependency of libucp (dlsym on libucp's handle
   * searches its dependencies); libucs is opened by name only where that
   * fails. */
  void *ucs = NULL;
  for (size_t i = 0; i < OI_ARRAY_LEN(ucx_symbols); i++) {
    const char *name = ucx_symbols[i].name;
    dlerror();
    void *sym = dlsym(ucp, name);
    if (!sym && strncmp(name, "ucs_", 4) == 0 && ucs_soname) {
      if (!ucs) ucs = dlopen(ucs_soname, RTLD_NOW | RTLD_LOCAL);
      if (ucs) sym = dlsym(ucs, name);
    }
    if (!sym) {
      const char *e = dlerror();
      memset(api, 0, sizeof(*api));
      return oi__fail(OI_ERR_UNSUPPORTED,
                      "cluster: %s was loaded but lacks %s (%s); the peer transport needs UCX "
                      "1.13 or later",
                      ucp_soname, name, e ? e : "no dlerror");
    }
    memcpy((char *)api + ucx_symbols[i].offset, &sym, sizeof(sym));
  }
  return OI_OK;
}

oi_status oi__ucx_load(void) {
  pthread_mutex_lock(&load_lock);
  oi_status st = OI_OK;
  if (!loaded) {
    oi_ucx_api api;
    st = oi__ucx_open(OI_UCX_LIBRARY, OI_UCS_LIBRARY, &api);
    if (st == OI_OK) {
      oi__ucx = api;
      loaded = true;
    }
  }
  pthread_mutex_unlock(&load_lock);
  return st;
}
