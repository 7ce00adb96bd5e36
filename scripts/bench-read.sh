#!/usr/bin/env bash
# Read throughput through coorfs beside the native path and bindfs, hot (source pages in
# memory), in one run:
#   (a) 20,000 files of 100 KiB, read whole in random order by 2 reader processes;
#   (b) one 2 GiB file read sequentially with 1 MiB reads, by 1 process.
# Each repetition measures native, coorfs and bindfs back to back (after one warm-up epoch
# each), so they share the machine's noise; the table gives medians and the median of the
# per-repetition ratios. Not a CI test: it takes a few minutes and needs bindfs.
#
#   scripts/bench-read.sh                    # REPS=5, data in /var/tmp/coorfs-bench
#   REPS=9 DATA=/scratch/bench scripts/bench-read.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-5}
DATA=${DATA:-/var/tmp/coorfs-bench}
command -v bindfs >/dev/null || { echo "bench-read.sh: needs bindfs (apt-get install bindfs)" >&2; exit 2; }

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
python3 scripts/make-dataset.py --files 20000 --size 100K --exact --classes 100 "$DATA/small" >/dev/null
mkdir -p "$DATA/big"
[ "$(stat -c %s "$DATA/big/big.bin" 2>/dev/null)" = 2147483648 ] || head -c 2G /dev/urandom > "$DATA/big/big.bin"

work=$(mktemp -d /tmp/coorfs-bench.XXXXXX)
cleanup() {
    for m in "$work"/*-mnt; do
        if grep -qs " $m fuse.coorfs " /proc/mounts; then $coorfs umount "$m" || umount -l "$m"; fi
        if grep -qs " $m fuse " /proc/mounts; then fusermount3 -u "$m" || umount -l "$m"; fi
    done
    rm -rf "$work"
}
trap cleanup EXIT
samples="$work/samples.txt"

# rate WORKLOAD SYSTEM REP DIR PROCS: one epoch, MiB/s appended to the samples.
rate() {
    local mibs
    mibs=$($coorfs read --json --procs "$5" --seed "$3" "$4" | python3 -c 'import json,sys; print(json.load(sys.stdin)["mib_per_sec"])')
    echo "$1 $2 $3 $mibs" >> "$samples"
    echo "  $1 $2 rep $3: $mibs MiB/s" >&2
}

for workload in small big; do
    src="$DATA/$workload"
    procs=2; [ $workload = big ] && procs=1
    mkdir -p "$work/coorfs-mnt" "$work/bindfs-mnt"
    $coorfs mount "$src" "$work/coorfs-mnt"
    bindfs "$src" "$work/bindfs-mnt"
    declare -A dir=([native]="$src" [coorfs]="$work/coorfs-mnt" [bindfs]="$work/bindfs-mnt")
    for sys in native coorfs bindfs; do
        $coorfs read --procs "$procs" --sorted "${dir[$sys]}" >/dev/null   # warm-up
    done
    for rep in $(seq 1 "$REPS"); do
        for sys in native coorfs bindfs; do
            rate "$workload" "$sys" "$rep" "${dir[$sys]}" "$procs"
        done
    done
    $coorfs umount "$work/coorfs-mnt"
    fusermount3 -u "$work/bindfs-mnt"
done

echo
echo "scripts/bench-read.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo "small = 20,000 x 100 KiB files, 2 readers, random order; big = one 2 GiB file, 1 MiB reads"
echo
python3 scripts/benchstats.py --baseline native --also coorfs/bindfs < "$samples"
