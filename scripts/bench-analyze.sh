#!/usr/bin/env bash
# Checks coorfs analyze's prediction against measured epochs, in the setup of
# scripts/bench-epochs.sh: 20,000 files of ~110 KiB (2.25 GB), a 1 GiB memory budget, storage
# throttled to 200 MiB/s (cgroup v1 blkio), 2 reader processes, 5 epochs.
#
#   1. coorfs analyze --cache-size 1G runs inside a cgroup with the same blkio throttle (and no
#      memory limit: the analysis itself needs little), so the storage throughput it measures
#      is the throttled one;
#   2. scripts/bench-epochs.sh measures native and coorfs minio epochs (REPS=3), unless
#      EPOCHS_SAMPLES names the samples file of an earlier run (bench-epochs.sh SAMPLES=FILE);
#   3. the predicted epoch time of the native page cache (the LRU simulation) and of coorfs
#      minio are compared with the measured medians: epoch 1, and epochs 2+ (all of their
#      samples pooled). Exit status 1 if an epochs-2+ prediction is off by more than
#      TOLERANCE (0.15), or if the samples hold no bw/native or bw/minio epoch 1 or 2+.
#
#   scripts/bench-analyze.sh
#   REPS=5 TIME=30s scripts/bench-analyze.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

DATA=${DATA:-/var/tmp/coorfs-bench/epochs}
BUDGET=${BUDGET:-$((1 << 30))}
BPS=${BPS:-$((200 << 20))}
TIME=${TIME:-20s}
TOLERANCE=${TOLERANCE:-0.15}
export DATA BUDGET BPS

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
python3 scripts/make-dataset.py --files 20000 --size 110K --classes 100 "$DATA" >/dev/null
dev=$(device_of "$DATA")

work=$(mktemp -d /tmp/coorfs-bench-analyze.XXXXXX)
cg="coorfs-analyze-$$"
cleanup() {
    cg_destroy "$cg"
    rm -rf "$work"
}
trap cleanup EXIT

drop_pages "$DATA"
cg_create "$cg" 0 "$BPS" "$dev"
cg_run "$cg" "$coorfs" analyze "$DATA" --cache-size "$BUDGET" --epochs 5 --time "$TIME" \
    --json "$work/analyze.json" > "$work/analyze.txt"
cg_destroy "$cg"
sed -n '/^storage/,/^$/p' "$work/analyze.txt" >&2

samples=${EPOCHS_SAMPLES:-}
if [ -z "$samples" ]; then
    samples="$work/samples.txt"
    SYSTEMS="native minio" SAMPLES="$samples" scripts/bench-epochs.sh >&2
fi

echo
echo "scripts/bench-analyze.sh on $(nproc) CPUs, $(date -u +%Y-%m-%d): coorfs analyze $DATA" \
    "--cache-size $((BUDGET >> 20))M --time $TIME, in a blkio cgroup of $((BPS >> 20)) MiB/s"
echo
python3 - "$work/analyze.json" "$samples" "$TOLERANCE" <<'PY'
import collections, json, statistics, sys

report = json.load(open(sys.argv[1]))
tolerance = float(sys.argv[3])
measured = collections.defaultdict(list)  # (system, "1" or "2+") -> epoch seconds
storage = collections.defaultdict(list)   # (system, "1" or "2+") -> storage bytes
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) != 6:
        continue
    # bench-epochs.sh writes STORAGE/SYSTEM; the prediction is for the throttled storage, bw.
    kind, _, system = f[0].rpartition("/")
    if kind != "bw":
        continue
    _, _, epoch, secs, by, _ = f
    key = (system, "1" if epoch == "1" else "2+")
    measured[key].append(float(secs))
    storage[key].append(float(by))
missing = [f"bw/{system} epochs {epochs}" for system in ("native", "minio") for epochs in ("1", "2+")
           if not measured.get((system, epochs))]
if missing:
    sys.exit(f"bench-analyze.sh: no samples of {', '.join(missing)} in {sys.argv[2]} "
             "(lines 'bw/SYSTEM REP EPOCH SECONDS BYTES HIT', as bench-epochs.sh writes them)")

s = report["storage"]
depths = ", ".join("depth %d %.1f" % (d["depth"], d["mib_per_sec"]) for d in s["depths"])
print(f"storage measured by coorfs analyze: {s['mib_per_sec']:.1f} MiB/s at depth {s['best_depth']} ({depths})")
print()
print("| system | epochs | predicted s | measured s (median) | error | predicted storage MiB | measured storage MiB |")
print("|---|---|---|---|---|---|---|")
worst = 0.0
for system, column in (("native", "page_cache"), ("minio", "minio")):
    for epochs, pred in (("1", report["cache"]["epochs"][0][column]), ("2+", report["cache"]["steady"][column])):
        med = statistics.median(measured[(system, epochs)])
        err = pred["epoch_seconds"] / med - 1
        if epochs == "2+":
            worst = max(worst, abs(err))
        print(f"| {system} | {epochs} | {pred['epoch_seconds']:.2f} | {med:.2f} | {err:+.1%} |"
              f" {pred['storage_bytes'] / 2**20:.0f} | {statistics.median(storage[(system, epochs)]) / 2**20:.0f} |")
reps = max((len(v) for k, v in measured.items() if k[1] == "1"), default=0)
print(f"\nMeasured: medians over {reps} repetitions (epochs 2+ pool epochs 2-5 of every repetition).")
verdict = "within" if worst <= tolerance else "NOT within"
print(f"Epochs 2+: worst error {worst:.1%}, {verdict} {tolerance:.0%}.")
sys.exit(0 if worst <= tolerance else 1)
PY
