#!/usr/bin/env bash
# What a file and a byte cost through coorfs, beside the native path in the same run: the
# default mount (no options but the cache's size) against the directory it mirrors, medians of
# REPS, and the FUSE requests the daemon answered per file read (its 'requests' stats).
#
#   scripts/bench-ops.sh                      # every part, REPS=3: about 25 minutes
#   scripts/bench-ops.sh hot tiny             # only those parts
#   TINY_FILES="200000 1280000" scripts/bench-ops.sh tiny   # ImageNet's count too (+30 min)
#
# Parts:
#   hot  - HOT_FILES files of 100 KiB (6,000), every file in coorfs's cache and the kernel's
#          page cache: `coorfs read --procs 2 --epochs 5`, seconds for the five epochs; the
#          daemon's CPU an open over the timed epochs (the told-open thread's part too); and
#          how much of each side's pages lie in order in memory. Each repetition reads both
#          sides' pages in afresh, the sides taking turns at going first (see hot_pages).
#   py   - the same files read the same way by Python (scripts/py-read.py: `open(path,
#          "rb").read()` in 2 forked processes), natively, through the mount, and through it
#          under `coorfs run` (which spares each open the isatty() ioctl CPython asks, a round
#          trip through a FUSE mount).
#   tiny - TINY_FILES files of 200-600 B in 1,000 folders, the machine's caches dropped
#          (pages, dentries and inodes) before each side: one epoch; for coorfs a fresh mount,
#          the read timed from the moment the mount returns (its scan runs beside the read),
#          and a second epoch after it.
#   big  - one file of BIG (1 GiB): read cold (pages dropped, a fresh mount) and hot (the
#          third of three reads) with dd and 1 MiB reads.
#   s3   - 8 objects of 64 MiB in moto's S3 server (scripts/s3-server.py, 20 ms a request,
#          unpaced), read cold, whole: the machine's CPU seconds (all processes but the S3
#          server's) per GiB, and seconds, for a boto3 loop (scripts/s3-read.py), for
#          s3torchconnector (scripts/s3torch-read.py, if bench-s3.sh's venv target/s3torch
#          exists) and for a fresh coorfs mount read by `coorfs read`; each side goes first
#          in every other repetition, and the medians are also given split by that. A round
#          of each side, untimed, goes before them (WARMUP=0: none; see part_s3). Needs
#          target/moto (scripts/test.sh installs it).
# Every side reads with PROCS (2) processes. Each part prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

REPS=${REPS:-3}
PROCS=${PROCS:-2}
HOT_FILES=${HOT_FILES:-6000}
TINY_FILES=${TINY_FILES:-200000}
BIG=${BIG:-1G}
DATA=${DATA:-/var/tmp/coorfs-bench/ops}
PORT=${PORT:-$((20000 + $$ % 10000))}
PARTS=${*:-hot py tiny big s3}
for part in $PARTS; do
    case $part in
        hot | py | tiny | big | s3) ;;
        *) echo "bench-ops.sh: no part '$part' (hot, py, tiny, big, s3)" >&2; exit 2 ;;
    esac
done

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
bench_start ops /var/tmp
samples=$work/samples.txt
: > "$samples"
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; bench_cleanup' EXIT

# json_field JSON NAME: one field of a JSON object.
json_field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2" <<< "$1"; }

# read_epochs DIR EPOCHS SEED: seconds for EPOCHS epochs of `coorfs read` of DIR.
read_epochs() {
    "$coorfs" read --json --procs "$PROCS" --epochs "$2" --seed "$3" "$1" |
        python3 -c 'import json,sys; print(round(sum(json.loads(l)["seconds"] for l in sys.stdin), 3))'
}

# mount_default SRC: a default mount of SRC at $mnt (the cache big enough for the part).
mount_default() {
    "$coorfs" mount --cache-size 3G "$@" "$mnt"
}

umount_default() {
    "$coorfs" umount "$mnt"
}

