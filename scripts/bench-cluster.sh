#!/usr/bin/env bash
# A distributed job on NODES servers that share one slow storage, emulated on this machine:
# the native page cache per node, coorfs with a cache per node, and a coorfs cluster whose
# members partition one cache and serve each other.
#
#   scripts/bench-cluster.sh                     # REPS=3, 3 nodes, 5 epochs
#   BPS=$((100 << 20)) scripts/bench-cluster.sh  # storage 4x faster
#   FILES=600 REPS=1 EPOCHS=2 scripts/bench-cluster.sh     # a dry run, in seconds
#
# The dataset: FILES files of ~110 KiB. Each epoch, every node reads its DistributedSampler
# shard (scripts/shard-read.py: the indices shuffled with seed REP + epoch, every NODES-th
# from the node's rank) with PROCS processes; the nodes start together and the epoch ends when
# the last finishes, as a synchronous job's does.
#
# Storage is shared and slow: each node reads the dataset through a view of its own (a coorfs
# mount with --policy none --read-delay DELAY, which adds a network round trip to each read
# and has its own page cache, as an NFS client on each server would), and the three views'
# daemons run in one cgroup whose reads of the disk are throttled to BPS in all and whose
# page cache is STORE_MEM: the storage's bandwidth is what the nodes share. BPS is 25 MiB/s
# by default: here the three nodes share 2 CPUs, which move about 250 MB/s of reads through
# FUSE and HTTP for the whole cluster, so 25 MiB/s keeps a real cluster's ratio of network to
# storage (about 10x a node; docs/BENCHMARKS.md has the arithmetic).
#
# Each node runs in a memory cgroup of its own. native: the shard read from the node's view,
# its page cache within BUDGET (SHARE% of the dataset) + READER. independent: a coorfs mount
# of the view with --cache-size BUDGET, each node on its own; cluster: the same mounts as
# members of one cluster (--peers; peers over the loopback interface). Both coorfs systems
# hand each epoch's shard order to their mount (--hint) and get BUDGET + OVERHEAD + STAGING
# + READER. Per epoch: the slowest node's seconds, the bytes the storage served (the views'
# bytes_from_source) and the bytes members sent each other (bytes_from_peers).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

REPS=${REPS:-3}
EPOCHS=${EPOCHS:-5}
NODES=${NODES:-3}
PROCS=${PROCS:-2}
FILES=${FILES:-6000}
SHARE=${SHARE:-40}
DATA=${DATA:-/var/tmp/coorfs-bench/cluster-$FILES}
BPS=${BPS:-$((25 << 20))}
DELAY=${DELAY:-1ms}
STORE_MEM=${STORE_MEM:-$((64 << 20))}
READER=${READER:-$((128 << 20))}
OVERHEAD=${OVERHEAD:-$((64 << 20))}
STAGING=${STAGING:-$((128 << 20))}
SYSTEMS=${SYSTEMS:-"native independent cluster"}

cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
python3 scripts/make-dataset.py --files "$FILES" --size 110K --classes 100 "$DATA" >/dev/null
dataset_bytes=$(file_bytes "$DATA")
BUDGET=${BUDGET:-$((dataset_bytes * SHARE / 100))}
dev=$(device_of "$DATA")

