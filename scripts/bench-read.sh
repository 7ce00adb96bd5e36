#!/usr/bin/env bash
# Read throughput through coorfs beside the native path and bindfs, hot (source pages in
# memory), in one run:
#   (a) small: 20,000 files of 100 KiB, read whole in random order by 2 reader processes;
#   (b) big: one 2 GiB file read sequentially with 1 MiB reads, by 1 process;
#   (c) quarter: the files of (a) through a cache that holds a quarter of them
#       (--cache-size 512M), so that most are read from the source every epoch.
# coorfs runs twice: as mounted by default (the kernel reads cached files, and files the cache
# will not keep, by FUSE passthrough) and with --no-passthrough (every read through the daemon).
# Each repetition measures every system back to back (after one warm-up epoch each), so they
# share the machine's noise; the table gives medians and the median of the per-repetition
# ratios. A second table gives the daemon's CPU time (user + system) per GiB read. Not a CI
# test: it takes a few minutes and needs bindfs.
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
cpu="$work/cpu.txt"

# daemon_cpu MOUNT: the CPU seconds (user + system) the mount's daemon has used.
daemon_cpu() {
    local pid
    pid=$(getfattr --only-values -n user.coorfs.pid "$1" 2>/dev/null || python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], "user.coorfs.pid").decode())' "$1")
    awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$pid/stat"
}

# rate WORKLOAD SYSTEM REP DIR PROCS: one epoch, MiB/s appended to the samples (and for a
# coorfs mount, its daemon's CPU seconds per GiB to the CPU samples).
rate() {
    local out mibs before after
    [[ $2 == coorfs* ]] && before=$(daemon_cpu "$4")
    out=$($coorfs read --json --procs "$5" --seed "$3" "$4")
    mibs=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["mib_per_sec"])' <<< "$out")
    echo "$1 $2 $3 $mibs" >> "$samples"
    echo "  $1 $2 rep $3: $mibs MiB/s" >&2
    if [[ $2 == coorfs* ]]; then
        after=$(daemon_cpu "$4")
        python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(sys.argv[2], sys.argv[3], sys.argv[4], (float(sys.argv[6]) - float(sys.argv[5])) / (d["bytes"] / 2**30))' \
            "$out" "$1" "$2" "$3" "$before" "$after" >> "$cpu"
    fi
}

for workload in small big quarter; do
    src="$DATA/$workload"; cache=()
    procs=2; [ $workload = big ] && procs=1
    [ $workload = quarter ] && { src="$DATA/small"; cache=(--cache-size 512M); }
    mkdir -p "$work/coorfs-mnt" "$work/nopt-mnt" "$work/bindfs-mnt"
    $coorfs mount "${cache[@]}" "$src" "$work/coorfs-mnt"
    $coorfs mount "${cache[@]}" --no-passthrough "$src" "$work/nopt-mnt"
    bindfs "$src" "$work/bindfs-mnt"
    declare -A dir=([native]="$src" [coorfs]="$work/coorfs-mnt" [coorfs-nopt]="$work/nopt-mnt" [bindfs]="$work/bindfs-mnt")
    systems=(native coorfs coorfs-nopt bindfs)
    for sys in "${systems[@]}"; do
        $coorfs read --procs "$procs" --sorted "${dir[$sys]}" >/dev/null   # warm-up
    done
    for rep in $(seq 1 "$REPS"); do
        for sys in "${systems[@]}"; do
            rate "$workload" "$sys" "$rep" "${dir[$sys]}" "$procs"
        done
    done
    $coorfs umount "$work/coorfs-mnt"
    $coorfs umount "$work/nopt-mnt"
    fusermount3 -u "$work/bindfs-mnt"
done

echo
echo "scripts/bench-read.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo "small = 20,000 x 100 KiB files, 2 readers, random order; big = one 2 GiB file, 1 MiB reads;"
echo "quarter = small through a 512 MiB cache; coorfs-nopt = coorfs --no-passthrough"
echo
python3 scripts/benchstats.py --baseline native --also coorfs/coorfs-nopt --also coorfs/bindfs < "$samples"
echo
echo "The daemon's CPU seconds per GiB read (lower is better):"
echo
python3 scripts/benchstats.py --baseline coorfs-nopt --unit "CPU s/GiB" --digits 3 < "$cpu"
