#!/usr/bin/env bash
# Attacks a fresh coorfs mount the way a user of a shared machine could, and prints PASS or
# FAIL per case (exit status 1 if any case fails). Run as root: the daemon runs as root with
# --allow-other, the attacks run as nobody. Needs fuse3, attr, acl and python3; the same
# cases are real-mount tests in tests/it/security.rs and tests/it/lifecycle.rs.
#
#   scripts/audit-security.sh
set -uo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "audit-security.sh: run as root" >&2; exit 2; }
for tool in getfattr setfacl python3 setpriv; do
    command -v $tool >/dev/null || { echo "audit-security.sh: needs $tool (apt-get install -y attr acl python3 util-linux)" >&2; exit 2; }
done
cargo build --release --quiet || exit 2
coorfs=$PWD/target/release/coorfs

work=$(mktemp -d /tmp/coorfs-audit.XXXXXX)
chmod 755 "$work"
src=$work/src mnt=$work/mnt out=$work/outside
mounts=()
cleanup() {
    for m in "${mounts[@]}" "$mnt"; do
        grep -qs " $m fuse" /proc/mounts && { $coorfs umount "$m" 2>/dev/null || umount -l "$m"; }
    done
    rm -rf "$work"
}
trap cleanup EXIT
failed=0
verdict() { # verdict NAME OK(0/1) DETAIL
    if [ "$2" = 0 ]; then printf 'PASS  %s\n' "$1"; else printf 'FAIL  %s: %s\n' "$1" "$3"; failed=1; fi
}
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
# A Python that nobody may run (a pyenv shim under /root is not one).
py=/usr/bin/python3
# Order hints as the mount takes them (src/fs/order.rs): chunks by ioctl, then a commit.
HINT_PY='
import fcntl, os
CHUNK = 16380
def send(fd, data):
    for at in range(0, len(data), CHUNK - 4):
        part = data[at:at + CHUNK - 4]
        buf = bytearray(CHUNK)
        buf[:4] = len(part).to_bytes(4, "little")
        buf[4:4 + len(part)] = part
        fcntl.ioctl(fd, (1 << 30) | (CHUNK << 16) | (ord("C") << 8) | 1, buf, True)
def commit(fd):
    fcntl.ioctl(fd, (ord("C") << 8) | 2, 0)
'
hint() { nobody $py -c "$HINT_PY
import sys
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    send(fd, sys.argv[2].encode()); commit(fd); print(0)
except OSError as e:
    print(e.errno)" "$mnt/.coorfs-order" "$1"; }
nobody $py -c pass 2>/dev/null || { echo "audit-security.sh: nobody cannot run $py (apt-get install -y python3)" >&2; exit 2; }
fresh_mount() { # fresh_mount [OPTIONS]: (re)mounts $src at $mnt
    grep -qs " $mnt fuse" /proc/mounts && $coorfs umount "$mnt"
    $coorfs mount --allow-other "$@" "$src" "$mnt"
}

mkdir -p "$src/u" "$src/d" "$mnt" "$out/z"
chmod 755 "$src" "$src/d" "$mnt"
echo "TRIPWIRE" > "$out/shadow"; echo "TRIPWIRE" > "$out/z/shadow"; chmod 700 "$out"
chown nobody "$src/u"
for f in f acl rewrite; do echo "$f data" > "$src/$f"; chmod 644 "$src/$f"; done
echo "g data" > "$src/d/g"; chmod 644 "$src/d/g"
head -c 32M /dev/urandom > "$src/big"; chmod 644 "$src/big"
nobody sh -c "mkdir '$src/u/z' && echo mine > '$src/u/z/shadow'"
fresh_mount

# 1. A directory swapped for a symlink out of the source.
nobody cat "$mnt/u/z/shadow" >/dev/null
# A tripwire on the directory outside: inotify reports any open or read of it or its files.
python3 - "$out" > "$work/tripwire" <<'PY' &
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_NONBLOCK)
for p in (sys.argv[1], sys.argv[1] + "/z"):
    libc.inotify_add_watch(fd, p.encode(), 0x20 | 0x01 | 0x10)  # OPEN | ACCESS | CLOSE_NOWRITE
time.sleep(3)
try:
    print(len(os.read(fd, 4096)))
except BlockingIOError:
    print(0)
PY
watcher=$!
sleep 0.5
nobody sh -c "mv '$src/u/z' '$src/u/z.old' && ln -s '$out' '$src/u/z'"
got=$(nobody sh -c "cat '$mnt/u/z/shadow'; ls -l '$mnt/u/z/'" 2>/dev/null; hint u/z/shadow >/dev/null)
wait $watcher
case "$got" in *TRIPWIRE*) verdict "symlink swap: nobody reads outside the source" 1 "read the secret";;
    *) verdict "symlink swap: nobody reads outside the source" 0 "";; esac
[ "$(cat "$work/tripwire")" = 0 ]; verdict "symlink swap: the daemon opens nothing outside the source" $? "inotify saw $(cat "$work/tripwire") bytes of events"

