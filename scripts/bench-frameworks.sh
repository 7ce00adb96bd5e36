#!/usr/bin/env bash
# The unchanged PyTorch input pipeline (scripts/train-input.py: ImageFolder + DataLoader,
# shuffle, 2 workers, bytes-only mode) in the setup of scripts/bench-epochs.sh: a dataset
# twice the memory budget, read in a fresh random order every epoch, from throttled storage.
#
#   20,000 real JPEGs of ~110 KiB (make-imagefolder.py, 2.26 GB); memory budget 1 GiB for the
#   data on every side; storage throttled to 200 MiB/s (cgroup v1 blkio); 5 epochs.
#   - native: the pipeline reads the source from inside a cgroup limited to the budget plus
#     the pipeline's own memory (READER, 416 MiB: its parent and 2 workers with torch loaded
#     peak at 411 MiB of anonymous memory here, 400 on average), so that its page cache gets
#     the budget and not much more (every MiB more is a native hit: with 512 MiB, native's
#     page cache held ~1.1 GiB and hit 27% of bytes instead of 20%);
#   - coorfs minio (and lru, and minio-nopt with --no-passthrough, if SYSTEMS says so): the
#     cache alone (--no-prefetch), as in
#     bench-epochs.sh's paper scenario: --cache-size 1G, the daemon and the pipeline in one
#     cgroup limited to the budget + OVERHEAD (64 MiB, as bench-epochs.sh) + READER;
#   - coorfs prefetch (if SYSTEMS says so): MinIO with remaining-set prefetch, the cgroup
#     gets its staging area (STAGING, 256 MiB) on top. Its daemon holds ~60 MiB beside the
#     cache and the staging area, which with the pipeline leaves the default OVERHEAD no room:
#     the kernel killed it; run it with OVERHEAD=$((128 << 20)), or a smaller STAGING (on
#     bandwidth-bound storage the prefetcher stages at most 2 MiB: STAGING=$((8 << 20)));
#   - coorfs hint (if SYSTEMS says so): prefetch, and the pipeline with --hinted: the one-line
#     change of coorfs.HintedSampler (python/), which hands the mount each epoch's order (the same
#     permutations as shuffle=True draws for the seed).
# The dataset's pages are dropped before each run; every run uses the seed of its repetition,
# so native and coorfs read the same orders. Per epoch: seconds and samples/s (the pipeline's
# own report), bytes read from storage (the cgroup's blkio counter, sampled as each epoch's
# report arrives), hit rate (coorfs's per-epoch stats; for native, 1 - storage bytes / its
# first epoch's). Every epoch's checksum must be the same on every side, or the run fails.
#
#   scripts/bench-frameworks.sh                           # REPS=3
#   REPS=5 SYSTEMS="native minio lru prefetch" scripts/bench-frameworks.sh
#   PIPELINE=scripts/train-input-tf.py READER=... scripts/bench-frameworks.sh  # tf.data; set
#                                      # READER to its peak anonymous memory (printed per run)
#   MODE=decode SYSTEMS=minio scripts/bench-frameworks.sh   # decoding too; each coorfs run
#                                      # prints its job's data wait and verdict (coorfs stats)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

REPS=${REPS:-3}
EPOCHS=${EPOCHS:-5}
FILES=${FILES:-20000}
DATA=${DATA:-/var/tmp/coorfs-bench/imagefolder}
BUDGET=${BUDGET:-$((1 << 30))}
OVERHEAD=${OVERHEAD:-$((64 << 20))}
STAGING=${STAGING:-$((256 << 20))}
READER=${READER:-$((416 << 20))}
BPS=${BPS:-$((200 << 20))}
WORKERS=${WORKERS:-2}
MODE=${MODE:-bytes}
PIPELINE=${PIPELINE:-scripts/train-input.py}
SYSTEMS=${SYSTEMS:-"native minio"}

scripts/setup-python.sh >/dev/null 2>&1 || scripts/setup-python.sh
py=$PWD/.venv/bin/python
cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
"$py" scripts/make-imagefolder.py --files "$FILES" --classes 100 "$DATA" >/dev/null
dev=$(device_of "$DATA")
dataset_bytes=$(file_bytes "$DATA")

bench_start bench-frameworks
samples="$work/samples.txt"

