#!/usr/bin/env bash
# Soak run (not in CI): the stress and model tests, every link mode built, with fresh random seeds, for as long as
# asked; a failure is reported with its seed and a replay command, and its output is kept.
# Usage: scripts/soak.sh DURATION [BUILD_DIR...]   DURATION: seconds, or with a suffix s, m, h (e.g. 30m, 8h).
#   The build folders default to build (and build-tsan when it exists: its prefixed tests run too).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() { echo "usage: scripts/soak.sh DURATION [BUILD_DIR...]  (DURATION: 600, 45m, 8h)" >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in
  *[!0-9smh]* | "" | [smh]*) usage ;;
  *h) secs=$(( ${1%h} * 3600 )) ;;
  *m) secs=$(( ${1%m} * 60 )) ;;
  *s) secs=${1%s} ;;
  *) secs=$1 ;;
esac
shift
dirs=("$@")
if [ ${#dirs[@]} -eq 0 ]; then
  dirs=("$root/build")
  [ -d "$root/build-tsan" ] && dirs+=("$root/build-tsan")
fi

# Every stress/model program found in the build folders, with the environment ctest gives it (LD_PRELOAD, TSAN_OPTIONS).
progs=()
for d in "${dirs[@]}"; do
  for p in "$d"/bin/ctest-stress_* "$d"/bin/ctest-model_*; do
    [ -x "$p" ] && progs+=("$p")
  done
done
if [ ${#progs[@]} -eq 0 ]; then
  echo "soak: no ctest-stress_* / ctest-model_* program in ${dirs[*]}: build first (cmake --build build)" >&2
  exit 2
fi

env_for() {   # the ENVIRONMENT property ctest gives the test of this program, one VAR=value per line
  local prog=$1 dir name
  dir=$(dirname "$(dirname "$prog")")
  name=c_${prog##*/ctest-}
  ctest --test-dir "$dir" -R "^${name}\$" --show-only=json-v1 2>/dev/null |
    python3 -c 'import json,sys
for t in json.load(sys.stdin).get("tests", []):
    for p in t.get("properties", []):
        if p["name"] == "ENVIRONMENT":
            print("\n".join(p["value"]))'
}

logdir=$(mktemp -d "${TMPDIR:-/tmp}/mallard-soak.XXXXXX")
end=$(( $(date +%s) + secs ))
runs=0
fails=0
echo "soak: ${#progs[@]} programs for ${secs}s; failing runs are kept in $logdir"
while [ "$(date +%s)" -lt "$end" ]; do
  for prog in "${progs[@]}"; do
    [ "$(date +%s)" -lt "$end" ] || break
    seed=$(od -An -N6 -tu8 /dev/urandom | tr -d ' ')
    mapfile -t envs < <(env_for "$prog")
    log="$logdir/run-$runs.log"
    if env "${envs[@]}" timeout 600 "$prog" "$seed" >"$log" 2>&1; then
      rm -f "$log"
    else
      rc=$?
      fails=$((fails + 1))
      echo "soak: FAILED (exit $rc): ${envs[*]} $prog $seed   (output: $log)"
    fi
    runs=$((runs + 1))
  done
done
echo "soak: $runs runs, $fails failed"
[ "$fails" -eq 0 ]
