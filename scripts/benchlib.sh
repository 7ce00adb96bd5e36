# Helpers shared by the benchmarks (sourced, not run), on cgroup v1 controllers: the memory
# controller bounds a reader's page cache, the blkio controller throttles storage and counts
# the bytes read from it.

CG_MEM=/sys/fs/cgroup/memory
CG_BLKIO=/sys/fs/cgroup/blkio

# cg_create NAME MEMORY_BYTES READ_BPS DEVICE: a memory + blkio cgroup pair. MEMORY_BYTES 0 or
# READ_BPS 0 leaves that limit off.
cg_create() {
    local name=$1 mem=$2 bps=$3 dev=$4
    mkdir -p "$CG_MEM/$name" "$CG_BLKIO/$name"
    if [ "$mem" != 0 ]; then echo "$mem" > "$CG_MEM/$name/memory.limit_in_bytes"; fi
    if [ "$bps" != 0 ]; then echo "$dev $bps" > "$CG_BLKIO/$name/blkio.throttle.read_bps_device"; fi
}

# cg_run NAME CMD...: runs CMD inside the cgroup pair (its children stay in it).
cg_run() {
    local name=$1; shift
    (
        echo "$BASHPID" > "$CG_MEM/$name/cgroup.procs"
        echo "$BASHPID" > "$CG_BLKIO/$name/cgroup.procs"
        exec "$@"
    )
}

# cg_read_bytes NAME DEVICE: bytes the cgroup has read from DEVICE so far.
cg_read_bytes() {
    awk -v dev="$2" '$1 == dev && $2 == "Read" { print $3; found = 1 } END { if (!found) print 0 }' \
        "$CG_BLKIO/$1/blkio.throttle.io_service_bytes"
}

# cg_destroy NAME: removes the pair (its processes must have exited).
cg_destroy() {
    rmdir "$CG_MEM/$1" "$CG_BLKIO/$1" 2>/dev/null || true
}

# device_of DIR: MAJ:MIN of the block device holding DIR (for blkio rules).
device_of() {
    findmnt -no MAJ:MIN -T "$1" | tr -d ' '
}

# drop_pages DIR: drops DIR's files from the page cache (posix_fadvise DONTNEED per file),
# without touching the rest of the machine's cache. Dirty pages cannot be dropped, so the
# filesystem is synced first.
drop_pages() {
    sync -f "$1"
    python3 - "$1" <<'PY'
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        try:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
        except OSError:
            continue
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}

# coorfs_stat MNT NAME: one numeric stat of a mount.
coorfs_stat() {
    getfattr --absolute-names -n "user.coorfs.$2" --only-values "$1"
}

# wait_scan MNT: waits until the mount's scan of its source is complete.
wait_scan() {
    for _ in $(seq 1 600); do
        [ "$(coorfs_stat "$1" scan_complete 2>/dev/null)" = 1 ] && return 0
        sleep 0.1
    done
    echo "scan of $1 did not complete" >&2
    return 1
}

# file_bytes DIR: the total size of the regular files below DIR (what a reader reads in one
# epoch; du counts directories too, and awk loses precision past 2^31 with mawk).
file_bytes() {
    find "$1" -type f -printf '%s\n' | python3 -c 'import sys; print(sum(int(l) for l in sys.stdin))'
}

# bench_start NAME: a work directory with an empty mount point and the name of a cgroup pair
# for the runs (sets work, mnt and cg), removed on exit with whatever is still mounted there.
# Needs $coorfs.
bench_start() {
    work=$(mktemp -d "/tmp/coorfs-$1.XXXXXX")
    mnt="$work/mnt"
    mkdir "$mnt"
    cg="coorfs-$1-$$"
    trap bench_cleanup EXIT
}

bench_cleanup() {
    if grep -qs " $mnt fuse.coorfs " /proc/mounts; then "$coorfs" umount "$mnt" || umount -l "$mnt"; fi
    cg_destroy "$cg"
    rm -rf "$work"
}

# bench_side SYSTEM EXTRA_BYTES: prepares one run of the memory-budget benchmarks with DATA's
# pages dropped, and sets dir to what the reader reads. native: the cgroup pair gets BUDGET +
# EXTRA_BYTES of memory and dir is DATA. Otherwise dir is a mount of DATA with --cache-size
# BUDGET whose daemon runs in the pair, which gets BUDGET + OVERHEAD + EXTRA_BYTES: minio, lru
# and none are that cache policy alone (--no-prefetch); prefetch is MinIO with remaining-set
# prefetch, whose staging area (STAGING bytes) the pair gets on top. Storage reads are
# throttled to BPS on device dev either way.
bench_side() {
    drop_pages "$DATA"
    local memory=$((BUDGET + OVERHEAD + $2)) opts=(--policy "$1" --no-prefetch)
    case "$1" in
        native) memory=$((BUDGET + $2)) ;;
        prefetch) memory=$((memory + STAGING)) opts=(--policy minio --prefetch-memory "$STAGING") ;;
    esac
    cg_create "$cg" "$memory" "$BPS" "$dev"
    dir="$DATA"
    if [ "$1" != native ]; then
        cg_run "$cg" "$coorfs" mount "${opts[@]}" --cache-size "$BUDGET" "$DATA" "$mnt"
        wait_scan "$mnt"
        dir="$mnt"
    fi
}