# rss_peak NAME: the peak anonymous memory of the cgroup's processes in MiB: what the pipeline
# (and the daemon) hold besides the page cache. Sampled every 50 ms from when the first
# process joins until the last leaves, by one Python process: a shell loop forking awk, cat
# and sleep 20 times a second took 5% of the 2 CPUs (perf), from the side being measured.
rss_peak() {
    python3 - "$CG_MEM/$1" <<'PY'
import os, sys, time
cg, peak, seen = sys.argv[1], 0, False
while True:
    try:
        with open(os.path.join(cg, "cgroup.procs")) as f:
            busy = bool(f.read().strip())
        with open(os.path.join(cg, "memory.stat")) as f:
            rss = next((int(l.split()[1]) for l in f if l.startswith("total_rss ")), 0)
    except OSError:  # the cgroup is gone
        break
    if busy:
        seen = True
    elif seen:
        break
    peak = max(peak, rss)
    time.sleep(0.05)
print(peak >> 20)
PY
}

for rep in $(seq 1 "$REPS"); do
    for sys in $SYSTEMS; do
        hinted=()
        if [ "$sys" = hint ]; then hinted=(--hinted); fi
        bench_side "${sys/#hint/prefetch}" "$READER"
        # Each epoch's JSON report, followed by the storage bytes read since the previous one.
        rss_peak "$cg" > "$work/rss" &
        before=$(cg_read_bytes "$cg" "$dev")
        TF_CPP_MIN_LOG_LEVEL=3 cg_run "$cg" "$py" "$PIPELINE" --mode "$MODE" --epochs "$EPOCHS" \
            --workers "$WORKERS" --seed "$rep" "${hinted[@]}" --json "$dir" |
            while read -r report; do
                now=$(cg_read_bytes "$cg" "$dev")
                echo "$report $((now - before))"
                before=$now
            done > "$work/run.txt"
        hits='[]'
        if [ "$sys" != native ]; then
            hits=$($coorfs stats --json "$mnt" | python3 -c 'import json,sys; print(json.dumps([e["hit_rate"] for e in json.load(sys.stdin)["epochs"]]))')
            echo "  $sys: cached_bytes=$(coorfs_stat "$mnt" cached_bytes) of dataset $dataset_bytes" >&2
            # Stall attribution: the job's share of time waiting for data each epoch, and the
            # verdict of coorfs stats (data-bound or compute-bound).
            $coorfs stats --json "$mnt" | python3 -c '
import json, sys
for j in json.load(sys.stdin)["jobs"]:
    print("  " + sys.argv[1] + ": " + j["job"] + " data wait by epoch: " + " ".join(
        "%.0f%%" % (100 * e["data_wait_seconds"] / max(e["readers"] * e["seconds"], 1e-9)) for e in j["epochs"]))' "$sys" >&2
            $coorfs stats "$mnt" | sed -n '/^job /,$p' | grep -E '^  epoch [0-9]+: ' | sed "s/^ */  $sys: verdict: /" >&2
            $coorfs umount "$mnt"
        fi
        wait
        echo "  $sys: peak anonymous memory $(cat "$work/rss") MiB (the pipeline; for coorfs also the daemon and its cache)," \
            "peak memory $(($(cat "$CG_MEM/$cg/memory.max_usage_in_bytes") >> 20)) MiB of a" \
            "$(($(cat "$CG_MEM/$cg/memory.limit_in_bytes") >> 20)) MiB limit" >&2
        cg_destroy "$cg"
        # "system rep epoch seconds storage_bytes hit_rate samples checksum" per epoch.
        python3 - "$sys" "$rep" "$hits" "$work/run.txt" <<'PY' | tee -a "$samples" >&2
import json, sys
sys_, rep, hits, run = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
for line in open(run):
    report, storage = line.rsplit(" ", 1)
    r = json.loads(report)
    hit = f"{hits[r['epoch'] - 1]:.4f}" if hits else "-"
    print(sys_, rep, r["epoch"], r["seconds"], storage.strip(), hit, r["samples"], r["checksum"])
PY
    done
done

# Every side must have read the same bytes: one checksum for every epoch of every run, and
# every epoch a whole dataset.
if [ "$(awk '{ print $8 }' "$samples" | sort -u | wc -l)" != 1 ] ||
    awk -v n="$FILES" '$7 != n { bad = 1 } END { exit !bad }' "$samples"; then
    echo "bench-frameworks.sh: the runs read different data:" >&2
    cat "$samples" >&2
    exit 1
fi

echo
echo "scripts/bench-frameworks.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d): $(basename "$PIPELINE")" \
    "--mode $MODE --workers $WORKERS; $FILES JPEGs, $((dataset_bytes / 1000000)) MB; data budget" \
    "$((BUDGET >> 20)) MiB (+ $((READER >> 20)) MiB for the pipeline); storage $((BPS >> 20)) MiB/s"
echo
cut -d' ' -f1-6 "$samples" |
    python3 scripts/epochstats.py --baseline native --dataset-bytes "$dataset_bytes" --samples "$FILES"
