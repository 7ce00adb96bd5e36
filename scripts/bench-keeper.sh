#!/usr/bin/env bash
# A mount that outlives its daemon: how long readers wait while the keeper replaces a daemon
# killed with SIGKILL, for datasets of growing size (the successor replays one node-journal
# record a name before it serves), and whether the epoch after the kill hits as the one before.
#
#   scripts/bench-keeper.sh                      # SIZES="10000 100000 400000" files, KILLS=5
#   SIZES=1000 KILLS=2 scripts/bench-keeper.sh   # a dry run
#
# For each size: FILES tiny files (1 KiB) in DIRS directories on a tmpfs under BASE (/dev/shm),
# mounted with the defaults (a keeper, passthrough, an elastic cache), scanned, read once (the
# cache fills), then KILLS times: the daemon is killed while a reader process reads the whole
# dataset, and the pause is the time from the kill to the successor serving (its log line,
# `took the mount over ... X s after the previous daemon ended`). Printed per size: the median
# and the longest pause, and the hit rate of the epoch read right after the last kill against
# the epoch before the kills. Nothing is compared with a native path: a plain directory has no
# daemon to lose.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"10000 100000 400000"}
KILLS=${KILLS:-5}
DIRS=${DIRS:-100}
BASE=${BASE:-/dev/shm}
bin=${COORFS_BIN:-target/release/coorfs}
[ -n "${COORFS_BIN:-}" ] || cargo build --release --locked --quiet

work=$(mktemp -d "$BASE/coorfs-bench-keeper.XXXXXX")
mnt=$work/mnt
cleanup() {
    if grep -q " $mnt fuse.coorfs " /proc/self/mounts 2>/dev/null; then
        "$bin" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
stat_of() { getfattr --only-values -n "user.coorfs.$1" "$mnt" 2>/dev/null; }
read_all() { find "$mnt" -type f -print0 | xargs -0 cat > /dev/null; }

printf '%10s %6s %14s %14s %12s %12s\n' files kills "median pause" "longest pause" "hit before" "hit after"
for n in $SIZES; do
    src=$work/src-$n
    python3 - "$src" "$n" "$DIRS" <<'PY'
import os, sys
src, n, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(dirs):
    os.makedirs(f"{src}/d{d:03}", exist_ok=True)
blob = os.urandom(1024)
for i in range(n):
    with open(f"{src}/d{i % dirs:03}/f{i:07}.bin", "wb") as f:
        f.write(blob)
PY
    mkdir -p "$mnt"
    log=$work/log-$n
    "$bin" mount --log-file "$log" "$src" "$mnt"
    until [ "$(stat_of scan_complete)" = 1 ]; do sleep 0.2; done
    read_all
    h0=$(stat_of hits)
    read_all
    h1=$(stat_of hits)
    for _ in $(seq "$KILLS"); do
        read_all &
        reader=$!
        sleep 0.2
        kill -9 "$(stat_of pid)"
        wait "$reader"
    done
    h2=$(stat_of hits)
    read_all
    h3=$(stat_of hits)
    pauses=$(sed -n 's/.*took the mount over .* \([0-9.]*\) s after the previous daemon ended.*/\1/p' "$log" | sort -n)
    median=$(echo "$pauses" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
    longest=$(echo "$pauses" | tail -1)
    ratio() { awk -v a="$1" -v b="$2" -v n="$n" 'BEGIN {printf "%.3f", (a - b) / n}'; }
    printf '%10d %6d %12.3f s %12.3f s %12s %12s\n' "$n" "$(echo "$pauses" | wc -l)" \
        "$median" "$longest" "$(ratio "$h1" "$h0")" "$(ratio "$h3" "$h2")"
    "$bin" umount "$mnt"
    rm -rf "$src" "$log"
done
