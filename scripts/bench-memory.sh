#!/usr/bin/env bash
# The daemon's peak memory against its budget formula, per dataset shape:
#
#   peak RSS <= base + cache + staging + metadata + in flight, where
#     base      the daemon's RSS right after mounting an empty directory (measured here);
#     cache     --cache-size;
#     staging   --prefetch-memory (0 with --no-prefetch);
#     metadata  the node table (stat metadata_bytes, about 106 bytes plus the name an entry)
#               and the epoch bitmaps (one bit a file, for the dataset and each job);
#     in flight blocks being fetched: (prefetch depth + 2 x FUSE threads) x block size for
#               large files, a 64 KiB scratch page per I/O thread used for small ones, and
#               16 MiB of blocks read moments ago that the cache did not keep (re-reads),
#               and for large files 12 MiB of dropped blocks' mappings kept for new ones.
#
# Each scenario mounts its dataset, reads EPOCHS epochs with `coorfs read --procs 2`, takes
# the daemon's peak RSS (VmHWM in /proc/PID/status) and prints it beside the formula; a peak
# more than 5% over the formula fails the run. Datasets are generated once under DATA.
#
#   scripts/bench-memory.sh                          # all scenarios
#   SCENARIOS="small4k jpeg" scripts/bench-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-/var/tmp/coorfs-bench}
EPOCHS=${EPOCHS:-2}
SCENARIOS=${SCENARIOS:-"tiny small4k jpeg big-minio big-lru"}

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
work=$(mktemp -d /tmp/coorfs-memory.XXXXXX)
cleanup() {
    grep -qs " $work/mnt fuse" /proc/mounts && { $coorfs umount "$work/mnt" || umount -l "$work/mnt"; }
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/mnt" "$work/empty"

stat_of() { getfattr -n "user.coorfs.$2" --only-values "$1" 2>/dev/null; }
kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

# The base: a daemon with nothing to serve.
$coorfs mount --cache-size 1M "$work/empty" "$work/mnt"
base=$(( $(kib "$(stat_of "$work/mnt" pid)" VmHWM) << 10 ))
$coorfs umount "$work/mnt"

dataset() { # dataset NAME: generates it if needed, prints its directory
    case $1 in
        tiny) python3 scripts/make-dataset.py --files 1280000 --size 200 --max-size 600 --classes 1000 "$DATA/tiny" >/dev/null; echo "$DATA/tiny";;
        small4k) python3 scripts/make-dataset.py --files 200000 --size 100 --max-size 4K --classes 200 "$DATA/small4k" >/dev/null; echo "$DATA/small4k";;
        jpeg) python3 scripts/make-dataset.py --files 20000 --size 100K --exact --classes 100 "$DATA/small" >/dev/null; echo "$DATA/small";;
        big) mkdir -p "$DATA/big"; [ "$(stat -c %s "$DATA/big/big.bin" 2>/dev/null)" = 2147483648 ] || head -c 2G /dev/urandom > "$DATA/big/big.bin"; echo "$DATA/big";;
    esac
}

rows=()
failed=0
for scenario in $SCENARIOS; do
    case $scenario in
        tiny) src=$(dataset tiny); opts=(--cache-size 256M);;
        small4k) src=$(dataset small4k); opts=(--cache-size 64M);;
        jpeg) src=$(dataset jpeg); opts=(--cache-size 1G);;
        big-minio) src=$(dataset big); opts=(--cache-size 512M --policy minio);;
        big-lru) src=$(dataset big); opts=(--cache-size 512M --policy lru);;
        *) echo "bench-memory.sh: unknown scenario $scenario" >&2; exit 2;;
    esac
    $coorfs mount "${opts[@]}" "$src" "$work/mnt"
    until [ "$(stat_of "$work/mnt" scan_complete)" = 1 ]; do sleep 0.5; done
    start=$(date +%s)
    $coorfs read --procs 2 --epochs "$EPOCHS" "$work/mnt" >/dev/null
    secs=$(( $(date +%s) - start ))
    pid=$(stat_of "$work/mnt" pid)
    peak=$(( $(kib "$pid" VmHWM) << 10 ))
    cache=$(stat_of "$work/mnt" cache_capacity)
    staging=$(stat_of "$work/mnt" prefetch_memory)
    files=$(stat_of "$work/mnt" dataset_files)
    jobs=$(( $(stat_of "$work/mnt" active_jobs) + 1 ))
    metadata=$(( $(stat_of "$work/mnt" metadata_bytes) + files / 8 * jobs ))
    threads=$(nproc)
    if [ "$scenario" = tiny ] || [ "$scenario" = small4k ]; then
        inflight=$(( 64 * 65536 + (16 << 20) ))
    else
        inflight=$(( (16 + 2 * threads + 16 + 12) << 20 ))
    fi
    formula=$(( base + cache + staging + metadata + inflight ))
    ratio=$(python3 -c "print(f'{$peak / $formula:.3f}')")
    ok=yes; python3 -c "import sys; sys.exit(0 if $peak <= 1.05 * $formula else 1)" || { ok=NO; failed=1; }
    mib() { echo $(( $1 >> 20 )); }
    rows+=("| $scenario | $files | ${opts[*]} | $(mib $peak) | $(mib $base) | $(mib $cache) | $(mib $staging) | $(mib $metadata) | $(mib $inflight) | $(mib $formula) | $ratio | $ok | ${secs}s |")
    echo "  $scenario: peak $(mib $peak) MiB, formula $(mib $formula) MiB ($ratio)" >&2
    $coorfs umount "$work/mnt"
done

echo
echo "scripts/bench-memory.sh (EPOCHS=$EPOCHS) on $(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD)"
echo
echo "| scenario | files | options | peak RSS MiB | base | cache | staging | metadata | in flight | formula MiB | peak / formula | within 5% | read time |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $failed
