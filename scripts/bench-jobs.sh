#!/usr/bin/env bash
# Many jobs on one server: JOBS training jobs (4) read the same dataset at once, each EPOCHS
# epochs (5), from slow storage, with a cache that holds half of the dataset. Without sharing,
# every job fetches every file the cache lacks itself, so storage serves the uncached half
# JOBS times a round; shared, it should serve it about once. The setup is bench-epochs.sh's
# paper setup: 20,000 files of ~110 KiB (2.25 GB), storage throttled to 200 MiB/s (cgroup v1
# blkio), one reader process per job.
#
#   scripts/bench-jobs.sh                   # REPS=3, SYSTEMS="native noshare share group"
#   REPS=5 SYSTEMS="noshare share" scripts/bench-jobs.sh
#   FILES=300 REPS=1 EPOCHS=2 DATA=/var/tmp/jobs-tiny scripts/bench-jobs.sh   # a dry run, in seconds
#
# Each job is `coorfs read --procs 1 --epochs EPOCHS --seed S --json DIR`; the JOBS of a run
# start together in the background of this script, which coorfs's default --job-key auto
# tells apart as the trials of a sweep. Systems:
#   native  - the jobs read DATA directly (their page cache the cache), seeds all different;
#   noshare - a coorfs mount with --cache-size CACHE --no-share: each job reads what it misses;
#   share   - the same mount, sharing: a block read for one job stays in the staging area for
#             the jobs that have still to read its file this epoch;
#   group   - the same mount, every job --seed 7 --hint: one order, handed to the mount each
#             epoch (a coordinated group).
# CACHE is half of the dataset's bytes. A mount's daemon and the jobs share one cgroup limited
# to CACHE + STAGING (--prefetch-memory, 256 MiB) + OVERHEAD (64 MiB), as bench-epochs.sh
# gives its prefetch systems; native's jobs get a cgroup with the same limit.
# Per run: round seconds (wall time from the start of the jobs until the last one finished,
# / EPOCHS: a round is one epoch of every job), storage bytes per round (the cgroup's blkio
# counter / EPOCHS, first round included), and the mount's source_reads_per_file, shared_hits
# and bytes_from_source. The table has medians over REPS; "storage / ((1-c) x D)" is the
# storage bytes of a round over the bytes the cache does not hold (c: the mount's cached_bytes
# / dataset_bytes, for native CACHE / D): about 1 when each uncached file is read once a
# round, JOBS when each job reads it itself. SAMPLES=FILE keeps the per-run lines; KEEP=DIR keeps
# each run's job reports and the mount's stats (sampled every second) in DIR/SYSTEM-REP/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

REPS=${REPS:-3}
EPOCHS=${EPOCHS:-5}
JOBS=${JOBS:-4}
DATA=${DATA:-/var/tmp/coorfs-bench/epochs}
FILES=${FILES:-20000}
OVERHEAD=${OVERHEAD:-$((64 << 20))}
STAGING=${STAGING:-$((256 << 20))}
BPS=${BPS:-$((200 << 20))}
SYSTEMS=${SYSTEMS:-"native noshare share group"}
die() { echo "bench-jobs.sh: $*" >&2; exit 1; }
for sys in $SYSTEMS; do
    case "$sys" in native | noshare | share | group) ;; *) die "unknown system \"$sys\" (native, noshare, share or group)" ;; esac
done
[ "$CG_VERSION" != 0 ] || die "no cgroup filesystem at /sys/fs/cgroup (run as root on a machine with cgroups)"

cargo build --release --quiet || die "cargo build failed"
coorfs=$PWD/target/release/coorfs
python3 scripts/make-dataset.py --files "$FILES" --size 110K --classes 100 "$DATA" >/dev/null ||
    die "could not make the dataset in $DATA"
dev=$(device_of "$DATA")
dataset_bytes=$(file_bytes "$DATA")
CACHE=${CACHE:-$((dataset_bytes / 2))}
memory=$((CACHE + STAGING + OVERHEAD))

bench_start jobs
pids=()
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    cg_kill "$cg"
    bench_cleanup
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
samples=${SAMPLES:-$work/samples.txt}
: > "$samples"