work=$(mktemp -d /tmp/coorfs-bench-cluster.XXXXXX)
store="coorfs-store-$$"
nodes=$(seq 0 $((NODES - 1)))
cleanup() {
    for m in "$work"/mnt* "$work"/view*; do
        if grep -qs " $m fuse.coorfs " /proc/mounts; then $coorfs umount "$m" || umount -l "$m"; fi
    done
    for n in $nodes; do cg_kill "coorfs-node$n-$$"; cg_destroy "coorfs-node$n-$$"; done
    cg_kill "$store"
    cg_destroy "$store"
    rm -rf "$work"
}
trap cleanup EXIT
(cd "$DATA" && find . -type f -printf '%P\n' | sort) > "$work/files"
printf 'a-benchmark-cluster-secret-%s\n' "$$" > "$work/secret"
chmod 600 "$work/secret"
ports=$(python3 -c "
import socket
held = [socket.socket() for _ in range($NODES)]
for s in held: s.bind(('127.0.0.1', 0))
print(','.join('127.0.0.1:%d' % s.getsockname()[1] for s in held))")
samples=$work/samples.txt
: > "$samples"

# views: fresh views of the dataset for the nodes, in the storage's cgroup, with nothing of
# the dataset in any page cache.
views() {
    drop_pages "$DATA"
    cg_create "$store" "$STORE_MEM" "$BPS" "$dev"
    for n in $nodes; do
        mkdir -p "$work/view$n" "$work/mnt$n"
        cg_run "$store" "$coorfs" mount --policy none --no-prefetch --read-delay "$DELAY" "$DATA" "$work/view$n"
        wait_scan "$work/view$n"
    done
}

unviews() {
    for n in $nodes; do $coorfs umount "$work/view$n"; done
    cg_kill "$store"
    cg_destroy "$store"
}

# sum_stat PREFIX NAME: the sum of stat NAME over the nodes' mounts $work/PREFIX0...
sum_stat() {
    local total=0 n
    for n in $nodes; do total=$((total + $(coorfs_stat "$work/$1$n" "$2"))); done
    echo "$total"
}

for rep in $(seq 1 "$REPS"); do
    for sys in $SYSTEMS; do
        views
        for n in $nodes; do
            cg=coorfs-node$n-$$
            dir[n]=$work/view$n
            if [ "$sys" = native ]; then
                cg_create "$cg" $((BUDGET + READER)) 0 "$dev"
                continue
            fi
            cg_create "$cg" $((BUDGET + OVERHEAD + STAGING + READER)) 0 "$dev"
            opts=(--cache-size "$BUDGET" --prefetch-memory "$STAGING" --job-key pgid)
            if [ "$sys" = cluster ]; then
                opts+=(--peers "$ports" --node-rank "$n" --cluster-secret-file "$work/secret")
            fi
            cg_run "$cg" "$coorfs" mount "${opts[@]}" "$work/view$n" "$work/mnt$n"
            wait_scan "$work/mnt$n"
            dir[n]=$work/mnt$n
        done
        hint=(); [ "$sys" = native ] || hint=(--hint)
        for epoch in $(seq 1 "$EPOCHS"); do
            stored=$(sum_stat view bytes_from_source)
            peered=0; [ "$sys" = native ] || peered=$(sum_stat mnt bytes_from_peers)
            for n in $nodes; do
                cg_run "coorfs-node$n-$$" python3 scripts/shard-read.py --list "$work/files" --rank "$n" \
                    --world "$NODES" --epoch "$epoch" --seed "$rep" --procs "$PROCS" "${hint[@]}" "${dir[n]}" \
                    > "$work/out$n" &
            done
            wait
            secs=$(cat "$work"/out* | python3 -c 'import json,sys; print(max(json.loads(l)["seconds"] for l in sys.stdin))')
            stored=$(($(sum_stat view bytes_from_source) - stored))
            [ "$sys" = native ] || peered=$(($(sum_stat mnt bytes_from_peers) - peered))
            echo "$sys $rep $epoch $secs $stored - $peered" | tee -a "$samples" >&2
        done
        for n in $nodes; do
            if [ "$sys" != native ]; then
                m=$work/mnt$n
                pid=$(coorfs_stat "$m" pid)
                echo "  $sys node $n: cached $(coorfs_stat "$m" cached_bytes) B," \
                    "staging_hits $(coorfs_stat "$m" staging_hits), fetch_stall $(coorfs_stat "$m" fetch_stall_seconds) s," \
                    "peer_errors $(coorfs_stat "$m" peer_errors), daemon CPU $(awk '{ print ($14 + $15) / 100 }' "/proc/$pid/stat") s," \
                    "peak memory $(cat "$CG_MEM/coorfs-node$n-$$/memory.max_usage_in_bytes" 2>/dev/null || echo ?) B" >&2
                $coorfs umount "$work/mnt$n"
            fi
            cg_destroy "coorfs-node$n-$$"
        done
        unviews
    done
done

echo
echo "scripts/bench-cluster.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d): $NODES nodes, $FILES files," \
    "$((dataset_bytes / 1000000)) MB; cache $SHARE% of it per node ($((BUDGET >> 20)) MiB); $PROCS readers a node;" \
    "shared storage $((BPS >> 20)) MiB/s + $DELAY a read"
echo
cut -d' ' -f1-6 "$samples" | python3 scripts/epochstats.py --baseline native --dataset-bytes "$dataset_bytes"
if [[ " $SYSTEMS " == *" independent "* ]]; then
    echo
    echo "Against coorfs with a cache per node:"
    echo
    cut -d' ' -f1-6 "$samples" | python3 scripts/epochstats.py --baseline independent --dataset-bytes "$dataset_bytes" |
        sed -n '/^| epoch |/,$p'
fi
echo
echo "Peer traffic (median MiB an epoch, all nodes):"
python3 - "$samples" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    s, rep, ep, secs, stored, _, peered = line.split()
    rows[(s, int(ep))].append(int(peered) / 2**20)
for (s, ep), v in sorted(rows.items()):
    if s != "native":
        print(f"  {s} epoch {ep}: {statistics.median(v):.0f} MiB")
PY