# 2-3. Permissions changed after mounting (attributes cached for a day).
nobody cat "$mnt/f" "$mnt/d/g" >/dev/null
chmod 000 "$src/f"; chmod 700 "$src/d"
nobody cat "$mnt/f" >/dev/null 2>&1; verdict "chmod 000 after mount refuses the next open" $((1 - $?)) "nobody still reads f"
nobody cat "$mnt/d/g" >/dev/null 2>&1; verdict "chmod 700 on a directory refuses the next open" $((1 - $?)) "nobody still reads d/g"
chmod 644 "$src/f"; chmod 755 "$src/d"

# 4. An ACL entry that denies.
setfacl -m u:nobody:--- "$src/acl"
nobody cat "$mnt/acl" >/dev/null 2>&1; verdict "ACL user:nobody:--- is honoured" $((1 - $?)) "nobody reads acl"

# 5. In-place rewrite at the same size, mtime restored.
cat "$mnt/rewrite" "$mnt/rewrite" >/dev/null
touch -r "$src/rewrite" "$work/ref"
printf 'REWRITE data\n' | dd of="$src/rewrite" bs=13 count=1 conv=notrunc status=none
touch -r "$work/ref" "$src/rewrite"
[ "$(cat "$mnt/rewrite")" = "REWRITE data" ]; verdict "a rewrite with the mtime restored is not served stale" $? "old bytes served"

# 6. Truncation while a reader is in the middle of a file.
n=$(python3 - "$mnt/big" "$src/big" <<'PY'
import os, sys
f = open(sys.argv[1], "rb", buffering=0)
f.read(1 << 20)
os.truncate(sys.argv[2], 3 << 20)
rest = 0
while True:
    b = f.read(1 << 20)
    if not b:
        break
    rest += len(b)
print((1 << 20) + rest)
PY
)
[ "$n" = $((3 << 20)) ]; verdict "a file truncated while read yields nothing past its new end" $? "read $n bytes of a 3 MiB file"

# 7. Order-file memory: 12 opens of 60 MiB each, as nobody.
pid=$(getfattr -n user.coorfs.pid --only-values "$mnt" 2>/dev/null)
before=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
nobody $py - "$mnt/.coorfs-order" <<PY > "$work/hints" 2>&1
$HINT_PY
import sys
fds = [os.open(sys.argv[1], os.O_RDONLY) for _ in range(12)]
data = b"f\\n" * (30 << 20)
for fd in fds:
    try:
        send(fd, data)
    except OSError:
        pass
print("wrote")
PY
after=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
grown=$(( (after - before) / 1024 ))
[ "$grown" -lt 200 ] && grep -q wrote "$work/hints"; verdict "order hints of nobody stay within --hint-memory (grew $grown MiB, budget 256)" $? "grew $grown MiB"

# 8. Existence oracle through hints.
mkdir -p "$src/private"; echo x > "$src/private/hidden.jpg"; chmod 700 "$src/private"
a=$(hint private/hidden.jpg); b=$(hint private/missing.jpg)
[ "$a" = 2 ] && [ "$b" = 2 ]; verdict "a hint cannot tell a hidden file from a missing one ($a, $b)" $? "hidden $a, missing $b"

# 9. Two mounts at one mount point at the same moment.
$coorfs umount "$mnt"
$coorfs mount "$src" "$mnt" 2>/dev/null & p1=$!
$coorfs mount "$src" "$mnt" 2>/dev/null & p2=$!
wait $p1; r1=$?; wait $p2; r2=$?
count=$(grep -c " $mnt fuse.coorfs " /proc/mounts)
[ "$count" = 1 ] && [ $((r1 + r2)) = 2 ]; verdict "concurrent mounts at one point: exactly one wins" $? "exit $r1 and $r2, $count mounts"
while grep -qs " $mnt fuse" /proc/mounts; do $coorfs umount "$mnt" 2>/dev/null || umount -l "$mnt"; done

# 10-12. Odd input.
mkdir -p "$work/upper"; chmod 755 "$work/upper"; fresh_mount
$coorfs mount "$mnt" "$work/upper" 2>/dev/null; r=$?
[ $r = 2 ]; verdict "a coorfs mount as the source is refused" $? "exit $r"
grep -qs " $work/upper fuse" /proc/mounts && $coorfs umount "$work/upper"
$coorfs mount --cache-size 0 "$src" "$work/upper" 2>/dev/null; r=$?
[ $r = 2 ]; verdict "--cache-size 0 is refused" $? "exit $r"
grep -qs " $work/upper fuse" /proc/mounts && $coorfs umount "$work/upper"
timeout 20 $coorfs analyze /proc/self --time 2s >/dev/null 2>&1; r=$?
[ $r != 124 ]; verdict "coorfs analyze /proc/self ends within its --time (exit $r)" $? "still running after 20 s"

exit $failed
