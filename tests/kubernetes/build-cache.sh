# shellcheck shell=bash
# Sourced by the tests/kubernetes build scripts: how they share a cache entry between runs.
#
# enter_build_cache OUT RESULT
#   If OUT/.complete exists, print RESULT and exit 0 (built before). Otherwise create OUT, take the
#   lock OUT/.lock on fd 9 (held until the script exits, so one build per entry at a time) and check
#   again: a run that held the lock may have finished meanwhile. The caller builds, then touches
#   OUT/.complete.
enter_build_cache() {
  local out=$1 result=$2
  if [ -f "$out/.complete" ]; then echo "$result"; exit 0; fi
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ -f "$out/.complete" ]; then echo "$result"; exit 0; fi
}
