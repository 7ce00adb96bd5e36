#!/usr/bin/env bash
# Where a hot file's time goes: each call of reading a file whole (open, fstat, Python's
# isatty ioctl, read, close), one file at a time, natively and through coorfs, with every file
# in coorfs's cache and the kernel's page cache (scripts/open-latency.py). Two datasets: the
# 20,000 files of 100 KiB of bench-read.sh and 20,000 tiny files of 200-600 B. Sides:
#   native          the source directory;
#   coorfs          the default mount (--cache-size 3G: every file cached);
#   coorfs-1cpu     the same mount with its daemon and the reader on CPU 0 alone: no request
#                   or reply crosses CPUs, so no wake-up needs an interrupt to the other CPU;
#   coorfs-noopen   the same dataset through --fast-open: no OPEN or RELEASE round trip;
#   coorfs-haltpoll the default mount with HALTPOLL_NS=N set (a VM guest's idle CPU polls N ns
#                   before it halts; /sys/module/haltpoll/parameters/guest_halt_poll_ns, the
#                   machine's value is put back at the end). Only if HALTPOLL_NS is given.
# With the kernel's fuse tracepoints (Linux 6.16+) it gives, for the coorfs sides, each FUSE
# opcode's time from the request's send to its end: the rest of a call's time is the wake-up
# of the caller. Each repetition measures every side back to back; the tables give medians
# of the per-repetition medians. Not a CI test: about 4 minutes.
#
#   scripts/bench-open.sh                         # REPS=3, FILES=4000 a side and repetition
#   HALTPOLL_NS=200000 REPS=5 scripts/bench-open.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
FILES=${FILES:-4000}
DATA=${DATA:-/var/tmp/coorfs-bench}
HALTPOLL_NS=${HALTPOLL_NS:-}
HALTPOLL=/sys/module/haltpoll/parameters/guest_halt_poll_ns
if [ -n "$HALTPOLL_NS" ] && [ ! -w "$HALTPOLL" ]; then
    echo "bench-open.sh: HALTPOLL_NS needs a writable $HALTPOLL (a VM guest with cpuidle-haltpoll, as root)" >&2
    exit 2
fi

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
python3 scripts/make-dataset.py --files 20000 --size 100K --exact --classes 100 "$DATA/small" >/dev/null
python3 scripts/make-dataset.py --files 20000 --size 200 --max-size 600 --classes 16 "$DATA/tiny" >/dev/null
trace=()
[ -d /sys/kernel/tracing/events/fuse ] && trace=(--trace)

