#!/usr/bin/env bash
# A cache that survives restarts: epochs of bench-epochs.sh's dataset from slow storage, with
# coorfs's disk tier (--cache-dir on the local disk), cold and after the daemon restarts,
# beside the native page cache and coorfs with memory alone, in one run.
#
#   scripts/bench-restart.sh
#
# The dataset: 20,000 files of ~110 KiB (2.25 GB). The storage: latency-bound, like network
# storage: the dataset behind a passthrough mount that adds DELAY (2 ms) to every read
# (coorfs --policy none --no-prefetch --read-delay, outside every budget), as
# bench-epochs.sh's "lat". (A blkio throttle would slow the disk tier too: the dataset and
# the disk tier share this machine's one disk.) The memory budget is 1 GiB for every side;
# PROCS (2) reader processes, EPOCHS (3) epochs, each in a fresh random order. Systems:
#   native  - the reader on the delay mount, in a cgroup of 1 GiB: the page cache's share;
#   memory  - coorfs --cache-size 1G with remaining-set prefetch, no disk tier, cold;
#   cold    - the same with a disk tier of DISK (4G) in a fresh directory under CACHE_BASE
#             (/var/tmp, the local disk): epoch 1 reads the storage and fills the disk;
#   restart - the same mount again over the disk tier "cold" left behind (the daemon
#             unmounted and started afresh: memory empty, the disk kept).
# coorfs's daemon and reader share one cgroup of 1 GiB + OVERHEAD (64 MiB) + the staging area
# (256 MiB); the disk tier's index is inside it. Per epoch: time, bytes read from storage (the
# delay mount's bytes_from_source) and hit rate (a file wholly in memory or on disk is a hit).
#
#   REPS=3 scripts/bench-restart.sh
#   FILES=300 REPS=1 EPOCHS=2 DATA=/var/tmp/tiny scripts/bench-restart.sh   # a dry run
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

REPS=${REPS:-3}
EPOCHS=${EPOCHS:-3}
PROCS=${PROCS:-2}
DATA=${DATA:-/var/tmp/coorfs-bench/epochs}
FILES=${FILES:-20000}
BUDGET=${BUDGET:-$((1 << 30))}
OVERHEAD=${OVERHEAD:-$((64 << 20))}
STAGING=${STAGING:-$((256 << 20))}
DISK=${DISK:-4G}
DELAY=${DELAY:-2ms}
CACHE_BASE=${CACHE_BASE:-/var/tmp}
SYSTEMS=${SYSTEMS:-"native memory cold restart"}

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
python3 scripts/make-dataset.py --files "$FILES" --size 110K --classes 100 "$DATA" >/dev/null
dataset_bytes=$(du -sb --apparent-size "$DATA" | cut -f1)

bench_start restart
slow="$work/slow"
mkdir "$slow"
disk=$(mktemp -d "$CACHE_BASE/coorfs-disk-tier.XXXXXX")
cleanup() {
    if grep -qs " $slow fuse.coorfs " /proc/mounts; then $coorfs umount "$slow" || umount -l "$slow"; fi
    rm -rf "$disk"
    bench_cleanup
}
trap cleanup EXIT
samples=$work/samples.txt
: > "$samples"

# The delay mount reads the dataset from the page cache (warmed here, outside every budget),
# so that what it adds is latency alone.
$coorfs read --procs 2 --sorted "$DATA" >/dev/null
$coorfs mount --policy none --no-prefetch --read-delay "$DELAY" "$DATA" "$slow"
wait_scan "$slow"

# One-line JSON of the mount's dataset-wide epoch E's record field F.
epoch_field() {
    coorfs_stat "$mnt" stats | python3 -c "import json,sys; print(json.load(sys.stdin)['epochs'][$1 - 1]['$2'])"
}

for rep in $(seq 1 "$REPS"); do
    rm -rf "${disk:?}"/*
    for sys in $SYSTEMS; do
        drop_pages "$slow"
        dir=$slow
        if [ "$sys" = native ]; then
            cg_create "$cg" "$BUDGET" 0 0
        else
            cg_create "$cg" $((BUDGET + OVERHEAD + STAGING)) 0 0
            opts=(--job-key pgid --cache-size "$BUDGET" --prefetch-memory "$STAGING")
            [ "$sys" = memory ] || opts+=(--cache-dir "$disk" --disk-cache-size "$DISK")
            cg_run "$cg" "$coorfs" mount "${opts[@]}" "$slow" "$mnt"
            wait_scan "$mnt"
            dir=$mnt
        fi
        for epoch in $(seq 1 "$EPOCHS"); do
            before=$(coorfs_stat "$slow" bytes_from_source)
            secs=$(cg_run "$cg" "$coorfs" read --json --procs "$PROCS" --seed $((rep * 100 + epoch)) "$dir" |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
            after=$(coorfs_stat "$slow" bytes_from_source)
            hit=-
            [ "$sys" = native ] || hit=$(epoch_field "$epoch" hit_rate)
            echo "$sys $rep $epoch $secs $((after - before)) $hit" | tee -a "$samples" >&2
        done
        if [ "$sys" != native ]; then
            echo "  $sys: cached_bytes=$(coorfs_stat "$mnt" cached_bytes) disk_cached_bytes=$(coorfs_stat "$mnt" disk_cached_bytes)" \
                "bytes_from_disk=$(coorfs_stat "$mnt" bytes_from_disk) disk_dropped=$(coorfs_stat "$mnt" disk_dropped);" \
                "peak memory of daemon+reader: $(cat "$CG_MEM/$cg/memory.max_usage_in_bytes" 2>/dev/null || cat "$CG_V2/$cg/memory.peak") bytes" >&2
            $coorfs umount "$mnt"
        fi
        cg_destroy "$cg"
    done
done

echo
echo "scripts/bench-restart.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d): $FILES files," \
    "$((dataset_bytes / 1000000)) MB; budget $((BUDGET >> 20)) MiB, disk tier $DISK on $(findmnt -no SOURCE -T "$CACHE_BASE");" \
    "$PROCS readers; storage: $DELAY a read"
echo
python3 scripts/epochstats.py --baseline native --dataset-bytes "$dataset_bytes" < "$samples"
