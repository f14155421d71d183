/* Coverage builds only (meson -Db_coverage=true; ./dev coverage). gcov
 * writes a program's counters from an exit handler, which _exit() and
 * abort() skip: a forked test child that ends either way would lose every
 * line it ran, and the figure would read lower than the truth. Test programs
 * in a coverage build are linked with --wrap=_exit and --wrap=abort (see
 * tests/meson.build), so each such end writes the counters first. A process
 * killed by a signal (SIGKILL) still cannot: docs/guarantees.md says which. */
#include <stdlib.h>
#include <unistd.h>

extern void __gcov_dump(void);
extern void __real__exit(int status) __attribute__((noreturn));
extern void __real_abort(void) __attribute__((noreturn));

void __wrap__exit(int status) __attribute__((noreturn));
void __wrap_abort(void) __attribute__((noreturn));

void __wrap__exit(int status) {
  __gcov_dump();
  __real__exit(status);
}

void __wrap_abort(void) {
  __gcov_dump();
  __real_abort();
}