# requests_per_file MNT FILES: each FUSE request the mount answered, per file read, and its
# mean handler microseconds ("op count/file (us)").
requests_per_file() {
    coorfs_stat "$1" stats | python3 -c '
import json, sys
files = int(sys.argv[1])
req = json.load(sys.stdin).get("requests", {})
print(", ".join(f"{op} {r['\''count'\''] / files:.2f} ({r['\''seconds'\''] / r['\''count'\''] * 1e6:.1f} us)"
                for op, r in sorted(req.items()) if r["count"]))' "$2"
}

drop_all() {
    sync
    echo 3 > /proc/sys/vm/drop_caches
}

# sample PART SIDE REP VALUE...
sample() { echo "$*" | tee -a "$samples" >&2; }

# summary PART UNIT [speed|cost] [BASE]: the part's medians by side, and each side's speed beside
# BASE's (its time over the side's), or with 'cost' each side's cost over BASE's; BASE is the
# side sampled first unless named.
summary() {
    python3 - "$samples" "$1" "$2" "${3:-speed}" "${4:-}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
part, unit, kind, first = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
mine = [r for r in rows if r[0] == part]
sides = list(dict.fromkeys(r[1] for r in mine))
if first in sides:
    sides.remove(first)
    sides.insert(0, first)
med = {s: statistics.median(float(r[3]) for r in mine if r[1] == s) for s in sides}
base = med[sides[0]]
print(f"\n{part}: median {unit} of {len([r for r in mine if r[1] == sides[0]])} runs\n")
ratio = f"side / {sides[0]}" if kind == "cost" else f"{sides[0]} / side"
print(f"| side | {unit} | {ratio} |")
print("|---|---|---|")
for s in sides:
    r = med[s] / base if kind == "cost" else base / med[s]
    print(f"| {s} | {med[s]:.3f} | {r:.2f}x |")
PY
}

# mount_hot: the hot parts' dataset at $src, mounted at $mnt, every file of it in coorfs's
# cache (one epoch through the mount).
mount_hot() {
    src=$DATA/hot-$HOT_FILES
    python3 scripts/make-dataset.py --files "$HOT_FILES" --size 100K --exact --classes 100 "$src" >/dev/null
    mount_default "$src"
    wait_scan "$mnt"
    "$coorfs" read --procs "$PROCS" --epochs 1 "$mnt" >/dev/null
}

# hot_pages FIRST: both sides' pages of the hot files dropped and read in again by an epoch of
# each, FIRST's side (native or coorfs) first; prints the sides in the order they went. A hot
# epoch copies out of these pages, and how they lie in memory matters: on a machine whose
# free memory is in small pieces, the side that reads first tends to get them, its pages
# strewn, and the one after whole blocks (one mount's hot epochs: 0.259-0.285 s when it read
# in second, its pages in order, against native's 0.283-0.300 s; 0.38-0.41 s when it read in
# first). Pages the dataset's writer left are in order, which no reader can count on. So each
# repetition makes both sides' pages afresh, the sides taking turns at going first, and says
# how much of each side's pages lie in order (page_order).
hot_pages() {
    local sides=(native coorfs) side
    [ "$1" = coorfs ] && sides=(coorfs native)
    drop_pages "$src"
    drop_pages "$mnt"
    for side in "${sides[@]}"; do
        if [ "$side" = native ]; then
            "$coorfs" read --procs "$PROCS" --epochs 1 "$src" >/dev/null
        else
            "$coorfs" read --procs "$PROCS" --epochs 1 "$mnt" >/dev/null
        fi
    done
    echo "${sides[*]}"
}

