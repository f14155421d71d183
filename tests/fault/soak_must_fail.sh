#!/bin/sh
# The soak fails when a client dies of a signal: every client aborts after a
# few operations (OI_SOAK_CHILD_CRASH=1); the soak must exit non-zero and say
# which signal killed a client. Usage: soak_must_fail.sh SOAK OPENINFER
soak=$1
exe=$2
out=$(OI_SOAK_CHILD_CRASH=1 OI_SOAK_REPORT= "$soak" "$exe" --seconds 2 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  printf '%s\n' "$out" | tail -20
  echo "FAIL: the soak passed although every client aborted"
  exit 1
fi
if ! printf '%s\n' "$out" | grep -q 'died of signal 6'; then
  printf '%s\n' "$out" | tail -20
  echo "FAIL: the soak failed (exit $rc) but did not report the client's signal"
  exit 1
fi
printf '%s\n' "$out" | grep 'died of signal' | head -3
echo "ok: the soak failed (exit $rc) and named the signal"
