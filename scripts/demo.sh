#!/usr/bin/env bash
# What coorfs is for, in about a minute: a dataset twice the memory it may use, read for a few
# epochs in a fresh random order each, natively and through a coorfs mount, under the same
# memory limit and from the same throttled storage. Natively the page cache (LRU) evicts what
# the next epoch needs; coorfs keeps what it cached (MinIO), so from epoch 2 on it hits the
# cached fraction of the reads and reads less from storage.
#
#   - the dataset: FILES files of ~100 KiB (8,000: 780 MiB), generated in DEMO_DIR (/var/tmp,
#     on disk on most systems, where /tmp may be memory) and removed at the end;
#   - the reader: `coorfs read`, PROCS processes (4, like a DataLoader's workers), EPOCHS
#     epochs (3), the same orders on both sides (--seed 1);
#   - memory: each side runs in a memory cgroup of half the dataset + 96 MiB. Natively all of
#     it can hold page cache; the mount gets --cache-size of half the dataset, and the rest is
#     its daemon's (64 MiB, the allowance of src/budget.rs), its staging area's
#     (--prefetch-memory 16M) and the reader's (16 MiB);
#   - storage: reads from the dataset's disk throttled to BPS (100 MiB/s) in that cgroup, as
#     network storage would be;
#   - the dataset's pages are dropped from the page cache before each side.
# Where cgroups cannot be made (not root, a read-only /sys/fs/cgroup) it says so and reads
# without a limit, where the page cache holds everything and only the mount's cost shows; where
# reads cannot be throttled it says so and reads at the disk's speed. Then it checks that the
# mount hit at least what it cached and that every byte read through it equals the source's,
# unmounts and cleans up. Exits non-zero when a check fails.
#
# First the packages it needs (scripts/prereqs.sh: protoc to build, fuse3, python3): as root
# with apt-get it installs them; otherwise it prints the one command that does and exits 1.
#
#   scripts/demo.sh
#   FILES=20000 EPOCHS=4 BPS=$((200 << 20)) scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

FILES=${FILES:-8000}
EPOCHS=${EPOCHS:-3}
PROCS=${PROCS:-4}
BPS=${BPS:-$((100 << 20))}
STAGING=$((16 << 20))
# Beside the cache: the daemon (src/budget.rs's 64 MiB allowance), its staging area and the
# reader's 3 processes (a few MiB each).
EXTRA=$(((64 << 20) + STAGING + (16 << 20)))

# Prerequisites (scripts/prereqs.sh, with the tests' and CI's): installed with apt-get when we
# are root, otherwise named in one line, before anything is built.
source scripts/prereqs.sh
prereqs demo.sh build demo

source scripts/benchlib.sh

echo "== building (cargo build --release)"
cargo build --release --quiet
coorfs=$PWD/target/release/coorfs

bench_start demo "${DEMO_DIR:-/var/tmp}"
data=$work/data
python3 scripts/make-dataset.py --files "$FILES" --size 100K --classes 10 "$data" | sed 's/^/   /'
dataset_bytes=$(file_bytes "$data")
cache=$(((dataset_bytes / 2) >> 20 << 20))
limit=$((cache + EXTRA))
dev=$(device_of "$data")

# What this machine allows: a memory limit (mode limited or plain) and a read throttle.
mode=plain
if [ "$(id -u)" != 0 ]; then
    why="not root"
elif ! cg_create "$cg" "$limit" 0 "" 2> "$work/err"; then
    why="cannot create a memory cgroup ($(tr -s '\n' ' ' < "$work/err" | sed 's/ $//'))"
else
    mode=limited
fi
cg_destroy "$cg"
bps=0
if [ "$mode" = plain ]; then
    throttle="not throttled (no cgroup)"
elif [ ! -e "/sys/dev/block/$dev" ]; then
    throttle="not throttled: $data is on no block device ($(findmnt -no FSTYPE -T "$data"));
            on tmpfs the dataset is memory whatever the limit: set DEMO_DIR to a directory on disk"
elif ! cg_create "$cg" 0 "$BPS" "$dev" 2> "$work/err"; then
    throttle="not throttled: the kernel refused a read limit on $dev ($(tr -s '\n' ' ' < "$work/err" | sed 's/ $//'))"
else
    bps=$BPS
    throttle="throttled to $((BPS >> 20)) MiB/s (cgroup v$CG_VERSION, disk $dev), as network storage would be"
fi
cg_destroy "$cg"
counted=$((bps != 0))  # the cgroup that throttles also counts the bytes read

echo "== the setup"
if [ "$mode" = limited ]; then
    echo "   memory:  each side in a memory cgroup of $((limit >> 20)) MiB (cgroup v$CG_VERSION): natively all"
    echo "            of it can be page cache; coorfs caches $((cache >> 20)) MiB (half the dataset) and the"
    echo "            rest is its daemon's and the reader's"
else
    echo "   memory:  NO LIMIT: $why."
    echo "            The page cache will hold the whole dataset after epoch 1, so this run shows what"
    echo "            the mount costs, not what it is for: run as root with a writable /sys/fs/cgroup"
