#!/usr/bin/env bash
# Proof that unchanged PyTorch and TensorFlow input pipelines read the right bytes through a
# coorfs mount and that coorfs's stats account for every read.
#
# Generates an ImageFolder dataset of real JPEGs (make-imagefolder.py), then for each
# pipeline (train-input.py: torchvision ImageFolder + DataLoader; train-input-tf.py: tf.data)
# and mode (bytes, decode): mounts the dataset with a cache that holds all of it and prefetch
# off, runs the pipeline for EPOCHS epochs through the mount and then on the source,
# unmounts, and has check-run.py compare every epoch's samples, bytes and checksum and check
# the stats (reads = epochs x files, epoch 1 all misses, later epochs all hits, bytes from the
# source = the dataset once). The bytes mode runs again with a cache of half the dataset,
# with prefetch off (later epochs must hit exactly the files the cache holds) and with the
# default options (prefetch on: the checks that do not depend on timing), and for PyTorch once
# more with the one-line change of the coorfs package (python/): coorfs.HintedSampler hands
# every epoch's order to the mount (one hint accepted an epoch, none rejected, the same
# checksums and hit rates). Then the unchanged PyTorch pipeline under `coorfs run`, on a mount
# whose reads take 1 ms more (storage the prefetcher must stay ahead of): with 0 and 2 workers,
# and as 2 ranks of `torchrun` with DistributedSampler (train-input.py --distributed): the same
# checksums, one hint accepted an epoch from each rank and none rejected, and from epoch 2 on at
# least 90% of the reads the cache missed served by the prefetcher. Then a hyper-parameter
# search: 3 PyTorch jobs at once in one coordinated group (HintedSampler(group=...), then the
# unchanged jobs under `coorfs run --group`), the same
# checksums, one read of the storage per uncached file and round. First, the package's unit
# tests run with torch installed, where the sampler's and coorfs run's hook's tests run on the
# real torch too. Exits non-zero at the first failed check.
#
#   scripts/check-frameworks.sh                     # 2,000 files of ~110 KiB, 3 epochs
#   FILES=5000 MODES=bytes scripts/check-frameworks.sh
#   FILES=400 FRAMEWORKS=pytorch CHECKS=run scripts/check-frameworks.sh   # coorfs run's cases only
#   FILES=400 CHECKS=group scripts/check-frameworks.sh                    # the group case only
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

FILES=${FILES:-2000}
CLASSES=${CLASSES:-10}
EPOCHS=${EPOCHS:-3}
WORKERS=${WORKERS:-2}
MODES=${MODES:-"bytes decode"}
FRAMEWORKS=${FRAMEWORKS:-"pytorch tensorflow"}
# Which checks: all of them, "run" for the coorfs run cases alone (FRAMEWORKS must hold pytorch),
# or "group" for the hyper-parameter search alone.
CHECKS=${CHECKS:-all}
DATA=${DATA:-/var/tmp/coorfs-frameworks/check-$FILES}

scripts/setup-python.sh 2>/dev/null
py=$PWD/.venv/bin/python
cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
"$py" scripts/make-imagefolder.py --files "$FILES" --classes "$CLASSES" "$DATA"
dataset_bytes=$(file_bytes "$DATA")

bench_start check-frameworks

# check FRAMEWORK MODE CACHE_BYTES [MOUNT_OPTION...]: one pipeline through a fresh mount and on
# the source. With HINTED=1, the run through the mount samples with coorfs.HintedSampler; with
# RUN=1 it is the unchanged pipeline under `coorfs run`, with RANKS=K too as K ranks of torchrun.
check() {
    local framework=$1 mode=$2 cache=$3 script=scripts/train-input.py reference=(--reference)
    local hinted=() launch=() ranks=${RANKS:-1}
    shift 3
    if [ "$framework" = tensorflow ]; then script=scripts/train-input-tf.py reference=(); fi
    if [ "${HINTED:-0}" = 1 ]; then hinted=(--hinted); fi
    local run=("$py" "$script" --mode "$mode" --epochs "$EPOCHS" --workers "$WORKERS" --json)
    local through=("${run[@]}" "${hinted[@]}")
    if [ "${RUN:-0}" = 1 ]; then
        launch=("$coorfs" run --)
        if [ "$ranks" -gt 1 ]; then
            through=("$py" -m torch.distributed.run --standalone --nproc-per-node "$ranks" "${run[@]:1}" --distributed)
        fi
        hinted=(--hinted --ranks "$ranks")
    fi
    $coorfs mount --cache-size "$cache" "$@" "$DATA" "$mnt"
    wait_scan "$mnt"
    TF_CPP_MIN_LOG_LEVEL=3 "${launch[@]}" "${through[@]}" "$mnt" > "$work/mount.jsonl" 2> "$work/stderr" ||
        { cat "$work/stderr" >&2; return 1; }
    # coorfs run is silent when every DataLoader got its hints.
    if [ "${RUN:-0}" = 1 ] && grep "coorfs run:" "$work/stderr" >&2; then return 1; fi
    $coorfs stats --json "$mnt" > "$work/stats.json"
    $coorfs umount "$mnt"
    TF_CPP_MIN_LOG_LEVEL=3 "${run[@]}" "$DATA" > "$work/source.jsonl" 2> "$work/stderr" ||
        { cat "$work/stderr" >&2; return 1; }
    python3 scripts/check-run.py --source "$DATA" --mount-run "$work/mount.jsonl" \
        --source-run "$work/source.jsonl" --stats "$work/stats.json" "${reference[@]}" "${hinted[@]}"
}

