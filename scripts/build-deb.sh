#!/usr/bin/env bash
# Builds target/coorfs_VERSION_ARCH.deb: what scripts/install.sh installs, as a Debian package
# (dpkg-deb; no other tool). Installing or upgrading it hands every live coorfs mount to a
# daemon of the new version while its jobs read (`coorfs restart`, in its postinst).
#
#   scripts/build-deb.sh                  # build (release) and package
#   COORFS_BIN=path scripts/build-deb.sh  # package that binary
#   sudo apt install ./target/coorfs_*.deb
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"
scripts/install.sh --destdir "$stage" > /dev/null
# Line tables are for the developers' backtraces; the package ships without them (90 -> 16 MB).
if command -v strip > /dev/null; then
    strip --strip-debug "$stage/usr/bin/coorfs"
fi
install -d "$stage/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: coorfs
Version: $version
Architecture: $arch
Maintainer: coorfs maintainers <maintainers@coorfs.invalid>
Installed-Size: $size
Depends: libc6, fuse3
Recommends: attr
Section: utils
Priority: optional
Description: training-aware caching FUSE filesystem for deep-learning datasets
 coorfs mounts a dataset directory or S3 prefix read-only and serves unchanged
 PyTorch and TensorFlow jobs from a cache that keeps what it admitted (MinIO),
 with epoch-aware prefetch, shared caches across jobs and servers, and
 statistics that show where training waits for its data.
CONTROL
cat > "$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
# Live mounts move to the new version's daemon while their jobs read (a mount without a
# keeper, or whose handover fails, keeps its daemon: unmount and mount it again).
set -e
if [ "$1" = configure ] && [ -r /proc/self/mountinfo ]; then
    awk '$0 ~ / - fuse\.coorfs / {print $5}' /proc/self/mountinfo | while read -r m; do
        m=$(printf '%b' "$m")
        /usr/bin/coorfs restart "$m" || echo "coorfs: $m keeps its old daemon" >&2
    done
fi
exit 0
POSTINST
chmod 0755 "$stage/DEBIAN/postinst"
out="target/coorfs_${version}_${arch}.deb"
mkdir -p target
dpkg-deb --root-owner-group --build "$stage" "$out" > /dev/null
echo "$out"