part_hot() {
    local src
    mount_hot
    local rep daemon ticks=0 told=0 cpu0 told0 side sides
    daemon=$(coorfs_stat "$mnt" stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
    for rep in $(seq 1 "$REPS"); do
        if ((rep % 2)); then sides=$(hot_pages native); else sides=$(hot_pages coorfs); fi
        echo "hot: repetition $rep read in $sides; pages in order: native $(page_order "$src"), coorfs $(page_order "$mnt")" | tee -a "$work/notes"
        for side in $sides; do
            if [ "$side" = native ]; then
                sample hot native "$rep" "$(read_epochs "$src" 5 "$rep")"
                continue
            fi
            cpu0=$(own_ticks "$daemon")
            told0=$(thread_ticks "$daemon" coorfs-told)
            sample hot coorfs "$rep" "$(read_epochs "$mnt" 5 "$rep")"
            ticks=$((ticks + $(own_ticks "$daemon") - cpu0))
            told=$((told + $(thread_ticks "$daemon" coorfs-told) - told0))
        done
    done
    # The daemon's own CPU for each open of the timed epochs (the told-open thread's part of
    # it): what a hot file costs the CPUs a job's decoding needs.
    awk -v d=$ticks -v t=$told -v n=$((HOT_FILES * 5 * REPS)) -v hz="$(getconf CLK_TCK)" 'BEGIN {
        printf "hot: the daemon used %.2f CPU-seconds over %d opens, %.2f us an open (%.2f us in the told-open thread)\n",
            d / hz, n, d / hz / n * 1e6, t / hz / n * 1e6 }' | tee -a "$work/notes"
    echo "hot: opens by the $(coorfs_stat "$mnt" stats | python3 -c 'import json,sys; d = json.load(sys.stdin); print(d["opens"] + ", " + d["opens_why"])'); requests per file read over every epoch: $(requests_per_file "$mnt" $((HOT_FILES * (1 + 6 * REPS))))" | tee -a "$work/notes"
    umount_default
    summary hot "seconds for 5 epochs" | tee -a "$work/tables"
}

# py_epochs DIR EPOCHS SEED [run]: seconds for EPOCHS epochs of scripts/py-read.py of DIR, under
# `coorfs run` if a fourth argument is given.
py_epochs() {
    local read=(python3 scripts/py-read.py --procs "$PROCS" --epochs "$2" --seed "$3" "$1")
    if [ -n "${4:-}" ]; then
        "$coorfs" run -- "${read[@]}" 2>/dev/null
    else
        "${read[@]}"
    fi
}

part_py() {
    local src
    mount_hot
    local rep
    for rep in $(seq 1 "$REPS"); do
        if ((rep % 2)); then hot_pages native >/dev/null; else hot_pages coorfs >/dev/null; fi
        sample py native "$rep" "$(py_epochs "$src" 5 "$rep")"
        sample py coorfs "$rep" "$(py_epochs "$mnt" 5 "$rep")"
        sample py coorfs-run "$rep" "$(py_epochs "$mnt" 5 "$rep" run)"
    done
    umount_default
    summary py "seconds for 5 epochs" | tee -a "$work/tables"
}

part_tiny() {
    local files src rep secs
    for files in $TINY_FILES; do
        src=$DATA/tiny-$files
        python3 scripts/make-dataset.py --files "$files" --size 200 --max-size 600 --classes 1000 "$src" >/dev/null
        for rep in $(seq 1 "$REPS"); do
            drop_all
            sample "tiny-$files" native "$rep" "$(read_epochs "$src" 1 "$rep")"
            drop_all
            mount_default "$src"
            sample "tiny-$files" coorfs "$rep" "$(read_epochs "$mnt" 1 "$rep")"
            sample "tiny-$files-epoch2" coorfs "$rep" "$(read_epochs "$mnt" 1 $((rep + 50)))"
            [ "$rep" = "$REPS" ] && echo "tiny-$files: requests per file read, two epochs: $(requests_per_file "$mnt" $((files * 2)))" | tee -a "$work/notes"
            umount_default
        done
        summary "tiny-$files" "seconds for epoch 1" | tee -a "$work/tables"
        python3 - "$samples" "tiny-$files-epoch2" <<'PY' | tee -a "$work/tables"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.split()[0] == sys.argv[2]]