echo "== the coorfs package's unit tests, with torch"
(cd python && PYTHONPATH=$PWD PYTHONDONTWRITEBYTECODE=1 "$py" -m unittest discover -s tests)

# The unchanged pipeline under coorfs run, storage 1 ms a read: 0 and 2 workers, 2 torchrun ranks.
check_run() {
    local half=$((dataset_bytes / 2))
    RUN=1 WORKERS=0 check pytorch bytes "$half" --read-delay 1ms
    RUN=1 WORKERS=2 check pytorch bytes "$half" --read-delay 1ms
    RUN=1 RANKS=2 check pytorch bytes "$half" --read-delay 1ms
}

# A hyper-parameter search: JOBS (3) PyTorch jobs at once, one coordinated group
# (HintedSampler(group=...)), half of the dataset cached, decoding (epochs of seconds, as real
# training's are, not the fraction of a second that bytes mode takes: the jobs start a second or
# so apart, importing torch, and a job not started yet is no job of the mount). Each job's
# checksums must equal a run on the source, the mount must see one order for all, and the
# storage must have served the dataset once and then the uncached half once a round for the
# whole group, within 5% (the mount's bytes from the source and source_reads_per_file).
# `check_group run`: the same jobs unchanged, each under `coorfs run --group hp-search`.
check_group() {
    local half=$((dataset_bytes / 2)) jobs=${JOBS:-3} pids=() j job
    $coorfs mount --cache-size "$half" "$DATA" "$mnt"
    wait_scan "$mnt"
    job=("$py" scripts/train-input.py --mode decode --epochs "$EPOCHS" --workers "$WORKERS" --json)
    for ((j = 1; j <= jobs; j++)); do
        if [ "${1:-}" = run ]; then
            $coorfs run --group hp-search -- "${job[@]}" "$mnt"
        else
            "${job[@]}" --hinted --group hp-search "$mnt"
        fi > "$work/group-$j.jsonl" 2> "$work/group-$j.err" &
        pids+=($!)
    done
    for j in "${!pids[@]}"; do
        wait "${pids[$j]}" || { cat "$work/group-$((j + 1)).err" >&2; return 1; }
    done
    $coorfs stats --json "$mnt" > "$work/stats.json"
    $coorfs umount "$mnt"
    "$py" scripts/train-input.py --mode decode --epochs "$EPOCHS" --workers "$WORKERS" --json "$DATA" \
        > "$work/source.jsonl"
    python3 - "$work" "$jobs" "$EPOCHS" "$@" <<'PY'
import json, sys
work, jobs, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def epochs_of(path):
    return [(e["samples"], e["checksum"]) for e in map(json.loads, open(path)) if e]
source = epochs_of(f"{work}/source.jsonl")
for j in range(1, jobs + 1):
    got = epochs_of(f"{work}/group-{j}.jsonl")
    assert got == source, f"job {j}: {got} through the mount, {source} on the source"
s = json.load(open(f"{work}/stats.json"))
dataset, cached = s["dataset_bytes"], s["cached_bytes"]
digests = {j.get("order_digest") for j in s["jobs"]}
assert len(s["jobs"]) == jobs and len(digests) == 1 and None not in digests, s["jobs"]
assert s["hints_accepted"] == jobs * epochs and s["hints_rejected"] == 0, s
# The whole dataset in the first round, then the uncached half once a round, for all the jobs.
once = dataset + (epochs - 1) * (dataset - cached)
got, ratio = s["bytes_from_source"], s["source_reads_per_file"]
assert got <= 1.05 * once and ratio <= 1.05, f"{got} bytes from the source ({ratio} reads a file and round), {once} once a round"
print(f"group of {jobs}{' under coorfs run' if len(sys.argv) > 4 else ''}: checksums equal the source's; {got} bytes from the source, {once} once a "
      f"round; {ratio} source reads a file and round; {s['shared_hits']} shared hits")
PY
}

echo "== $FILES files, $dataset_bytes bytes; $EPOCHS epochs; $WORKERS workers"
if [ "$CHECKS" = run ]; then
    check_run
    echo "== all checks passed"
    exit 0
fi
if [ "$CHECKS" = group ]; then
    check_group
    check_group run
    echo "== all checks passed"
    exit 0
fi
for framework in $FRAMEWORKS; do
    for mode in $MODES; do
        check "$framework" "$mode" $((dataset_bytes * 2)) --no-prefetch
    done
    # Half the dataset: MinIO keeps what it admitted in epoch 1, so later epochs hit exactly that.
    check "$framework" bytes $((dataset_bytes / 2)) --no-prefetch
    check "$framework" bytes $((dataset_bytes / 2))
    if [ "$framework" = pytorch ]; then
        HINTED=1 check pytorch bytes $((dataset_bytes / 2))
        check_run
        check_group
        check_group run
    fi
done
echo "== all checks passed"
