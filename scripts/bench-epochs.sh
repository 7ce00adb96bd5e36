#!/usr/bin/env bash
# The paper's experiment on this machine: a dataset twice the memory budget, read in a fresh
# random order every epoch, from throttled storage.
#
#   20,000 files of ~110 KiB (2.2 GB); memory budget 1 GiB for every side; storage throttled
#   to 200 MiB/s (cgroup v1 blkio); 2 reader processes; 5 epochs.
#   - native: the reader alone in a cgroup with a 1 GiB memory limit (its page cache lives
#     inside it);
#   - coorfs minio / coorfs lru: --cache-size 1G, and the daemon and the reader together in
#     one cgroup limited to 1 GiB plus the daemon's overhead (OVERHEAD, 64 MiB: measured
#     ~12 MiB for this dataset, plus fetch buffers in flight).
# Per epoch: time, bytes read from storage (the cgroup's blkio counter), hit rate (coorfs's
# own per-epoch stats; for native, 1 - storage bytes / dataset bytes).
#
#   scripts/bench-epochs.sh                 # REPS=3
#   REPS=5 BPS=$((200<<20)) scripts/bench-epochs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

REPS=${REPS:-3}
EPOCHS=${EPOCHS:-5}
DATA=${DATA:-/var/tmp/coorfs-bench/epochs}
BUDGET=${BUDGET:-$((1 << 30))}
OVERHEAD=${OVERHEAD:-$((64 << 20))}
BPS=${BPS:-$((200 << 20))}
SYSTEMS=${SYSTEMS:-"native minio lru"}

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
python3 scripts/make-dataset.py --files 20000 --size 110K --classes 100 "$DATA" >/dev/null
dev=$(device_of "$DATA")
dataset_bytes=$(du -sb --apparent-size "$DATA" | cut -f1)

work=$(mktemp -d /tmp/coorfs-bench-epochs.XXXXXX)
mnt="$work/mnt"
mkdir "$mnt"
cg="coorfs-bench-$$"
cleanup() {
    if grep -qs " $mnt fuse.coorfs " /proc/mounts; then $coorfs umount "$mnt" || umount -l "$mnt"; fi
    cg_destroy "$cg"
    rm -rf "$work"
}
trap cleanup EXIT
# SAMPLES=FILE keeps the per-epoch samples for another script (bench-analyze.sh) to read.
samples=${SAMPLES:-$work/samples.txt}

for rep in $(seq 1 "$REPS"); do
    for sys in $SYSTEMS; do
        drop_pages "$DATA"
        if [ "$sys" = native ]; then
            cg_create "$cg" "$BUDGET" "$BPS" "$dev"
            dir="$DATA"
        else
            cg_create "$cg" $((BUDGET + OVERHEAD)) "$BPS" "$dev"
            cg_run "$cg" "$coorfs" mount --policy "$sys" --cache-size "$BUDGET" "$DATA" "$mnt"
            wait_scan "$mnt"
            dir="$mnt"
        fi
        for epoch in $(seq 1 "$EPOCHS"); do
            before=$(cg_read_bytes "$cg" "$dev")
            secs=$(cg_run "$cg" "$coorfs" read --json --procs 2 --seed $((rep * 100 + epoch)) "$dir" |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
            after=$(cg_read_bytes "$cg" "$dev")
            hit=-
            if [ "$sys" != native ]; then
                hit=$(coorfs_stat "$mnt" stats 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['epochs'][$epoch - 1]['hit_rate'])")
            fi
            echo "$sys $rep $epoch $secs $((after - before)) $hit" | tee -a "$samples" >&2
        done
        if [ "$sys" != native ]; then
            echo "  $sys cached_bytes=$(coorfs_stat "$mnt" cached_bytes 2>/dev/null) of dataset $dataset_bytes;" \
                "peak memory of daemon+reader: $(cat "$CG_MEM/$cg/memory.max_usage_in_bytes") bytes" >&2
            $coorfs umount "$mnt"
        fi
        cg_destroy "$cg"
    done
done

echo
echo "scripts/bench-epochs.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d): 20,000 files," \
    "$((dataset_bytes / 1000000)) MB; budget $((BUDGET >> 20)) MiB; storage $((BPS >> 20)) MiB/s; 2 readers"
echo
python3 scripts/epochstats.py --baseline native --dataset-bytes "$dataset_bytes" < "$samples"
