#!/usr/bin/env bash
# A million tiny files: 1,280,000 files of 200-600 bytes in 1,000 directories (ImageNet's
# count, metadata-bound rather than byte-bound), native beside coorfs in one run:
#   - listing: `find DIR -type f` with cold dentries (echo 2 > /proc/sys/vm/drop_caches drops
#     the kernel's dentries and inodes; a fresh mount has none), and the mount's own scan
#     (mount to scan_complete);
#   - epoch 1 cold: the dataset's pages dropped (posix_fadvise per file), a fresh mount;
#     `coorfs read --procs 2`, one epoch, random order;
#   - epochs 2-3 hot: native from the page cache, coorfs with the whole dataset cached
#     (--cache-size 1G);
#   - coorfs twice: as mounted by default, and with --fast-open (no OPEN round trips);
#   - the daemon's peak RSS (VmHWM) and its node table (metadata_bytes).
# Not a CI test: generating the dataset takes about 10 minutes the first time, a run ~15.
#
#   scripts/bench-scale.sh
#   DATA=/scratch scripts/bench-scale.sh
#   FILES=128000 scripts/bench-scale.sh    # a tenth of the scale (100 directories), ~2 minutes
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh
DATA=${DATA:-/var/tmp/coorfs-bench}
CACHE=${CACHE:-1G}
FILES=${FILES:-1280000}

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
if [ "$FILES" = 1280000 ]; then src=$DATA/tiny; else src=$DATA/tiny-$FILES; fi
python3 scripts/make-dataset.py --files "$FILES" --size 200 --max-size 600 --classes $((FILES / 1280)) "$src" >/dev/null
work=$(mktemp -d /tmp/coorfs-scale.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
    grep -qs " $mnt fuse" /proc/mounts && { $coorfs umount "$mnt" || umount -l "$mnt"; }
    rm -rf "$work"
}
trap cleanup EXIT
stat_of() { getfattr -n "user.coorfs.$1" --only-values "$mnt" 2>/dev/null; }
wait_scan() { # bounded: a scan of 1.28 M files takes seconds, not minutes
    local i
    for ((i = 0; i < 3000; i++)); do
        [ "$(stat_of scan_complete)" = 1 ] && return 0
        sleep 0.1
    done
    echo "bench-scale.sh: the scan of $src did not complete within 5 minutes" >&2
    exit 1
}
seconds() { python3 -c "import time; print(time.monotonic())"; }
elapsed() { python3 -c "print(f'{$(seconds) - $1:.2f}')"; }
epoch_secs() { # epoch_secs DIR EPOCHS: each epoch's seconds, space separated
    $coorfs read --json --procs 2 --epochs "$2" --seed 1 "$1" \
        | python3 -c 'import json,sys; print(" ".join("%.2f" % json.loads(l)["seconds"] for l in sys.stdin if l.strip()))'
}

echo "native listing (cold dentries)" >&2
sync; echo 2 > /proc/sys/vm/drop_caches
t=$(seconds); n_native=$(find "$src" -type f | wc -l); find_native=$(elapsed "$t")

# One fresh mount per mode: its scan, a cold find, then epoch 1 cold and epochs 2-3 hot.
declare -A scan find_mount mine peak metadata hit
for mode in default fast-open; do
    opts=(--cache-size "$CACHE")
    [ "$mode" = fast-open ] && opts+=(--fast-open)
    echo "coorfs $mode: scan, listing, epochs (epoch 1 cold)" >&2
    sync; echo 2 > /proc/sys/vm/drop_caches
    drop_pages "$src"
    t=$(seconds)
    $coorfs mount "${opts[@]}" "$src" "$mnt"
    wait_scan
    scan[$mode]=$(elapsed "$t")
    t=$(seconds); n_mount=$(find "$mnt" -type f | wc -l); find_mount[$mode]=$(elapsed "$t")
    [ "$n_native" = "$n_mount" ] || { echo "bench-scale.sh: $n_native files natively, $n_mount through the mount" >&2; exit 1; }
    mine[$mode]=$(epoch_secs "$mnt" 3)
    pid=$(stat_of pid)
    peak[$mode]=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
    metadata[$mode]=$(stat_of metadata_bytes)
    hit[$mode]=$(stat_of hit_rate)
    $coorfs umount "$mnt"
done

echo "native epochs (epoch 1 cold)" >&2
drop_pages "$src"
read -r -a native <<< "$(epoch_secs "$src" 3)"
read -r -a plain <<< "${mine[default]}"
read -r -a fast <<< "${mine[fast-open]}"

ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }
echo
echo "scripts/bench-scale.sh on $(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD): $n_native files of 200-600 B, --cache-size $CACHE"
echo
echo "| measure | native s | coorfs s | speed / native | coorfs --fast-open s | speed / native |"
echo "|---|---|---|---|---|---|"
echo "| find -type f, cold dentries | $find_native | ${find_mount[default]} | $(ratio "$find_native" "${find_mount[default]}") | ${find_mount[fast-open]} | $(ratio "$find_native" "${find_mount[fast-open]}") |"
echo "| mount to scan complete | $find_native (find) | ${scan[default]} | $(ratio "$find_native" "${scan[default]}") | ${scan[fast-open]} | $(ratio "$find_native" "${scan[fast-open]}") |"
for i in 0 1 2; do
    echo "| epoch $((i + 1))$([ $i = 0 ] && echo ' (cold)' || echo ' (hot)') | ${native[$i]} | ${plain[$i]} | $(ratio "${native[$i]}" "${plain[$i]}") | ${fast[$i]} | $(ratio "${native[$i]}" "${fast[$i]}") |"
done
echo
for mode in default fast-open; do
    echo "$mode: daemon peak RSS $((peak[$mode] >> 10)) MiB; node table $((metadata[$mode] >> 20)) MiB ($((metadata[$mode] / n_native)) bytes a file); hit rate over the run ${hit[$mode]}."
done
