#!/usr/bin/env bash
# The whole thing on a built-in sample: build coorfs, generate a small dataset, mount it with a
# cache of half its size, read a few epochs through the mount beside the source, print what
# coorfs saw (MinIO keeps the cached half as every later epoch's hit rate), ask coorfs
# analyze what it predicts, unmount.
#
#   scripts/demo.sh            # 2,000 files of ~100 KiB
#   FILES=20000 scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

FILES=${FILES:-2000}
EPOCHS=${EPOCHS:-3}
work=$(mktemp -d /tmp/coorfs-demo.XXXXXX)
mnt="$work/mnt"
cleanup() {
    if grep -qs " $mnt fuse.coorfs " /proc/mounts; then target/release/coorfs umount "$mnt" || umount -l "$mnt"; fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "== building"
cargo build --release --quiet
coorfs=target/release/coorfs

echo "== generating $FILES files in $work/data"
python3 scripts/make-dataset.py --files "$FILES" --size 100K --classes 10 "$work/data"

half=$(( $(du -sb --apparent-size "$work/data" | cut -f1) / 2 ))
echo "== mounting $work/data at $mnt with a cache of half the dataset ($half bytes)"
mkdir "$mnt"
$coorfs mount --cache-size "$half" "$work/data" "$mnt"
grep " $mnt " /proc/mounts
until [ "$(getfattr --absolute-names -n user.coorfs.scan_complete --only-values "$mnt")" = 1 ]; do sleep 0.1; done

echo "== reading $EPOCHS epochs from the source, then through the mount (2 processes, random order)"
$coorfs read --procs 2 --epochs "$EPOCHS" "$work/data"
$coorfs read --procs 2 --epochs "$EPOCHS" "$mnt"

echo "== what coorfs saw (coorfs stats)"
$coorfs stats "$mnt"

echo "== checking every byte"
diff -r "$work/data" "$mnt"   # under set -e, a difference ends the demo with its status
echo "identical"

echo "== what coorfs analyze predicts for this dataset and cache"
$coorfs analyze --cache-size "$half" --time 2s "$work/data" 2>/dev/null | sed -n '/^hit rate/,$p' 

echo "== unmounting"
$coorfs umount "$mnt"
echo "done"
