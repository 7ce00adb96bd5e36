#!/usr/bin/env bash
# Shards: a dataset of WebDataset .tar shards (scripts/make-shards.py), each read whole and in
# order, the shards in a fresh order every epoch, split across PROCS reader processes.
#
#   scripts/bench-shards.sh local          # a directory: native beside coorfs, about 10 minutes
#   READER=wds scripts/bench-shards.sh local   # the same, read by the webdataset package
#   scripts/bench-shards.sh s3             # an S3 store: boto3, s3torch, rclone, coorfs (bench-s3.sh)
#   SHARDS=8 REPS=1 EPOCHS=2 scripts/bench-shards.sh local   # a dry run
#
# local: SHARDS shards of SHARD_SIZE (32 x 24 MiB) in a directory on the local disk, read by
# scripts/shard-epoch.py with READ_SIZE reads (16 KiB, what tarfile and TFRecord readers ask
# for; READER=wds: by webdataset itself, from the venv scripts/test.sh makes in target/moto).
# Each side runs in a memory cgroup of POD bytes (384 MiB: half the dataset) with reads from
# the disk throttled to RATE (150 MiB/s): native reads the directory (the page cache gets the
# pod), coorfs mounts it with default options, its daemon in the same cgroup. Per epoch:
# seconds, MiB read from the disk (the cgroup's I/O count), and for coorfs the byte hit rate
# and the floor: the time to read what its cache lacks at RATE. The summary gives medians, the
# ratio native / coorfs, and coorfs against its floor.
#
# s3: scripts/bench-s3.sh with the same shards (SHARDS, SHARD_SIZE), POD (384 MiB), DISK (256
# MiB of local disk for rclone's and coorfs's caches) and SYSTEMS (boto3 s3torch rclone coorfs
# hint; s3torch is s3torchconnector's CRT reader), once unpaced and once with every answer paced
# at 100 MiB/s (PACES="0 100M").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

SIDE=${1:-local}
REPS=${REPS:-3}
EPOCHS=${EPOCHS:-3}
SHARDS=${SHARDS:-32}
SHARD_SIZE=${SHARD_SIZE:-24M}
POD=${POD:-$((384 << 20))}
PROCS=${PROCS:-2}

if [ "$SIDE" = s3 ]; then
    for pace in ${PACES:-0 100M}; do
        echo "== bench-shards.sh s3: answers paced at $pace/s (0: unpaced)"
        SHARDS=$SHARDS SHARD_SIZE=$SHARD_SIZE POD=$POD DISK=${DISK:-$((256 << 20))} PACE=$pace \
            REPS=$REPS EPOCHS=$EPOCHS PROCS=$PROCS SYSTEMS=${SYSTEMS:-"boto3 s3torch rclone coorfs hint"} \
            scripts/bench-s3.sh
    done
    exit 0
fi
if [ "$SIDE" != local ]; then
    echo "bench-shards.sh: local or s3, not \"$SIDE\"" >&2
    exit 2
fi

RATE=${RATE:-$((150 << 20))}
READ_SIZE=${READ_SIZE:-16K}
READER=${READER:-plain}
DATA=${DATA:-/var/tmp/coorfs-bench/shards-$SHARDS-$SHARD_SIZE}
py=python3
reader=(--read-size "$READ_SIZE")
if [ "$READER" = wds ]; then
    py=target/moto/bin/python
    reader=(--wds)
    if ! "$py" -c 'import webdataset' 2>/dev/null; then
        echo "bench-shards.sh: READER=wds needs webdataset in target/moto: scripts/test.sh installs it" >&2
        exit 2
    fi
fi
cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
python3 scripts/make-shards.py --shards "$SHARDS" --size "$SHARD_SIZE" "$DATA"
dataset=$(file_bytes "$DATA")
dev=$(device_of "$DATA")
bench_start shards /var/tmp
trap 'cg_kill "$cg"; bench_cleanup' EXIT
samples=$work/samples.txt
: > "$samples"

for rep in $(seq 1 "$REPS"); do
    for side in native coorfs; do
        drop_pages "$DATA"
        cg_create "$cg" "$POD" "$RATE" "$dev"
        dir=$DATA
        if [ "$side" = coorfs ]; then
            cg_run "$cg" "$coorfs" mount "$DATA" "$mnt"
            wait_scan "$mnt"
            dir=$mnt
        fi
        for epoch in $(seq 1 "$EPOCHS"); do
            before=$(cg_read_bytes "$cg" "$dev")
            out=$(cg_run "$cg" "$py" scripts/shard-epoch.py "${reader[@]}" --procs "$PROCS" \
                --seed $((rep * 100 + epoch)) "$dir")
            read=$(($(cg_read_bytes "$cg" "$dev") - before))
            secs=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
            cached=0 hit=-
            if [ "$side" = coorfs ]; then
                cached=$(coorfs_stat "$mnt" cached_bytes)
                hit=$(coorfs_stat "$mnt" stats | python3 -c "import json,sys; print(json.load(sys.stdin)['epochs'][$epoch - 1]['byte_hit_rate'])")
            fi
            echo "$side $rep $epoch $secs $read $cached $hit" | tee -a "$samples" >&2
        done
        if [ "$side" = coorfs ]; then
            echo "  coorfs rep $rep: cache $(($(coorfs_stat "$mnt" cache_capacity) >> 20)) MiB," \
                "$(coorfs_stat "$mnt" read_requests) READs, $(coorfs_stat "$mnt" passthrough_opens) passthrough opens" >&2
            "$coorfs" umount "$mnt"
        fi
        cg_kill "$cg"
        cg_destroy "$cg"
    done
done

echo
echo "scripts/bench-shards.sh local (REPS=$REPS, READER=$READER, READ_SIZE=$READ_SIZE) on $(nproc) CPUs," \
    "$(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD): $SHARDS shards," \
    "$((dataset >> 20)) MiB; each side in a $((POD >> 20)) MiB memory cgroup, reads throttled to" \
    "$((RATE >> 20)) MiB/s; $PROCS reader processes"
echo
python3 - "$samples" "$dataset" "$RATE" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, rep, ep, secs, read, cached, hit = line.split()
    rows[(side, int(ep))].append((float(secs), int(read), int(cached), hit))
dataset, rate = int(sys.argv[2]), int(sys.argv[3])
med = statistics.median
print("| epoch | native s | native MiB read | coorfs s | coorfs MiB read | byte hit | coorfs floor s | coorfs speed | of its floor |")
print("|---|---|---|---|---|---|---|---|---|")
for ep in sorted({e for _, e in rows}):
    n, c = rows[("native", ep)], rows[("coorfs", ep)]
    ns, cs = med(r[0] for r in n), med(r[0] for r in c)
    # Epoch 1 reads the dataset; later epochs what the cache lacks (as it was after epoch 1).
    floor = dataset / rate if ep == 1 else med(max(dataset - r[2], 0) for r in c) / rate
    print(f"| {ep} | {ns:.2f} | {med(r[1] for r in n) / 2**20:.0f} | {cs:.2f} | "
          f"{med(r[1] for r in c) / 2**20:.0f} | {med(float(r[3]) for r in c):.2f} | {floor:.2f} | "
          f"{ns / cs:.2f}x | {floor / cs:.2f} |")
PY
