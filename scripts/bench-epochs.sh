#!/usr/bin/env bash
# Epochs of a dataset larger than the memory budget, read in a fresh random order each epoch
# from slow storage: coorfs beside the native page cache, in one run.
#
#   scripts/bench-epochs.sh [paper|prefetch]
#
# paper (the default): the experiment of "Analyzing and Mitigating Data Stalls in DNN
#   Training". 20,000 files of ~110 KiB (2.25 GB); memory budget 1 GiB for every side;
#   storage throttled to 200 MiB/s (cgroup v1 blkio); 2 reader processes; 5 epochs.
#   Systems: native, minio and lru (coorfs's cache alone, prefetch off).
# prefetch: the same dataset and budget, 1 reader process, two kinds of storage:
#   bw  - bandwidth-bound: the 200 MiB/s blkio throttle;
#   lat - latency-bound, like network storage: the dataset behind a passthrough mount that
#         adds 2 ms to every read (coorfs --policy none --no-prefetch --read-delay 2ms, on
#         its own, outside the budget) and serves many reads at once; native and coorfs
#         both read through it. This kernel has no netem, device-mapper or NFS, and a
#         blkio IOPS limit is a rate, not a latency.
#   Systems: native, minio (prefetch off), prefetch (remaining-set prefetch), hint
#   (prefetch following the order that `coorfs read --hint` hands over each epoch).
#   If SYSTEMS says so, also the PyTorch pipeline (scripts/train-input.py --mode bytes
#   --all-files: ImageFolder over every file, DataLoader with WORKERS workers (default PROCS; 0
#   loads in the training process, with no worker to pickle samples through), shuffle=True, all
#   epochs in one process, seed REP), with prefetch as hint has it: run, the pipeline unchanged
#   under `coorfs run`, which hands the mount its DataLoader's order each epoch; sampler, the
#   pipeline with the one-line change of coorfs.HintedSampler (--hinted). The same pipeline
#   unchanged and without `coorfs run` is the baseline they are measured against: torch, on
#   the dataset itself (the native path); torchminio, on a mount with MinIO alone (prefetch
#   off). Their cgroups get READER bytes more for the pipeline itself (416 MiB, as
#   bench-frameworks.sh), and they need the torch venv of scripts/setup-python.sh (PYTHON to
#   use another). BASELINE=torch compares every system with the pipeline on the native path.
#
# Native reads the dataset from inside a cgroup with a 1 GiB memory limit, so its page cache
# lives within it. coorfs gets --cache-size 1G, and its daemon and the reader share one
# cgroup limited to 1 GiB + OVERHEAD (64 MiB: the daemon's ~12 MiB measured for this
# dataset, plus fetch buffers) + the staging area when prefetch is on (--prefetch-memory,
# 256 MiB). Per epoch: time, bytes from storage (the cgroup's blkio counter, or the delay
# mount's own bytes_from_source), hit rate (coorfs's per-epoch count; for native, 1 - its
# storage bytes / its first epoch's).
#
#   scripts/bench-epochs.sh                 # paper, REPS=3
#   REPS=5 scripts/bench-epochs.sh prefetch
#   STORAGES=lat SYSTEMS="native hint" scripts/bench-epochs.sh prefetch
#   SYSTEMS="native minio hint run sampler" scripts/bench-epochs.sh prefetch   # coorfs run
#   BASELINE=torch SYSTEMS="torch torchminio run sampler" scripts/bench-epochs.sh prefetch
#   FILES=300 REPS=1 EPOCHS=2 STORAGES=lat SYSTEMS="hint run" DATA=/var/tmp/tiny \
#       scripts/bench-epochs.sh prefetch    # a dry run of the script, in seconds
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

