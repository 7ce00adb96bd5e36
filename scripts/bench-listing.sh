#!/usr/bin/env bash
# A bucket of 50,000 to millions of objects: how long `coorfs mount` takes to return, the
# first `ls` of a folder after it, a full walk (`find -type f`, which waits for the folders'
# listings), and the daemon's memory after the walk (VmRSS, and its peak VmHWM).
#
#   scripts/bench-listing.sh                         # 50,000 and 1,000,000 objects, REPS=3
#   OBJECTS="50000" REPS=1 scripts/bench-listing.sh  # a dry run
#   BEFORE=/path/to/old/coorfs scripts/bench-listing.sh   # the same for another binary too
#   MANIFEST=1 scripts/bench-listing.sh              # and mounts with --manifest (no listing)
#
# The store: scripts/list-server.py, a synthetic S3 bucket whose OBJECTS objects in FOLDERS
# folders (1,000: 50 or 1,000 keys each) are made up from their keys, answering every request
# after LATENCY (20 ms), 1,000 keys a listing page. The mount is coorfs's defaults with
# --no-prefetch (nothing read). Medians of REPS runs.
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
OBJECTS=${OBJECTS:-"50000 1000000"}
FOLDERS=${FOLDERS:-1000}
LATENCY=${LATENCY:-20ms}
PORT=${PORT:-$((21000 + $$ % 9000))}
BEFORE=${BEFORE:-}
MANIFEST=${MANIFEST:-}

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
work=$(mktemp -d /var/tmp/coorfs-bench-listing.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
server=
cleanup() {
    if grep -qs " $mnt " /proc/mounts; then "$coorfs" umount "$mnt" || umount -l "$mnt"; fi
    [ -z "$server" ] || kill "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=bench \
    AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1 \
    AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_CONFIG_FILE=/nonexistent
now() { date +%s.%N; }

# run LABEL BINARY [MOUNT OPTIONS...]: one mount, ls, walk; appends a sample line.
run() {
    local label=$1 bin=$2
    shift 2
    local t0 t1 t2 t3 files pid rss hwm
    t0=$(now)
    "$bin" mount --no-prefetch "$@" s3://bench/ds "$mnt"
    t1=$(now)
    ls "$mnt/f$(printf %04d $((FOLDERS / 2)))" > /dev/null
    t2=$(now)
    files=$(find "$mnt" -type f | wc -l)
    t3=$(now)
    pid=$("$bin" stats --json "$mnt" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
    "$bin" umount "$mnt"
    if [ "$files" != "$n" ]; then
        echo "bench-listing.sh: $label walked $files files, not $n" >&2
        exit 1
    fi
    echo "$label $n $(echo "$t1 - $t0" | bc) $(echo "$t2 - $t1" | bc) $(echo "$t3 - $t2" | bc) $rss $hwm" | tee -a "$work/samples" >&2
}

: > "$work/samples"
for n in $OBJECTS; do
    python3 scripts/list-server.py --port "$PORT" --objects "$n" --folders "$FOLDERS" --latency "$LATENCY" &
    server=$!
    for _ in $(seq 1 100); do curl -s -o /dev/null "$AWS_ENDPOINT_URL/bench/x" && break; sleep 0.1; done
    if [ -n "$MANIFEST" ]; then
        "$coorfs" manifest s3://bench/ds > "$work/manifest" 2>/dev/null
    fi
    for rep in $(seq 1 "$REPS"); do
        run coorfs "$coorfs"
        [ -z "$BEFORE" ] || run before "$BEFORE"
        [ -z "$MANIFEST" ] || run manifest "$coorfs" --manifest "$work/manifest"
    done
    kill "$server"
    wait "$server" 2>/dev/null || true
    server=
done

echo
echo "scripts/bench-listing.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD):" \
    "$FOLDERS folders, $LATENCY a request (scripts/list-server.py), medians"
echo
python3 - "$work/samples" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, n, *v = line.split()
    rows[(label, int(n))].append([float(x) for x in v])
print("| mount | objects | mount returns | first `ls` | full walk | RSS after the walk | peak RSS |")
print("|---|---|---|---|---|---|---|")
for (label, n), samples in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    m = [statistics.median(col) for col in zip(*samples)]
    print(f"| {label} | {n:,} | {m[0]:.2f} s | {m[1]:.3f} s | {m[2]:.1f} s | {m[3] / 1024:.0f} MiB | {m[4] / 1024:.0f} MiB |")
PY