for rep in $(seq 1 "$REPS"); do
    for sys in $SYSTEMS; do
        drop_pages "$DATA"
        cg_create "$cg" "$memory" "$BPS" "$dev" || die "could not create cgroup $cg"
        dir=$DATA
        if [ "$sys" != native ]; then
            share=(); [ "$sys" = noshare ] && share=(--no-share)
            cg_run "$cg" "$coorfs" mount --cache-size "$CACHE" --prefetch-memory "$STAGING" "${share[@]}" "$DATA" "$mnt" ||
                die "$sys: coorfs mount of $DATA failed"
            wait_scan "$mnt" || die "$sys: the mount did not finish its scan"
            dir=$mnt
        fi
        before=$(cg_read_bytes "$cg" "$dev")
        # The jobs wait for $work/go, so that all are running (the script a sweep of JOBS
        # programs) before the first read.
        rm -f "$work/go" "$work"/job*
        pids=()
        for j in $(seq 1 "$JOBS"); do
            args=(--seed $((rep * 1000 + j * 100)))
            [ "$sys" = group ] && args=(--seed 7 --hint)
            (
                until [ -e "$work/go" ]; do sleep 0.01; done
                cg_run "$cg" "$coorfs" read --procs 1 --epochs "$EPOCHS" "${args[@]}" --json "$dir" \
                    > "$work/job$j.json" 2> "$work/job$j.err"
            ) &
            pids+=($!)
        done
        sampler=
        if [ -n "${KEEP:-}" ] && [ "$sys" != native ]; then
            while sleep 1; do "$coorfs" stats --json "$mnt" 2>/dev/null | tr -d '\n'; echo; done > "$work/stats-1s.jsonl" &
            sampler=$!
        fi
        start=$EPOCHREALTIME
        touch "$work/go"
        failed=0
        for p in "${pids[@]}"; do wait "$p" || failed=1; done
        end=$EPOCHREALTIME
        [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
        pids=()
        if [ "$failed" != 0 ]; then cat "$work"/job*.err >&2; die "$sys: a job failed (rep $rep)"; fi
        after=$(cg_read_bytes "$cg" "$dev")
        peak=-
        [ -e "$CG_MEM/$cg/memory.max_usage_in_bytes" ] && peak=$(($(cat "$CG_MEM/$cg/memory.max_usage_in_bytes") >> 20))
        echo '{}' > "$work/stats.json"
        if [ "$sys" != native ]; then
            "$coorfs" stats --json "$mnt" > "$work/stats.json" || die "$sys: coorfs stats failed"
            "$coorfs" umount "$mnt" || die "$sys: coorfs umount failed"
        fi
        cg_destroy "$cg"
        if [ -n "${KEEP:-}" ]; then
            mkdir -p "$KEEP/$sys-$rep" && cp "$work"/job*.json "$work"/*stats*.json* "$KEEP/$sys-$rep/"
        fi
        # One sample line: system rep round_seconds storage_bytes_per_round c
        # source_reads_per_file shared_hits bytes_from_source; the jobs' reports are checked.
        python3 - "$sys" "$rep" "$start" "$end" "$((after - before))" "$EPOCHS" "$JOBS" \
            "$CACHE" "$dataset_bytes" "$work" <<'PY' | tee -a "$samples" >&2 || die "$sys: bad job reports (rep $rep)"
import json, sys
sys_, rep, start, end, storage, epochs, jobs, cache, dbytes, work = sys.argv[1:]
epochs, jobs = int(epochs), int(jobs)
for j in range(1, jobs + 1):
    reports = [json.loads(l) for l in open(f"{work}/job{j}.json") if l.strip()]
    errors = sum(r["errors"] for r in reports)
    if len(reports) != epochs or errors:
        sys.exit(f"bench-jobs.sh: job {j} of {sys_} reported {len(reports)} epochs of {epochs}, {errors} read errors")
s = json.load(open(f"{work}/stats.json"))
if s and len(s["jobs"]) != jobs:
    print(f"bench-jobs.sh: warning: the {sys_} mount saw {len(s['jobs'])} jobs, not {jobs}", file=sys.stderr)
c = s["cached_bytes"] / s["dataset_bytes"] if s else int(cache) / int(dbytes)
g = lambda k: str(s[k]) if s else "-"
print(sys_, rep, (float(end) - float(start)) / epochs, int(storage) / epochs, c,
      g("source_reads_per_file"), g("shared_hits"), g("bytes_from_source"))
PY
        echo "  (peak memory of $sys's cgroup: $peak MiB of $((memory >> 20)) MiB)" >&2
    done
done

echo
echo "scripts/bench-jobs.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD):" \
    "$FILES files, $((dataset_bytes / 1000000)) MB; $JOBS jobs x $EPOCHS epochs, 1 reader each;" \
    "cache $((CACHE >> 20)) MiB, memory $((memory >> 20)) MiB a system; storage $((BPS >> 20)) MiB/s"
echo
python3 - "$dataset_bytes" "$samples" <<'PY'
import collections, statistics, sys
D = float(sys.argv[1])
runs = collections.defaultdict(dict)  # system -> rep -> (secs, bytes, c, reads_per_file)
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 8:
        runs[f[0]][f[1]] = (float(f[2]), float(f[3]), float(f[4]), f[5])
med = lambda xs: statistics.median(xs) if xs else float("nan")
def speed(s, base):
    if base not in runs:
        return "-"
    r = [runs[base][k][0] / v[0] for k, v in runs[s].items() if k in runs[base] and v[0] > 0]
    return f"{med(r):.2f}x"
print("| system | round seconds | storage MiB per round | storage / ((1-c) x D) | source_reads_per_file"
      " | speed vs noshare | speed vs native |")
print("|---|---|---|---|---|---|---|")
for s, r in runs.items():
    v = r.values()
    rpf = [float(x[3]) for x in v if x[3] != "-"]
    print(f"| {s} | {med([x[0] for x in v]):.2f} | {med([x[1] for x in v]) / 2**20:.0f}"
          f" | {med([x[1] / ((1 - x[2]) * D or float('nan')) for x in v]):.2f} | {f'{med(rpf):.2f}' if rpf else '-'}"
          f" | {speed(s, 'noshare')} | {speed(s, 'native')} |")
print(f"\nMedians over {max(len(r) for r in runs.values())} repetitions; speeds are medians of"
      " per-repetition ratios of round times.")
PY
