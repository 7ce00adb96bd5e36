#!/usr/bin/env bash
# Epochs of a dataset in an S3 store with a network's latency: coorfs beside the S3 mounts
# and readers users run today, each in a memory cgroup of the same limit (POD), in one run.
#
#   scripts/bench-s3.sh                              # REPS=2, about 30 minutes
#   DISK=$((128 << 20)) SYSTEMS="boto3 s3torch rclone coorfs hint" scripts/bench-s3.sh
#   FILES=200 REPS=1 EPOCHS=2 scripts/bench-s3.sh    # a dry run, in a minute
#   COORFS_OPTS="--readahead 32M" SYSTEMS=coorfs scripts/bench-s3.sh   # options for the mounts
#   SHARDS=32 SHARD_SIZE=24M POD=$((384 << 20)) DISK=$((256 << 20)) PACE=100M scripts/bench-s3.sh
#
# With SHARDS, the dataset is SHARDS WebDataset .tar shards of SHARD_SIZE
# (scripts/make-shards.py) instead of small files (scripts/bench-shards.sh s3 runs it so).
# With PACE (e.g. 100M), the server sends each answer at most at PACE bytes a second, about
# what one S3 stream gives.
#
# With STORE=gcs or STORE=azure the dataset is in Google Cloud Storage's or Azure Blob
# Storage's emulator instead (fake-gcs-server, Azurite: what scripts/test.sh installs under
# target/), behind scripts/delay-proxy.py, which adds the same LATENCY and PACE; the mount is
# gs://bench/ds or az://bench/ds, configured as those clouds' tools are (STORAGE_EMULATOR_HOST,
# AZURE_STORAGE_CONNECTION_STRING), and SYSTEMS defaults to "coorfs hint" (the other readers
# speak S3 only). The same figures, to set beside STORE=s3's:
#   STORE=gcs SYSTEMS=coorfs scripts/bench-s3.sh
# VIA_PROXY=1 puts moto behind the same proxy (s3-server.py adding no latency of its own), so
# that the three stores are measured through one path:
#   VIA_PROXY=1 STORE=s3 SYSTEMS=coorfs scripts/bench-s3.sh
#
# The store: moto's S3 server (scripts/s3-server.py, from the venv scripts/test.sh installs
# into target/moto) answering every request after LATENCY (20 ms: first byte from a store in
# another zone). This kernel has no netem, so the server adds it. The dataset: FILES files of
# 30-220 KiB in 100 class directories (scripts/make-dataset.py), uploaded under
# s3://bench/ds; it is 1.3x the pod by default.
#
# Systems (SYSTEMS), each epoch a fresh random order read whole by PROCS processes:
#   boto3  - scripts/s3-read.py: each process reads its share with boto3 get_object, one
#            object after another (a DataLoader's workers reading S3 directly);
#   s3torch - scripts/s3torch-read.py: the same with s3torchconnector 1.5.0 (PyPI), whose
#            S3Client is the CRT client of mountpoint-s3 (an object split into 8 MiB parts
#            fetched at once), each object read whole with its default (sequential) S3Reader,
#            as S3MapDataset's workers read. Its process imports torch first (about 290 MiB
#            of memory with the CUDA wheel: in the 384 MiB pod the readers are OOM-killed)
#            and then joins the cgroup, which is charged with the reading alone, as for the
#            others. Its venv, target/s3torch, is made on first use (torch 2.15.0 and
#            s3torchconnector from PyPI, about 5 GiB with torch's CUDA libraries;
#            TORCH_INDEX=URL takes torch from that index instead, e.g. a CPU-only one); if
#            the install fails, s3torch is skipped with a line saying so;
#   s3fs   - s3fs-fuse 1.90 (Debian), read-only, its defaults (no disk cache);
#   rclone - rclone 1.60 mount (Debian), --vfs-cache-mode full: its cache is on local disk,
#            capped at DISK (--vfs-cache-max-size, enforced every 5 s);
#   coorfs - coorfs mount s3://bench/ds, default options (the elastic memory cache, prefetch)
#            and the same local disk as rclone: --cache-dir with --disk-cache-size DISK;
#   hint   - the same mount, and `coorfs read --hint` hands each epoch's order to it first;
#   memory - coorfs with its memory cache only (no --cache-dir; not in the default SYSTEMS);
#   raw    - no reader but scripts/store-client.py get-dir: every object GET whole, 16 at
#            once, as fast as the store answers (any STORE; not in the default SYSTEMS): the
#            store's own speed, beside which a mount's is read.
# The mounts are read with `coorfs read --procs PROCS`. Per epoch: seconds; for coorfs the hit
# rate. Every reader reports the bytes it read; an epoch that did not read the whole dataset is
# named in the summary. The summary gives each system's median epoch times, and coorfs's ratio
# over the best of boto3, s3torch, s3fs and rclone per epoch (the issue's targets: epoch 1 >=
# 2x, epochs 2+ >= 3x, with hints >= 5x).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh

REPS=${REPS:-2}
EPOCHS=${EPOCHS:-3}
FILES=${FILES:-2000}
POD=${POD:-$((192 << 20))}
DISK=${DISK:-$POD}
PROCS=${PROCS:-2}
LATENCY=${LATENCY:-20ms}
STORE=${STORE:-s3}
case $STORE in
s3) SYSTEMS=${SYSTEMS:-"boto3 s3torch s3fs rclone coorfs hint"} ;;
gcs | azure) SYSTEMS=${SYSTEMS:-"coorfs hint"} ;;
*)
    echo "bench-s3.sh: STORE is s3, gcs or azure, not $STORE" >&2
    exit 2
    ;;
esac
SHARDS=${SHARDS:-}
SHARD_SIZE=${SHARD_SIZE:-24M}
PACE=${PACE:-0}
VIA_PROXY=${VIA_PROXY:-}
if [ -n "$SHARDS" ]; then
    DATA=${DATA:-/var/tmp/coorfs-bench/s3-shards-$SHARDS-$SHARD_SIZE}
else
    DATA=${DATA:-/var/tmp/coorfs-bench/s3-$FILES}
fi
PORT=${PORT:-$((20000 + $$ % 10000))}

for tool in rclone s3fs; do
    if [[ " $SYSTEMS " == *" $tool "* ]] && ! command -v "$tool" >/dev/null; then
        echo "bench-s3.sh: needs $tool: apt-get install -y rclone s3fs" >&2
        exit 2
    fi
done
venv=target/moto
if [ ! -x "$venv/bin/moto_server" ]; then
    echo "bench-s3.sh: needs moto's server in $venv: scripts/test.sh installs it" >&2
    exit 2
fi
# s3torchconnector's venv, made on first use; s3torch is skipped if it cannot be made.
s3torch=target/s3torch
if [[ " $SYSTEMS " == *" s3torch "* ]] && ! "$s3torch/bin/python" -c 'import s3torchconnector' 2>/dev/null; then
    echo "== bench-s3.sh: installing torch 2.15.0 and s3torchconnector 1.5.0 into $s3torch (PyPI)" >&2
    rm -rf "$s3torch"
    mkdir -p target
    if ! { python3 -m venv "$s3torch" &&
        "$s3torch/bin/pip" install --quiet --disable-pip-version-check ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch==2.15.0" &&
        "$s3torch/bin/pip" install --quiet --disable-pip-version-check "s3torchconnector==1.5.0" "numpy==2.4.6"; } \
        > target/s3torch-install.log 2>&1; then
        echo "bench-s3.sh: s3torch skipped: installing s3torchconnector into $s3torch failed (target/s3torch-install.log)" >&2
        rm -rf "$s3torch"
        SYSTEMS=$(echo " $SYSTEMS " | sed 's/ s3torch / /; s/^ *//; s/ *$//')
    fi