SCENARIO=${1:-paper}
REPS=${REPS:-3}
EPOCHS=${EPOCHS:-5}
DATA=${DATA:-/var/tmp/coorfs-bench/epochs}
FILES=${FILES:-20000}
READER=${READER:-$((416 << 20))}
BUDGET=${BUDGET:-$((1 << 30))}
OVERHEAD=${OVERHEAD:-$((64 << 20))}
STAGING=${STAGING:-$((256 << 20))}
BPS=${BPS:-$((200 << 20))}
DELAY=${DELAY:-2ms}
BASELINE=${BASELINE:-native}
case "$SCENARIO" in
    paper) PROCS=2; SYSTEMS=${SYSTEMS:-"native minio lru"}; STORAGES=${STORAGES:-bw} ;;
    prefetch) PROCS=1; SYSTEMS=${SYSTEMS:-"native minio prefetch hint"}; STORAGES=${STORAGES:-"bw lat"} ;;
    *) echo "bench-epochs.sh: unknown scenario \"$SCENARIO\" (paper or prefetch)" >&2; exit 2 ;;
esac
WORKERS=${WORKERS:-$PROCS}

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
python3 scripts/make-dataset.py --files "$FILES" --size 110K --classes 100 "$DATA" >/dev/null
py=${PYTHON:-$PWD/.venv/bin/python}
case " $SYSTEMS " in
    *" run "* | *" sampler "* | *" torch "* | *" torchminio "*)
        [ -n "${PYTHON:-}" ] || scripts/setup-python.sh >/dev/null ;;
esac
dev=$(device_of "$DATA")
dataset_bytes=$(du -sb --apparent-size "$DATA" | cut -f1)

work=$(mktemp -d /tmp/coorfs-bench-epochs.XXXXXX)
mnt="$work/mnt"
slow="$work/slow"
mkdir "$mnt" "$slow"
cg="coorfs-bench-$$"
cleanup() {
    for m in "$mnt" "$slow"; do
        if grep -qs " $m fuse.coorfs " /proc/mounts; then $coorfs umount "$m" || umount -l "$m"; fi
    done
    cg_destroy "$cg"
    rm -rf "$work"
}
trap cleanup EXIT
# SAMPLES=FILE keeps the per-epoch samples for another script (bench-analyze.sh) to read. It
# starts empty: samples of an earlier run (or of one cut short) would count as repetitions.
samples=${SAMPLES:-$work/samples.txt}
: > "$samples"

# coorfs mount options and reader options of each system.
# Every epoch is a new `coorfs read` piped into python3 from this script, which by the default
# job rule (two programs at once) would make each epoch a job of its own: --job-key pgid keeps
# the epochs one job, as one training run's are.
mount_opts() {
    echo "--job-key pgid"
    case "$1" in
        minio | torchminio) echo "--policy minio --no-prefetch" ;;
        lru) echo "--policy lru --no-prefetch" ;;
        prefetch | hint | run | sampler) echo "--policy minio --prefetch-memory $STAGING" ;;
    esac
}
memory_of() {
    case "$1" in
        native) echo "$BUDGET" ;;
        torch) echo $((BUDGET + READER)) ;;
        torchminio) echo $((BUDGET + OVERHEAD + READER)) ;;
        prefetch | hint) echo $((BUDGET + OVERHEAD + STAGING)) ;;
        run | sampler) echo $((BUDGET + OVERHEAD + STAGING + READER)) ;;
        *) echo $((BUDGET + OVERHEAD)) ;;
    esac
}

# storage_bytes STORAGE: bytes read from storage so far by the cgroup (bw) or the delay mount.
storage_bytes() {
    if [ "$1" = bw ]; then cg_read_bytes "$cg" "$dev"; else coorfs_stat "$slow" bytes_from_source; fi
}

# native SYSTEM: true if SYSTEM reads the dataset itself, with no mount.
native() {
    case "$1" in native | torch) true ;; *) false ;; esac
}

# hit_rate SYSTEM EPOCH: the mount's hit rate in its dataset-wide epoch EPOCH (- for native).
hit_rate() {
    if native "$1"; then echo -; return; fi
    coorfs_stat "$mnt" stats | python3 -c "import json,sys; print(json.load(sys.stdin)['epochs'][$2 - 1]['hit_rate'])"
}