print(f"{sys.argv[2]}: coorfs's second epoch, median {statistics.median(float(r[3]) for r in rows):.3f} s")
PY
    done
}

# dd_seconds FILE: seconds dd takes to read FILE with 1 MiB reads.
dd_seconds() {
    local t0 t1
    t0=$(date +%s.%N)
    dd if="$1" of=/dev/null bs=1M status=none
    t1=$(date +%s.%N)
    python3 -c "print(round($t1 - $t0, 3))"
}

part_big() {
    local src=$DATA/big file rep
    file=$src/big.bin
    mkdir -p "$src"
    if [ "$(stat -c %s "$file" 2>/dev/null || echo 0)" != "$(numfmt --from=iec "$BIG")" ]; then
        head -c "$BIG" /dev/urandom > "$file"
    fi
    for rep in $(seq 1 "$REPS"); do
        drop_all
        sample big-cold native "$rep" "$(dd_seconds "$file")"
        drop_all
        mount_default "$src"
        sample big-cold coorfs "$rep" "$(dd_seconds "$mnt/big.bin")"
        dd_seconds "$mnt/big.bin" >/dev/null
        dd_seconds "$file" >/dev/null
        sample big-hot native "$rep" "$(dd_seconds "$file")"
        sample big-hot coorfs "$rep" "$(dd_seconds "$mnt/big.bin")"
        umount_default
    done
    summary big-cold "seconds" | tee -a "$work/tables"
    summary big-hot "seconds" | tee -a "$work/tables"
}