fi
cargo build --release --quiet
coorfs=$PWD/target/release/coorfs
if [ -n "$SHARDS" ]; then
    python3 scripts/make-shards.py --shards "$SHARDS" --size "$SHARD_SIZE" "$DATA"
    FILES=$SHARDS
else
    python3 scripts/make-dataset.py --files "$FILES" --size 30K --max-size 220K --classes 100 "$DATA" >/dev/null
fi
dataset_bytes=$(file_bytes "$DATA")
bench_start s3 /var/tmp
samples=$work/samples.txt
: > "$samples"
endpoint=http://127.0.0.1:$PORT
export AWS_ENDPOINT_URL=$endpoint AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=bench \
    AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
echo "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" > "$work/s3fs.passwd"
chmod 600 "$work/s3fs.passwd"

upstream=$((PORT + 1))
case $STORE in
s3)
    if [ -n "$VIA_PROXY" ]; then
        "$venv/bin/python" scripts/s3-server.py --port "$upstream" --latency 0 > "$work/server.log" 2>&1 &
        store_name="moto behind scripts/delay-proxy.py"
    else
        "$venv/bin/python" scripts/s3-server.py --port "$PORT" --latency "$LATENCY" --pace "$PACE" > "$work/server.log" 2>&1 &
        store_name=moto
    fi
    servers=$!
    url=s3://bench/ds
    ;;
gcs)
    target/fakegcs/bin/fake-gcs-server -scheme http -backend memory -host 127.0.0.1 -port "$upstream" \
        -public-host "127.0.0.1:$upstream" -external-url "http://127.0.0.1:$upstream" -log-level error \
        > "$work/server.log" 2>&1 &
    servers=$!
    export STORAGE_EMULATOR_HOST=$endpoint
    url=gs://bench/ds
    store_name="fake-gcs-server behind scripts/delay-proxy.py"
    ;;
azure)
    target/azurite/node_modules/.bin/azurite-blob --blobHost 127.0.0.1 --blobPort "$upstream" \
        --inMemoryPersistence --silent --skipApiVersionCheck > "$work/server.log" 2>&1 &
    servers=$!
    export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=$endpoint/devstoreaccount1;"
    url=az://bench/ds
    store_name="Azurite behind scripts/delay-proxy.py"
    ;;
esac
if [ "$STORE" != s3 ] || [ -n "$VIA_PROXY" ]; then
    python3 scripts/delay-proxy.py --port "$PORT" --upstream "127.0.0.1:$upstream" --latency "$LATENCY" --pace "$PACE" \
        > "$work/proxy.log" 2>&1 &
    servers="$servers $!"
fi
# Ends the servers with the rest of the clean-up.
trap 'unmount_any; kill $servers 2>/dev/null || true; cg_kill "$cg"; bench_cleanup' EXIT
unmount_any() {
    if grep -qs " $mnt " /proc/mounts; then fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt"; fi
}
for _ in $(seq 1 100); do
    curl -s -o /dev/null "$endpoint" && break
    sleep 0.1
done
echo "uploading $FILES files ($((dataset_bytes >> 20)) MiB) to $url ..." >&2
if [ "$STORE" != s3 ]; then
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "http://127.0.0.1:$upstream" && break
        sleep 0.1
    done
    python3 scripts/store-client.py "$STORE" "http://127.0.0.1:$upstream" mkbucket bench
    python3 scripts/store-client.py "$STORE" "http://127.0.0.1:$upstream" put-dir bench ds "$DATA"
else
    store_at=$endpoint
    [ -z "$VIA_PROXY" ] || store_at=http://127.0.0.1:$upstream
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "$store_at" && break
        sleep 0.1
    done
    "$venv/bin/python" - "$DATA" "$store_at" <<'PY'
