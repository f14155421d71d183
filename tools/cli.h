/* Shared pieces of the `openinfer` command-line tool. */
#ifndef OI_TOOLS_CLI_H
#define OI_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Exit codes: 0 success, 1 the command failed, 2 usage error. */
enum { CLI_OK = 0, CLI_FAILED = 1, CLI_USAGE = 2 };

int cmd_demo(int argc, char **argv);
int demo_tier(int argc, char **argv);
int demo_pd(int argc, char **argv);
int cmd_bench(int argc, char **argv);        /* openinfer-bench (tools/bench/) */
int cmd_bench_launch(int argc, char **argv); /* openinfer: runs openinfer-bench */
int cmd_serve(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_info(int argc, char **argv);
int bench_transfer(int argc, char **argv);
int bench_rpc(int argc, char **argv);
int bench_ttft(int argc, char **argv);
int bench_disk(int argc, char **argv);
int bench_codec(int argc, char **argv);
int bench_remote(int argc, char **argv);

/* Parses "64", "64K", "2M", "1G" (binary units). */
bool cli_parse_size(const char *s, uint64_t *out);
/* Prints "<cmd>: bad value 'ARG' for --NAME" for the long option whose val is `c`. */
struct option;
void cli_bad_value(const char *cmd, const struct option *longopts, int c, const char *arg);

/* Parses a decimal integer in [lo, hi]. */
bool cli_parse_int(const char *s, long lo, long hi, long *out);

/* oi_executor_options.restore_overlap from the environment variable
 * OI_RESTORE_OVERLAP ("0" or "off": OFF; "host": HOST; else AUTO). */
uint32_t cli_restore_overlap_env(void);
/* oi_executor_options.restore_plan from OI_RESTORE_PLAN (0|off: OFF; else
 * AUTO; docs/planner.md). */
uint32_t cli_restore_plan_env(void);

/* Whether an executable `prog` is on PATH. */
bool cli_on_path(const char *prog);
/* A TCP port on 127.0.0.1 that was free a moment ago (-1: none). */
int cli_free_port(void);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t cli_now_ns(void);

/* A deterministic byte pattern: byte `offset` of the stream named `seed`. */
uint8_t cli_pattern_byte(uint64_t seed, uint64_t offset);

#endif