fi
echo "   storage: $throttle"

# in_cgroup CMD...: CMD in the run's cgroup, or plainly without one.
in_cgroup() {
    if [ "$mode" = limited ]; then cg_run "$cg" "$@"; else "$@"; fi
}

# epochs SIDE DIR: reads EPOCHS epochs of DIR (2 reader processes, seed 1) with the dataset's
# pages dropped first; writes "epoch seconds storage_bytes" lines to $work/SIDE (storage bytes
# "-" where the cgroup cannot count them).
epochs() {
    local before now
    before=$( ((counted)) && cg_read_bytes "$cg" "$dev" || echo -)
    in_cgroup "$coorfs" read --json --procs "$PROCS" --epochs "$EPOCHS" --seed 1 "$2" |
        while read -r report; do
            now=$( ((counted)) && cg_read_bytes "$cg" "$dev" || echo -)
            echo "$report" | python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["epoch"], r["seconds"], end=" ")'
            if [ "$now" = - ]; then echo -; else echo $((now - before)); fi
            before=$now
        done > "$work/$1"
    [ "$(wc -l < "$work/$1")" = "$EPOCHS" ] || { echo "demo.sh: the $1 reader did not finish its epochs" >&2; exit 1; }
}

echo "== native: $EPOCHS epochs of $data"
drop_pages "$data"
if [ "$mode" = limited ]; then cg_create "$cg" "$limit" "$bps" "$dev"; fi
epochs native "$data"
cg_destroy "$cg"

echo "== coorfs: mount it with --cache-size $((cache >> 20))M, then the same $EPOCHS epochs through the mount"
drop_pages "$data"
if [ "$mode" = limited ]; then cg_create "$cg" "$limit" "$bps" "$dev"; fi
in_cgroup "$coorfs" mount --cache-size "$cache" --prefetch-memory "$STAGING" "$data" "$mnt"
wait_scan "$mnt"
epochs coorfs "$mnt"
"$coorfs" stats --json "$mnt" > "$work/stats.json"

echo
python3 - "$work/native" "$work/coorfs" "$work/stats.json" "$dataset_bytes" <<'PY'
import json, sys
native, mount, stats, dataset = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), int(sys.argv[4])
epochs = stats["epochs"]
def rows(path):
    return [line.split() for line in open(path)]
def mib(storage):
    return "-" if storage == "-" else "%d" % (int(storage) >> 20)
print("         ------- native -------   ------- coorfs -------")
print(" epoch   seconds  storage MiB  hit   seconds  storage MiB  hit   coorfs speed")
for (epoch, ns, nb), (_, cs, cb) in zip(rows(native), rows(mount)):
    e = epochs[int(epoch) - 1]
    if cb == "-":
        cb = e["bytes_from_source"]
    native_hit = "-" if nb == "-" else "%.2f" % max(0.0, 1 - int(nb) / dataset)
    print("%6s %9.2f %12s %5s %9.2f %12s %5.2f %12.2fx" % (
        epoch, float(ns), mib(nb), native_hit, float(cs), mib(cb), e["hit_rate"], float(ns) / float(cs)))
print("hit: coorfs counts its hits; natively it is 1 - bytes read from storage / the dataset's bytes")
PY

echo
echo "== what coorfs saw (coorfs stats $mnt, its dataset-wide epochs)"
"$coorfs" stats "$mnt" | sed -n '/^dataset epochs/,/^$/p' | sed '/^$/d; s/^/   /'

echo "== checks"
failed=0
# MinIO keeps what it admitted: from epoch 2 on, at least the cached fraction of reads hit.
if python3 - "$work/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
cached = s["cached_bytes"] / s["dataset_bytes"]
later = [e["hit_rate"] for e in s["epochs"][1:]]
print("   cached %.2f of the dataset; epochs 2+ hit %s" % (cached, ", ".join("%.2f" % h for h in later)))
sys.exit(0 if later and min(later) >= cached - 0.02 else 1)
PY
then
    echo "   ok: from epoch 2 on, the mount hits at least what it caches"
else
    echo "   FAILED: the mount hit less than it caches" >&2
    failed=1
fi
# Whole-file reads: diff -r reads in 4 KiB pieces, each a round trip to the daemon for a file
# served with direct I/O (10 s here instead of 3).
if python3 - "$data" "$mnt" <<'PY'
import os, sys
src, mnt = sys.argv[1], sys.argv[2]
def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
names, bad = tree(src), []
if tree(mnt) != names:
    bad.append("the file lists differ")
for name in names:
    with open(os.path.join(src, name), "rb") as a, open(os.path.join(mnt, name), "rb") as b:
        if a.read() != b.read():
            bad.append(name)
print("   %d files compared" % len(names))
for b in bad[:5]:
    print("   differs: " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
then
    echo "   ok: every byte read through the mount equals the source's"
else
    echo "   FAILED: the mount differs from the source" >&2
    failed=1
fi

echo "== unmounting"
"$coorfs" umount "$mnt"
cg_destroy "$cg"
if [ "$failed" != 0 ]; then
    echo "demo.sh: a check failed" >&2
    exit 1
fi
echo "done"