import concurrent.futures, os, sys, boto3
root, endpoint = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=endpoint)
s3.create_bucket(Bucket="bench")
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
def put(path):
    with open(path, "rb") as f:
        s3.put_object(Bucket="bench", Key="ds/" + os.path.relpath(path, root), Body=f.read())
with concurrent.futures.ThreadPoolExecutor(16) as pool:
    list(pool.map(put, files))
PY
fi

# mount_side SYSTEM: mounts s3://bench/ds at $mnt for SYSTEM, its daemon in the cgroup.
mount_side() {
    case "$1" in
    s3fs)
        cg_run "$cg" s3fs bench:/ds "$mnt" -o "url=$endpoint,use_path_request_style,ro,passwd_file=$work/s3fs.passwd"
        ;;
    rclone)
        rm -rf "$work/rclone-cache"
        # (AWS_CA_BUNDLE, if the machine sets one, breaks rclone's HTTP transport; the store is plain HTTP.)
        cg_run "$cg" env -u AWS_CA_BUNDLE rclone mount ":s3:bench/ds" "$mnt" --s3-provider Other --s3-endpoint "$endpoint" \
            --s3-access-key-id "$AWS_ACCESS_KEY_ID" --s3-secret-access-key "$AWS_SECRET_ACCESS_KEY" \
            --vfs-cache-mode full --vfs-cache-max-size "$DISK" --vfs-cache-poll-interval 5s \
            --cache-dir "$work/rclone-cache" \
            --read-only --daemon
        ;;
    coorfs | hint)
        rm -rf "$work/coorfs-cache"
        cg_run "$cg" "$coorfs" mount --job-key pgid --cache-dir "$work/coorfs-cache" \
            --disk-cache-size "$DISK" ${COORFS_OPTS:-} "$url" "$mnt"
        wait_scan "$mnt"
        ;;
    memory)
        cg_run "$cg" "$coorfs" mount --job-key pgid "$url" "$mnt"
        wait_scan "$mnt"
        ;;
    esac
    if [ "$1" = s3fs ] || [ "$1" = rclone ]; then
        for _ in $(seq 1 300); do
            [ -n "$(ls -A "$mnt" 2>/dev/null)" ] && return 0
            sleep 0.1
        done
        echo "bench-s3.sh: $1 did not mount" >&2
        exit 1
    fi
}