# cpu_ticks: the machine's CPU time so far, in clock ticks (every mode but idle and iowait).
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# tree_ticks PID: CPU ticks PID and its children (those it waited for) have used.
tree_ticks() { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$1/stat"; }

# own_ticks PID: CPU ticks PID has used, its children not counted.
own_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# thread_ticks PID NAME: CPU ticks PID's threads named NAME have used.
thread_ticks() {
    grep -lx "$2" /proc/"$1"/task/*/comm | sed 's/comm$/stat/' | xargs awk '{ t += $14 + $15 } END { print t + 0 }'
}

part_s3() {
    local venv=target/moto src=$DATA/s3 endpoint=http://127.0.0.1:$PORT hz rep sys
    if [ ! -x "$venv/bin/moto_server" ]; then
        echo "bench-ops.sh: s3 needs moto's server in $venv: scripts/test.sh installs it" >&2
        return 2
    fi
    mkdir -p "$src"
    local i
    for i in 0 1 2 3 4 5 6 7; do
        [ "$(stat -c %s "$src/part$i.bin" 2>/dev/null || echo 0)" = $((64 << 20)) ] ||
            head -c 64M /dev/urandom > "$src/part$i.bin"
    done
    export AWS_ENDPOINT_URL=$endpoint AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=bench \
        AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
    "$venv/bin/python" scripts/s3-server.py --port "$PORT" --latency 20ms > "$work/server.log" 2>&1 &
    server=$!
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "$endpoint" && break
        sleep 0.1
    done
    "$venv/bin/python" - "$src" <<'PY'
import os, sys, boto3
s3 = boto3.client("s3")
s3.create_bucket(Bucket="bench")
for f in sorted(os.listdir(sys.argv[1])):
    with open(os.path.join(sys.argv[1], f), "rb") as b:
        s3.put_object(Bucket="bench", Key="ds/" + f, Body=b.read())
PY
    local systems="boto3 coorfs"
    [ -x target/s3torch/bin/python ] && systems="boto3 s3torch coorfs"
    hz=$(getconf CLK_TCK)
    # s3_side SYS SEED: one read of the objects by SYS (a fresh mount for coorfs), its JSON.
    s3_side() {
        case $1 in
            boto3) "$venv/bin/python" scripts/s3-read.py --endpoint "$endpoint" --procs "$PROCS" --seed "$2" bench ds ;;
            s3torch) target/s3torch/bin/python scripts/s3torch-read.py --endpoint "$endpoint" --procs "$PROCS" --seed "$2" bench ds ;;
            coorfs) "$coorfs" read --json --procs "$PROCS" --seed "$2" "$mnt" ;;
        esac
    }
    # A round of each side first, untimed (WARMUP=0: none): this machine's host faults in each
    # page of its memory at the page's first touch, a fresh machine's memory is all untouched,
    # and the cache must write to memory (docs/BENCHMARKS.md: 2.13x the loop's CPU a GiB in
    # the first run after boot, 1.36x in the next).
    if [ "${WARMUP:-1}" != 0 ]; then
        for sys in $systems; do
            [ "$sys" = coorfs ] && { mount_default s3://bench/ds; wait_scan "$mnt"; }
            s3_side "$sys" 0 > /dev/null
            [ "$sys" = coorfs ] && umount_default
        done
    fi
    local order
    for rep in $(seq 1 "$REPS"); do
        # Each side goes first in every other repetition, so that none always runs right
        # after another: on this machine (a virtual machine that gives free pages back to
        # its host) a run's writes to fresh memory cost more right after another's, and the
        # cache must write to fresh memory (docs/BENCHMARKS.md).
        order=$systems
        [ $((rep % 2)) = 0 ] && order=$(echo "$systems" | tr ' ' '\n' | tac | tr '\n' ' ')
        local when=first
        for sys in $order; do
            local c0 s0 t0 out c1 s1 t1 secs cpu gib
            [ "$sys" = coorfs ] && { mount_default s3://bench/ds; wait_scan "$mnt"; }
            c0=$(cpu_ticks) s0=$(tree_ticks "$server") t0=$(date +%s.%N)
            out=$(s3_side "$sys" "$rep")
            t1=$(date +%s.%N) c1=$(cpu_ticks) s1=$(tree_ticks "$server")
            [ "$sys" = coorfs ] && umount_default
            [ "$(json_field "$out" bytes)" = $((512 << 20)) ] || {
                echo "bench-ops.sh: s3 $sys read $(json_field "$out" bytes) bytes, not 512 MiB" >&2
                return 1
            }
            gib=0.5
            secs=$(python3 -c "print(round($t1 - $t0, 3))")
            cpu=$(python3 -c "print(round(($c1 - $c0 - ($s1 - $s0)) / $hz / $gib, 3))")
            sample s3-cpu "$sys" "$rep" "$cpu"
            sample s3-seconds "$sys" "$rep" "$secs"
            sample "s3-cpu-$when" "$sys" "$rep" "$cpu"
            sample "s3-seconds-$when" "$sys" "$rep" "$secs"
            when=after
        done
    done
    kill "$server"
    server=
    summary s3-cpu "CPU seconds per GiB (less the S3 server's)" cost | tee -a "$work/tables"
    summary s3-seconds "seconds for 512 MiB" cost | tee -a "$work/tables"
    # The same, split by whether the side ran first in its repetition or right after another:
    # here the second kind costs the cache's fresh huge folios more (docs/BENCHMARKS.md).
    local when
    for when in first after; do
        summary "s3-cpu-$when" "CPU seconds per GiB, the side $when" cost boto3 | tee -a "$work/tables"
        summary "s3-seconds-$when" "seconds for 512 MiB, the side $when" cost boto3 | tee -a "$work/tables"
    done
}

: > "$work/tables"
: > "$work/notes"
for part in $PARTS; do "part_$part"; done
echo
echo "scripts/bench-ops.sh $PARTS (REPS=$REPS, PROCS=$PROCS) on $(nproc) CPUs, $(uname -r), $(date -u +%F), commit $(git rev-parse --short HEAD)"
cat "$work/tables"
echo
cat "$work/notes"
