#!/usr/bin/env bash
# The whole thing on a built-in sample: build coorfs, generate a small dataset, mount it,
# read a few epochs through the mount beside the source, print what coorfs saw, unmount.
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

echo "== mounting $work/data at $mnt"
mkdir "$mnt"
$coorfs mount "$work/data" "$mnt"
grep " $mnt " /proc/mounts

echo "== reading $EPOCHS epochs from the source, then through the mount (2 processes, random order)"
$coorfs read --procs 2 --epochs "$EPOCHS" "$work/data"
$coorfs read --procs 2 --epochs "$EPOCHS" "$mnt"

echo "== checking every byte"
diff -r "$work/data" "$mnt" && echo "identical"

echo "== unmounting"
$coorfs umount "$mnt"
echo "done"