for rep in $(seq 1 "$REPS"); do
    for sys in $SYSTEMS; do
        cg_create "$cg" "$POD" 0 0
        [ "$sys" = boto3 ] || [ "$sys" = s3torch ] || [ "$sys" = raw ] || mount_side "$sys"
        for epoch in $(seq 1 "$EPOCHS"); do
            seed=$((rep * 100 + epoch))
            if [ "$sys" = raw ]; then
                out=$(python3 scripts/store-client.py "$STORE" "$endpoint" get-dir bench ds "$DATA" |
                    awk '{printf "{\"seconds\": %s, \"bytes\": %s}", $1, $3}')
            elif [ "$sys" = boto3 ]; then
                out=$(cg_run "$cg" "$venv/bin/python" scripts/s3-read.py --endpoint "$endpoint" \
                    --procs "$PROCS" --seed "$seed" bench ds)
            elif [ "$sys" = s3torch ]; then
                # It joins the cgroup itself, after importing torch (scripts/s3torch-read.py).
                join=()
                for procs in $(cg_procs "$cg"); do join+=(--join "$procs"); done
                out=$("$s3torch/bin/python" scripts/s3torch-read.py --endpoint "$endpoint" \
                    --procs "$PROCS" --seed "$seed" "${join[@]}" bench ds)
            else
                hint=()
                [ "$sys" = hint ] && hint=(--hint)
                out=$(cg_run "$cg" "$coorfs" read --json "${hint[@]}" --procs "$PROCS" --seed "$seed" "$mnt")
            fi
            secs=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
            bytes=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])')
            if [ "$bytes" != "$dataset_bytes" ]; then
                echo "bench-s3.sh: $sys rep $rep epoch $epoch read $bytes bytes, not the dataset's $dataset_bytes" >&2
                echo "$sys $rep $epoch $bytes" >> "$work/short.txt"
            fi
            hit=-
            if [ "$sys" = coorfs ] || [ "$sys" = hint ] || [ "$sys" = memory ]; then
                hit=$(coorfs_stat "$mnt" stats | python3 -c "import json,sys; print(json.load(sys.stdin)['epochs'][$epoch - 1]['hit_rate'])")
            fi
            echo "$sys $rep $epoch $secs 0 $hit" | tee -a "$samples" >&2
        done
        note="  $sys rep $rep: peak $(($(cat "$CG_MEM/$cg/memory.max_usage_in_bytes") >> 20)) MiB"
        if [ "$sys" = raw ]; then
            :
        elif [ "$sys" = coorfs ] || [ "$sys" = hint ] || [ "$sys" = memory ]; then
            note="$note; cache $(($(coorfs_stat "$mnt" cache_capacity) >> 20)) MiB, disk $(($(coorfs_stat "$mnt" disk_cached_bytes) >> 20)) MiB, $(coorfs_stat "$mnt" source_requests) requests, $(coorfs_stat "$mnt" source_retried) retried"
            "$coorfs" umount "$mnt"
        else
            if [ "$sys" = rclone ]; then note="$note; its disk cache $(du -sm "$work/rclone-cache" | cut -f1) MiB"; fi
            unmount_any
        fi
        echo "$note" >&2
        cg_kill "$cg"
        cg_destroy "$cg"
    done
done

echo
echo "scripts/bench-s3.sh (REPS=$REPS) on $(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD): $FILES files," \
    "$((dataset_bytes >> 20)) MiB in $url ($store_name, $LATENCY per request, answers paced at $PACE/s (0: unpaced));" \
    "a $((POD >> 20)) MiB memory cgroup for each system, $((DISK >> 20)) MiB of local disk for rclone's and coorfs's caches;" \
    "$PROCS reader processes"
echo
if [ -s "$work/short.txt" ]; then
    echo "Epochs that did not read the dataset's $dataset_bytes bytes (system, rep, epoch, bytes):"
    cat "$work/short.txt"
else
    echo "Every epoch of every system read the dataset's $dataset_bytes bytes."
fi
echo
python3 - "$samples" <<'PY'
import collections, statistics, sys
times = collections.defaultdict(lambda: collections.defaultdict(list))
hits = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    s, rep, ep, secs, _, hit = line.split()
    times[s][int(ep)].append(float(secs))
    if hit != "-":
        hits[s][int(ep)].append(float(hit))
systems = list(times)
epochs = sorted({e for s in times for e in times[s]})
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("| system | " + " | ".join(f"epoch {e}" for e in epochs) + " |")
print("|---|" + "---|" * len(epochs))
for s in systems:
    cells = []
    for e in epochs:
        cell = f"{med(times[s][e]):.1f} s"
        if hits[s][e]:
            cell += f" (hit {med(hits[s][e]):.2f})"
        cells.append(cell)
    print(f"| {s} | " + " | ".join(cells) + " |")
others = [s for s in systems if s in ("boto3", "s3torch", "s3fs", "rclone")]
if others:
    print()
    print("Speed-up over the best of " + ", ".join(others) + " in each epoch (its median / ours):")
    print()
    print("| system | " + " | ".join(f"epoch {e}" for e in epochs) + " |")
    print("|---|" + "---|" * len(epochs))
    for s in systems:
        if s in others:
            continue
        cells = []
        for e in epochs:
            best = min(med(times[o][e]) for o in others)
            cells.append(f"{best / med(times[s][e]):.2f}x")
        print(f"| {s} | " + " | ".join(cells) + " |")
PY
