#!/usr/bin/env bash
# scripts/walk_free.sh [SRC] — the walk of a free of another thread's block through the source files, in order, and a
# check that every call goes to the caller's layer or one below (src/LAYERS). Three walks: the owner alive; the owner
# exited (its page abandoned); then the next slow paths. SRC: a Mallard tree (default: this one). Needs gcc, addr2line.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=$(cd "${1:-$here}" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# -O0: no inlining, so each function the walk enters shows (static inline helpers of headers too).
gcc -O0 -g -no-pie -finstrument-functions -DMALLARD_STATS -I"$src/include" -I"$src/src" -o "$dir/walk" \
  "$here/tests/layers/walk_free.c" $(find "$src/src" -name '*.c' | sort) -lpthread -ldl
status=0
for mode in alive exited follow; do
  env=(MALLARD_CONF=dirty_decay_ms:0,background_thread:false)
  [ "$mode" != alive ] && env+=(EXIT_OWNER=1)
  [ "$mode" = follow ] && env+=(FOLLOW=1)
  env "${env[@]}" "$dir/walk" > "$dir/addrs"
  python3 - "$dir/walk" "$dir/addrs" "$src/src/LAYERS" "$mode" <<'PY' || status=1
import subprocess, sys
exe, addrs, layers_file, mode = sys.argv[1:]
pairs = [line.split() for line in open(addrs)]
def where(addresses):
    out = subprocess.run(["addr2line", "-f", "-e", exe], input="\n".join(addresses), capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return [(out[i], out[i + 1].split(":")[0]) for i in range(0, len(out), 2)]
callee = where([p[0] for p in pairs])
caller = where([p[1] for p in pairs])
rank, names = {}, []
import os
for line in (open(layers_file) if os.path.exists(layers_file) else []):   # a tree before the layers: no check
    if line.startswith(("#", "@")) or ":" not in line:
        continue
    name, folders = line.split(":", 1)
    names.append(name)
    for f in folders.split():
        rank[f.rstrip("/")] = len(names) - 1
def rel(path):
    parts = path.split("/src/")[-1].split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else (parts[-1] if path.startswith("/") else path)
def layer(path):
    p = path.split("/src/")[-1]
    folder = p.split("/")[0] if "/" in p else ""
    return rank.get(folder)
files, ups = [], []
for (fn, file), (cfn, cfile) in zip(callee, caller):
    f = rel(file)
    if not files or files[-1] != f:
        files.append(f)
    a, b = layer(cfile), layer(file)
    if a is not None and b is not None and b > a:
        ups.append(f"{cfn} ({rel(cfile)}) calls {fn} ({f}): up from {names[a]} to {names[b]}")
entered = {}
for f in files:
    entered[f] = entered.get(f, 0) + 1
returns = sum(n - 1 for n in entered.values())
print(f"{mode}: {len(pairs)} calls, {len(files)} stops in {len(entered)} files, {returns} returning to a file left")
print("  " + " > ".join(files))
for u in ups:
    print("  UPWARD CALL: " + u)
sys.exit(1 if ups else 0)
PY
done
exit $status
