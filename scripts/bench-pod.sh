#!/usr/bin/env bash
# A pod: the training job and the coorfs daemon share one memory cgroup, as in a Kubernetes
# pod, and coorfs runs with its default options (the elastic budget, --cache-size auto). The
# native page cache gets the same cgroup. The dataset is 1.4x the pod's memory, on storage
# throttled to BPS; each epoch reads every file once in a fresh random order.
#
#   scripts/bench-pod.sh                        # REPS=3, a 1 GiB pod
#   POD=$((384 << 20)) FILES=4300 scripts/bench-pod.sh
#   FILES=600 REPS=1 EPOCHS=2 RUNS=grow scripts/bench-pod.sh      # a dry run, in seconds
#
# Runs (RUNS):
#   steady - the job's memory stays what the reader takes (a few MiB);
#   grow   - before epoch GROW_AT, a process of the job allocates and touches GROW bytes
#            (400 MiB by default: a model loaded mid-run) and holds them to the end.
# Systems (SYSTEMS): native reads the dataset from inside the cgroup; coorfs mounts it from
# inside the cgroup (`coorfs mount --job-key pgid`: every epoch's reader is a new program, and
# the pgid rule keeps the epochs one job, as one training run's are) and reads the mount.
# Per epoch: seconds, bytes from storage (the cgroup's blkio counter), hit rate. After each run:
# the OOM kills in the cgroup (must be 0), and coorfs's budget moves.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

REPS=${REPS:-3}
EPOCHS=${EPOCHS:-5}
POD=${POD:-$((1 << 30))}
FILES=${FILES:-12000}
DATA=${DATA:-/var/tmp/coorfs-bench/pod-$FILES}
BPS=${BPS:-$((150 << 20))}
PROCS=${PROCS:-2}
GROW=${GROW:-$((400 << 20))}
GROW_AT=${GROW_AT:-3}
RUNS=${RUNS:-"steady grow"}
SYSTEMS=${SYSTEMS:-"native coorfs"}

if [ "$CG_VERSION" != 1 ]; then
    echo "bench-pod.sh: needs cgroup v1 memory and blkio controllers (found v$CG_VERSION)" >&2
    exit 2
fi
cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
# Sizes uniform from 30 to 220 KiB (mean 125 KiB): 12,000 files are 1.4x a 1 GiB pod, and
# both of the cache's stores (small files in its arena, larger ones in files the kernel
# reads) take part.
python3 scripts/make-dataset.py --files "$FILES" --size 30K --max-size 220K --classes 100 "$DATA" >/dev/null
dev=$(device_of "$DATA")
dataset_bytes=$(file_bytes "$DATA")
bench_start pod
samples=$work/samples.txt
: > "$samples"
hog_pid=

# hog: a process of the job, in the cgroup, that takes GROW bytes and holds them until stopped.
hog_start() {
    cg_run "$cg" python3 -c '
import os, sys, time
b = bytearray(int(sys.argv[1]))
b[::4096] = b"\x01" * len(b[::4096])
print("ready", os.getpid(), flush=True)
time.sleep(3600)' "$GROW" > "$work/hog.out" 2>&1 &
    for _ in $(seq 1 300); do
        hog_pid=$(awk '$1 == "ready" { print $2 }' "$work/hog.out")
        [ -n "$hog_pid" ] && return 0
        # Gone without saying ready: killed (the OOM count says).
        jobs -r | grep -q . || { echo "  the $((GROW >> 20)) MiB allocation died" >&2; return 0; }
        sleep 0.1
    done
}
hog_stop() {
    if [ -n "$hog_pid" ]; then kill "$hog_pid" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    hog_pid=
}

for run in $RUNS; do
    for rep in $(seq 1 "$REPS"); do
        for sys in $SYSTEMS; do
            drop_pages "$DATA"
            cg_create "$cg" "$POD" "$BPS" "$dev"
            dir="$DATA"
            if [ "$sys" = coorfs ]; then
                cg_run "$cg" "$coorfs" mount --job-key pgid "$DATA" "$mnt"
                wait_scan "$mnt"
                dir="$mnt"
            fi
            for epoch in $(seq 1 "$EPOCHS"); do
                if [ "$run" = grow ] && [ "$epoch" = "$GROW_AT" ]; then hog_start; fi
                before=$(cg_read_bytes "$cg" "$dev")
                secs=$(cg_run "$cg" "$coorfs" read --json --procs "$PROCS" --seed $((rep * 100 + epoch)) "$dir" |
                    python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
                after=$(cg_read_bytes "$cg" "$dev")
                hit=-
                if [ "$sys" = coorfs ]; then
                    hit=$(coorfs_stat "$mnt" stats | python3 -c "import json,sys; print(json.load(sys.stdin)['epochs'][$epoch - 1]['hit_rate'])")
                fi
                echo "$run/$sys $rep $epoch $secs $((after - before)) $hit" | tee -a "$samples" >&2
            done
            hog_stop
            kills=$(awk '$1 == "oom_kill" { print $2 }' "$CG_MEM/$cg/memory.oom_control")
            echo "$run/$sys kills $kills" >> "$work/kills.txt"
            note="  $run/$sys rep $rep: OOM kills $kills, peak $(($(cat "$CG_MEM/$cg/memory.max_usage_in_bytes") >> 20)) MiB"
            if [ "$sys" = coorfs ]; then
                note="$note; cache $(($(coorfs_stat "$mnt" cache_capacity) >> 20)) MiB, grew $(coorfs_stat "$mnt" cache_budget_grows)x, shrank $(coorfs_stat "$mnt" cache_budget_shrinks)x, dropped $(coorfs_stat "$mnt" cache_dropped_files) files"
                "$coorfs" umount "$mnt"
            fi
            echo "$note" >&2
            cg_destroy "$cg"
        done
    done
done

echo
echo "scripts/bench-pod.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d): a $((POD >> 20)) MiB pod;" \
    "$FILES files, $((dataset_bytes >> 20)) MiB ($(python3 -c "print(round($dataset_bytes / $POD, 2))")x the pod);" \
    "storage $((BPS >> 20)) MiB/s; $PROCS reader processes; grow: $((GROW >> 20)) MiB taken before epoch $GROW_AT"
for run in $RUNS; do
    echo
    echo "### $run"
    echo
    grep "^$run/" "$samples" | sed "s|^$run/||" |
        python3 scripts/epochstats.py --baseline native --dataset-bytes "$dataset_bytes"
    echo
    for sys in $SYSTEMS; do
        echo "OOM kills, $sys: $(grep "^$run/$sys " "$work/kills.txt" | awk '{ s += $3 } END { print s + 0 }')"
    done
done