work=$(mktemp -d /tmp/coorfs-bench.XXXXXX)
haltpoll_was=$(cat "$HALTPOLL" 2>/dev/null || true)
cleanup() {
    [ -n "$HALTPOLL_NS" ] && echo "$haltpoll_was" > "$HALTPOLL"
    for m in "$work"/*-mnt; do
        if grep -qs " $m fuse.coorfs " /proc/mounts; then $coorfs umount "$m" || umount -l "$m"; fi
    done
    rm -rf "$work"
}
trap cleanup EXIT
samples="$work/samples.jsonl"

# daemon_threads MOUNT: the thread ids of the mount's daemon.
daemon_threads() {
    local pid
    pid=$(python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], "user.coorfs.pid").decode())' "$1")
    ls "/proc/$pid/task"
}

# pin_daemon MOUNT CPUS: moves every thread of the mount's daemon to CPUS.
pin_daemon() {
    local t
    for t in $(daemon_threads "$1"); do taskset -p -c "$2" "$t" >/dev/null 2>&1 || true; done
}

# measure DATASET SIDE REP DIR [PREFIX...]: one open-latency.py run, appended to the samples.
measure() {
    local set=$1 side=$2 rep=$3 dir=$4
    shift 4
    local t=()
    [[ $side == coorfs* ]] && t=("${trace[@]}")
    "$@" python3 scripts/open-latency.py --files "$FILES" --seed "$rep" "${t[@]}" "$dir" |
        python3 -c 'import json,sys; d=json.load(sys.stdin); d.update(set=sys.argv[1], side=sys.argv[2], rep=int(sys.argv[3])); print(json.dumps(d))' \
            "$set" "$side" "$rep" >> "$samples"
    echo "  $set $side rep $rep" >&2
}

all_cpus=0-$(($(nproc) - 1))
for set in small tiny; do
    src=$DATA/$set
    mkdir -p "$work/$set-mnt" "$work/$set-noopen-mnt"
    $coorfs mount --cache-size 3G "$src" "$work/$set-mnt"
    $coorfs mount --cache-size 3G --fast-open "$src" "$work/$set-noopen-mnt"
    for m in "$work/$set-mnt" "$work/$set-noopen-mnt"; do
        # Two sorted epochs: the first fills coorfs's cache, the second the kernel's.
        $coorfs read --sorted "$m" >/dev/null
        $coorfs read --sorted "$m" >/dev/null
    done
    cat "$src"/*/* > /dev/null
    for rep in $(seq 1 "$REPS"); do
        measure "$set" native "$rep" "$src"
        measure "$set" coorfs "$rep" "$work/$set-mnt"
        pin_daemon "$work/$set-mnt" 0
        measure "$set" coorfs-1cpu "$rep" "$work/$set-mnt" taskset -c 0
        pin_daemon "$work/$set-mnt" "$all_cpus"
        measure "$set" coorfs-noopen "$rep" "$work/$set-noopen-mnt"
        if [ -n "$HALTPOLL_NS" ]; then
            echo "$HALTPOLL_NS" > "$HALTPOLL"
            measure "$set" coorfs-haltpoll "$rep" "$work/$set-mnt"
            echo "$haltpoll_was" > "$HALTPOLL"
        fi
    done
    $coorfs umount "$work/$set-mnt"
    $coorfs umount "$work/$set-noopen-mnt"
done

echo
echo "scripts/bench-open.sh on $(nproc) CPUs, $(date +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'): $FILES files a side, $REPS repetitions${HALTPOLL_NS:+, HALTPOLL_NS=$HALTPOLL_NS}"
python3 - "$samples" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
calls = ("open", "fstat", "ioctl", "read", "close", "whole")
for set_ in ("small", "tiny"):
    mine = [r for r in rows if r["set"] == set_]
    sides = list(dict.fromkeys(r["side"] for r in mine))
    med = lambda side, f: statistics.median(f(r) for r in mine if r["side"] == side)
    print(f"\n{set_}: median microseconds a file, one reader\n")
    print("| call | " + " | ".join(sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for c in calls:
        print(f"| {c} | " + " | ".join(f"{med(s, lambda r: r[c]['median_us']):.1f}" for s in sides) + " |")
    native = med("native", lambda r: r["whole"]["median_us"])
    print("| native / side | " + " | ".join(f"{native / med(s, lambda r: r['whole']['median_us']):.2f}x" for s in sides) + " |")
    ops = sorted({op for r in mine for op in r.get("fuse", {})})
    if ops:
        traced = [s for s in sides if any("fuse" in r for r in mine if r["side"] == s)]
        print(f"\n{set_}: the kernel's send-to-end microseconds per request (median), and requests a file\n")
        print("| request | " + " | ".join(traced) + " |")
        print("|---" * (len(traced) + 1) + "|")
        for op in ops:
            cells = []
            for s in traced:
                got = [r["fuse"][op] for r in mine if r["side"] == s and op in r.get("fuse", {})]
                if not got:
                    cells.append("-")
                    continue
                per_file = statistics.median(g["count"] / r["files"] for g, r in zip(got, [r for r in mine if r["side"] == s and op in r.get("fuse", {})]))
                cells.append(f"{statistics.median(g['median_us'] for g in got):.1f} ({per_file:.2f})")
            print(f"| {op} | " + " | ".join(cells) + " |")
PY
