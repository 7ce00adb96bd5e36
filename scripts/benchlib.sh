# Helpers shared by the benchmarks and the demo (sourced, not run). A memory cgroup bounds a
# reader's page cache (and a daemon's memory) and an I/O cgroup throttles storage and counts
# the bytes read from it: cgroup v1's memory and blkio controllers where the machine has them
# (the benchmark machine), else cgroup v2's memory and io controllers (one unified hierarchy,
# as on current distributions). Other benchmarks read some v1 files directly (peak memory).

CG_MEM=/sys/fs/cgroup/memory
CG_BLKIO=/sys/fs/cgroup/blkio
CG_V2=/sys/fs/cgroup
if [ -e "$CG_MEM/memory.limit_in_bytes" ]; then
    CG_VERSION=1
elif [ -e "$CG_V2/cgroup.controllers" ]; then
    CG_VERSION=2
else
    CG_VERSION=0
fi

# cg_create NAME MEMORY_BYTES READ_BPS DEVICE: a cgroup (v1: a memory + blkio pair) limited to
# MEMORY_BYTES of memory, reads from DEVICE throttled to READ_BPS. MEMORY_BYTES 0 or READ_BPS
# 0 leaves that limit off. Fails (with the kernel's complaint on stderr) if a step fails.
cg_create() {
    local name=$1 mem=$2 bps=$3 dev=$4
    case $CG_VERSION in
    1)
        mkdir -p "$CG_MEM/$name" "$CG_BLKIO/$name" || return 1
        if [ "$mem" != 0 ]; then echo "$mem" > "$CG_MEM/$name/memory.limit_in_bytes" || return 1; fi
        if [ "$bps" != 0 ]; then echo "$dev $bps" > "$CG_BLKIO/$name/blkio.throttle.read_bps_device" || return 1; fi
        ;;
    2)
        # A child of the root has the controllers the root hands down (systemd hands down both).
        local c
        for c in memory io; do
            if grep -qw "$c" "$CG_V2/cgroup.controllers" && ! grep -qw "$c" "$CG_V2/cgroup.subtree_control"; then
                echo "+$c" > "$CG_V2/cgroup.subtree_control" || return 1
            fi
        done
        mkdir -p "$CG_V2/$name" || return 1
        if [ "$mem" != 0 ]; then echo "$mem" > "$CG_V2/$name/memory.max" || return 1; fi
        if [ "$bps" != 0 ]; then echo "$dev rbps=$bps" > "$CG_V2/$name/io.max" || return 1; fi
        ;;
    *)
        echo "no cgroup filesystem at /sys/fs/cgroup" >&2
        return 1
        ;;
    esac
}

# cg_procs NAME: the cgroup.procs files a process writes its id into to join the cgroup (v1:
# the memory and the blkio one), one a line.
cg_procs() {
    if [ "$CG_VERSION" = 1 ]; then
        echo "$CG_MEM/$1/cgroup.procs"
        echo "$CG_BLKIO/$1/cgroup.procs"
    else
        echo "$CG_V2/$1/cgroup.procs"
    fi
}

# cg_run NAME CMD...: runs CMD inside the cgroup (its children stay in it).
cg_run() {
    local name=$1 procs; shift
    (
        for procs in $(cg_procs "$name"); do echo "$BASHPID" > "$procs"; done
        exec "$@"
    )
}

# cg_read_bytes NAME DEVICE: bytes the cgroup has read from DEVICE so far.
cg_read_bytes() {
    if [ "$CG_VERSION" = 1 ]; then
        awk -v dev="$2" '$1 == dev && $2 == "Read" { print $3; found = 1 } END { if (!found) print 0 }' \
            "$CG_BLKIO/$1/blkio.throttle.io_service_bytes"
    else
        awk -v dev="$2" '$1 == dev { for (i = 2; i <= NF; i++) if ($i ~ /^rbytes=/) { print substr($i, 8); found = 1 } }
            END { if (!found) print 0 }' "$CG_V2/$1/io.stat"
    fi
}

# cg_destroy NAME: removes the cgroup (its processes must have exited).
cg_destroy() {
    if [ "$CG_VERSION" = 1 ]; then
        rmdir "$CG_MEM/$1" "$CG_BLKIO/$1" 2>/dev/null || true
    else
        rmdir "$CG_V2/$1" 2>/dev/null || true
    fi
}

# cg_kill NAME: ends the processes left in the cgroup, by their ids (SIGTERM, SIGKILL after
# 5 s), so that it can be removed after a run cut short by an error or an interrupt. A
# daemon's SIGTERM unmounts its mount.
cg_kill() {
    local procs=$CG_V2/$1/cgroup.procs pids i
    if [ "$CG_VERSION" = 1 ]; then procs=$CG_MEM/$1/cgroup.procs; fi
    for i in $(seq 1 51); do
        pids=$(cat "$procs" 2>/dev/null) || return 0
        [ -n "$pids" ] || return 0
        # shellcheck disable=SC2086
        case $i in 1) kill $pids 2>/dev/null || true ;; 51) kill -KILL $pids 2>/dev/null || true ;; esac
        sleep 0.1
    done
}