# pipeline SYSTEM STORAGE REP DIR: the PyTorch pipeline's EPOCHS epochs over DIR, in one
# process; one sample line per epoch, its storage bytes read as its report arrives.
pipeline() {
    local sys=$1 storage=$2 rep=$3 dir=$4 launch=() hinted=() before after
    case "$sys" in
        run) launch=("$coorfs" run --) ;;
        sampler) hinted=(--hinted) ;;
    esac
    before=$(storage_bytes "$storage")
    cg_run "$cg" "${launch[@]}" "$py" scripts/train-input.py --mode bytes --all-files --workers "$WORKERS" \
        --epochs "$EPOCHS" --seed "$rep" "${hinted[@]}" --json "$dir" |
        while read -r report; do
            after=$(storage_bytes "$storage")
            python3 -c 'import json,sys; r = json.loads(sys.argv[1]); print(r["epoch"], r["seconds"])' "$report" |
                { read -r epoch secs; echo "$storage/$sys $rep $epoch $secs $((after - before)) $(hit_rate "$sys" "$epoch")"; }
            before=$after
        done | tee -a "$samples" >&2
}

for storage in $STORAGES; do
    if [ "$storage" = lat ]; then
        # The delay mount reads the dataset from the page cache (warmed here, outside every
        # budget), so that what it adds is latency alone.
        $coorfs read --procs 2 --sorted "$DATA" >/dev/null
        $coorfs mount --policy none --no-prefetch --read-delay "$DELAY" "$DATA" "$slow"
        wait_scan "$slow"
        src="$slow"; bps=0
    else
        src="$DATA"; bps=$BPS
    fi
    for rep in $(seq 1 "$REPS"); do
        for sys in $SYSTEMS; do
            # Nothing of the dataset in the page cache that the reader will use (for lat, the
            # delay mount's own pages; the data under it stays warm).
            drop_pages "$src"
            cg_create "$cg" "$(memory_of "$sys")" "$bps" "$dev"
            dir="$src"
            if ! native "$sys"; then
                # shellcheck disable=SC2046
                cg_run "$cg" "$coorfs" mount $(mount_opts "$sys") --cache-size "$BUDGET" "$src" "$mnt"
                wait_scan "$mnt"
                dir="$mnt"
            fi
            hint=; [ "$sys" = hint ] && hint=--hint
            epochs=$EPOCHS
            case "$sys" in run | sampler | torch | torchminio) pipeline "$sys" "$storage" "$rep" "$dir"; epochs=0 ;; esac
            for epoch in $(seq 1 "$epochs"); do
                before=$(storage_bytes "$storage")
                secs=$(cg_run "$cg" "$coorfs" read --json $hint --procs "$PROCS" --seed $((rep * 100 + epoch)) "$dir" |
                    python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
                after=$(storage_bytes "$storage")
                echo "$storage/$sys $rep $epoch $secs $((after - before)) $(hit_rate "$sys" "$epoch")" | tee -a "$samples" >&2
            done
            if ! native "$sys"; then
                echo "  $sys: cached_bytes=$(coorfs_stat "$mnt" cached_bytes) staging_hits=$(coorfs_stat "$mnt" staging_hits)" \
                    "prefetched_unused=$(coorfs_stat "$mnt" prefetched_unused) fetch_stall=$(coorfs_stat "$mnt" fetch_stall_seconds)s;" \
                    "peak memory of daemon+reader: $(cat "$CG_MEM/$cg/memory.max_usage_in_bytes") bytes" >&2
                $coorfs umount "$mnt"
            fi
            cg_destroy "$cg"
        done
    done
    if [ "$storage" = lat ]; then $coorfs umount "$slow"; fi
done

echo
echo "scripts/bench-epochs.sh $SCENARIO (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d): $FILES files," \
    "$((dataset_bytes / 1000000)) MB; budget $((BUDGET >> 20)) MiB; $PROCS reader(s);" \
    "bw = $((BPS >> 20)) MiB/s, lat = $DELAY a read"
for storage in $STORAGES; do
    echo
    grep "^$storage/" "$samples" | sed "s|^$storage/||" |
        python3 scripts/epochstats.py --baseline "$BASELINE" --dataset-bytes "$dataset_bytes" |
        sed "s/^| \([a-z]*\) |/| $storage \1 |/"
done
