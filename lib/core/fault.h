/* Fault injection: a test-only hook, compiled in with the build option
 * -Dfault_injection=true (OI_FAULT_INJECTION defined; off by default and
 * refused in release builds). Without it every OI_FAULT(...) is the constant
 * false and the code it guards is dead.
 *
 * A fault point is a named place in the library where a test can make the
 * next operations fail (or slow down). A point is armed with
 *   oi__fault_arm(point, after_n, count, param)
 * and then lets the first `after_n` hits pass, fires on the `count` hits after
 * those (0: on every later hit), and passes again afterwards. `param` is the
 * point's argument (below). Subprocesses (`openinfer serve`, test clients)
 * are armed through the environment, read at the first hit:
 *   OI_FAULTS="name[:after_n[:count[:param]]][,name...]"
 * e.g. OI_FAULTS=copy_slow:0:0:200,sock_reset:3:1:10
 *
 * Points (name: what happens when it fires; param):
 *   host_alloc      a host pool slot allocation finds nothing (saves drop)
 *   pinned_alloc    mapping the host pool fails (OI_ERR_OUT_OF_MEMORY)
 *   pin_register    pinning/registering the mapped pool fails (OI_ERR_CUDA)
 *   copy_fail       a stream copy fails before moving any byte (OI_ERR_IO)
 *   copy_partial    a stream copy fails after moving about half its bytes
 *   copy_slow       a stream copy first sleeps `param` ms (deadlines)
 *   sock_short      each send() of a frame writes at most `param` bytes (1 if 0)
 *   sock_reset      a frame send writes `param` bytes, then the connection is
 *                   shut down (both ways) and the send fails with OI_ERR_CLOSED
 *   clock_jump      the library's monotonic clock jumps `param` ms forward
 *                   (cumulative; it stays monotonic): leases expire, deadlines pass
 *   disk_write      a disk-tier block write fails with errno `param` (EIO if 0)
 *   disk_read       a disk-tier block read fails with errno `param` (EIO if 0)
 *   disk_short_read a disk-tier block read returns half its payload bytes
 *   disk_short_write a disk-tier block write reports half its payload bytes
 *   disk_fallocate  preallocating a disk-tier data file fails with errno
 *                   `param` (ENOSPC if 0)
 *   disk_read_slow  the disk tier's completion thread sleeps `param` ms before
 *                   it ends a block read (the read holds its block meanwhile)
 *   disk_write_slow likewise before it ends a block write (its queue slot is
 *                   held meanwhile, so spills back up)
 *   copy_submit     queuing a group of copies on a stream fails at submit time
 *                   (OI_ERR_IO): the call fails, what was queued drains, and
 *                   the job ends failed (its slots aborted, its lease consumed)
 *   completion_submit queuing a job's completion after its copies fails at
 *                   submit time (OI_ERR_IO), with the same cleanup
 *   session_start   the server cannot start a client's session (its thread):
 *                   the connection is refused with OI_ERR_INTERNAL
 *   lease_alloc     creating a query's lease finds no memory (the query fails
 *                   with OI_ERR_OUT_OF_MEMORY after its blocks were pinned)
 *   reserve_gap     a save that must evict for a slot sleeps `param` ms with
 *                   its shard unlocked (another saver may insert the same
 *                   hash meanwhile)
 *   disk_sync       an fsync or fdatasync of the disk tier's files (data, log,
 *                   checkpoint, directory) fails with errno `param` (EIO if 0)
 *   disk_log_write  a write to the disk tier's log (a record appended, or the
 *                   header of a log started afresh) writes `param` bytes of
 *                   it (0: none, it fails with EIO)
 */
#ifndef OI_CORE_FAULT_H
#define OI_CORE_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "openinfer/common.h"

typedef enum oi_fault_point {
  OI_FAULT_HOST_ALLOC = 0,
  OI_FAULT_PINNED_ALLOC,
  OI_FAULT_PIN_REGISTER,
  OI_FAULT_COPY_FAIL,
  OI_FAULT_COPY_PARTIAL,
  OI_FAULT_COPY_SLOW,
  OI_FAULT_SOCK_SHORT,
  OI_FAULT_SOCK_RESET,
  OI_FAULT_CLOCK_JUMP,
  OI_FAULT_DISK_WRITE,
  OI_FAULT_DISK_READ,
  OI_FAULT_DISK_SHORT_READ,
  OI_FAULT_DISK_FALLOCATE,
  OI_FAULT_DISK_READ_SLOW,
  OI_FAULT_DISK_SHORT_WRITE,
  OI_FAULT_DISK_WRITE_SLOW,
  OI_FAULT_COPY_SUBMIT,
  OI_FAULT_COMPLETION_SUBMIT,
  OI_FAULT_SESSION_START,
  OI_FAULT_LEASE_ALLOC,
  OI_FAULT_RESERVE_GAP,
  OI_FAULT_DISK_SYNC,
  OI_FAULT_DISK_LOG_WRITE,
  OI_FAULT_LOAD_MARK_GAP,
  OI_FAULT_POINTS
} oi_fault_point;

/* Is fault injection compiled in? (Tests skip with 77 when not.) */
bool oi__fault_available(void);
/* Arms `point` (replacing an earlier arming and resetting its hit count).
 * @return OI_ERR_UNSUPPORTED in a build without fault injection. */
oi_status oi__fault_arm(oi_fault_point point, uint64_t after_n, uint64_t count, uint64_t param);
void oi__fault_disarm(oi_fault_point point);
void oi__fault_disarm_all(void);
/* Times `point` fired since it was armed. */
uint64_t oi__fault_fired(oi_fault_point point);
/* The clock offset (ns) clock_jump has added so far. */
uint64_t oi__fault_clock_offset_ns(void);
/* `ns` (a monotonic clock reading) plus the offset; a hit of clock_jump. */
uint64_t oi__fault_clock(uint64_t ns);

#ifdef OI_FAULT_INJECTION
/* Does `point` fire on this hit? Sets *param (may be NULL) when it does. */
bool oi__fault_hit(oi_fault_point point, uint64_t *param);
#define OI_FAULT(point, param_ptr) __builtin_expect(oi__fault_hit((point), (param_ptr)), 0)
#define OI_FAULT_CLOCK(ns) oi__fault_clock(ns)
#else
#define OI_FAULT(point, param_ptr) 0
#define OI_FAULT_CLOCK(ns) (ns)
#endif

#endif