# device_of DIR: MAJ:MIN of the disk holding DIR (for throttling rules, which take a whole
# disk: a partition's MAJ:MIN becomes its disk's), or the filesystem's own MAJ:MIN when it is
# on no block device (tmpfs, overlay: nothing to throttle).
device_of() {
    local dev
    dev=$(findmnt -no MAJ:MIN -T "$1" | tr -d ' ')
    if [ -e "/sys/dev/block/$dev/partition" ]; then dev=$(cat "/sys/dev/block/$dev/../dev"); fi
    echo "$dev"
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

# page_order DIR [FILES]: of the pages the page cache holds for FILES (300) files spread over
# DIR, the share that sit in memory right after the page before them in the file
# (/proc/self/pagemap, root only; a page not cached is read in by the look). Copying out of
# pages strewn over memory costs more: one mount of 100 KiB files read its hot epochs in
# 0.265-0.281 s with its pages in order and 0.307-0.329 s strewn, native 0.29-0.30 s.
page_order() {
    python3 - "$1" "${2:-300}" <<'PY'
import ctypes, mmap, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
files = sorted(os.path.join(r, f) for r, _, fs in os.walk(sys.argv[1]) for f in fs)
files = files[:: max(1, len(files) // int(sys.argv[2]))]
pairs = follow = 0
with open("/proc/self/pagemap", "rb") as pagemap:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        if size:
            at = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            view = (ctypes.c_char * size).from_address(at)
            prev = None
            for page in range((size + 4095) // 4096):
                view[page * 4096]  # faults the page in from the page cache
                pagemap.seek((at // 4096 + page) * 8)
                entry = struct.unpack("Q", pagemap.read(8))[0]
                pfn = entry & ((1 << 55) - 1) if entry >> 63 else None
                if prev is not None and pfn is not None:
                    pairs += 1
                    follow += pfn == prev + 1
                prev = pfn
            libc.munmap(at, size)
        os.close(fd)
print(f"{follow / pairs:.2f}" if pairs else "-")
PY
}

# coorfs_stat MNT NAME: one stat of a mount (its user.coorfs.NAME attribute; no getfattr).
coorfs_stat() {
    python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.coorfs." + sys.argv[2]).decode())' "$1" "$2"
}

# wait_scan MNT: waits (at most a minute) until the mount's scan of its source is complete.
wait_scan() {
    for _ in $(seq 1 600); do
        [ "$(coorfs_stat "$1" scan_complete 2>/dev/null)" = 1 ] && return 0
        sleep 0.1
    done
    echo "the mount at $1 did not finish scanning its source within 60 s" >&2
    return 1
}

# file_bytes DIR: the total size of the regular files below DIR (what a reader reads in one
# epoch; du counts directories too, and awk loses precision past 2^31 with mawk).
file_bytes() {
    find "$1" -type f -printf '%s\n' | python3 -c 'import sys; print(sum(int(l) for l in sys.stdin))'
}

# bench_start NAME [BASE]: a work directory in BASE (default /tmp) with an empty mount point and
# the name of a cgroup for the runs (sets work, mnt and cg), removed on exit with whatever is
# still mounted there. Needs $coorfs.
bench_start() {
    work=$(mktemp -d "${2:-/tmp}/coorfs-$1.XXXXXX")
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
# and none are that cache policy alone (--no-prefetch), minio-nopt MinIO alone with every read
# through the daemon (--no-passthrough); prefetch is MinIO with remaining-set prefetch, whose
# staging area (STAGING bytes) the pair gets on top. Storage reads are
# throttled to BPS on device dev either way.
bench_side() {
    drop_pages "$DATA"
    local memory=$((BUDGET + OVERHEAD + $2)) opts=(--policy "$1" --no-prefetch)
    case "$1" in
        native) memory=$((BUDGET + $2)) ;;
        prefetch) memory=$((memory + STAGING)) opts=(--policy minio --prefetch-memory "$STAGING") ;;
        minio-nopt) opts=(--policy minio --no-prefetch --no-passthrough) ;;
    esac
    cg_create "$cg" "$memory" "$BPS" "$dev"
    dir="$DATA"
    if [ "$1" != native ]; then
        cg_run "$cg" "$coorfs" mount "${opts[@]}" --cache-size "$BUDGET" "$DATA" "$mnt"
        wait_scan "$mnt"
        dir="$mnt"
    fi
}
