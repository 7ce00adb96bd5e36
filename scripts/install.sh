#!/usr/bin/env bash
# Installs coorfs from this checkout, as the .deb does (scripts/build-deb.sh packages what this
# installs): the binary, the mount(8) helper link, the man page, shell completions and the
# systemd examples.
#
#   scripts/install.sh                  # build (release) and install under /usr, as root
#   scripts/install.sh --destdir DIR    # install into DIR instead of / (a package's tree)
#   COORFS_BIN=path scripts/install.sh  # install that binary, build nothing
#
# Installed:
#   /usr/bin/coorfs
#   /sbin/mount.fuse.coorfs -> /usr/bin/coorfs      mount -t fuse.coorfs, /etc/fstab, .mount units
#   /usr/share/man/man1/coorfs.1.gz
#   /usr/share/bash-completion/completions/coorfs, /usr/share/zsh/vendor-completions/_coorfs,
#   /usr/share/fish/vendor_completions.d/coorfs.fish
#   /usr/share/doc/coorfs/ (README.md, USAGE.md, examples/: a mount unit and a service)
#
# Upgrading a machine with live mounts: install the new binary, then `coorfs restart MOUNTPOINT`
# for each (the .deb does it): every mount moves to the new daemon while its jobs read.
set -euo pipefail
cd "$(dirname "$0")/.."

destdir=""
prefix=/usr
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --destdir) [ $# -ge 2 ] || { echo "install.sh: --destdir needs a directory" >&2; exit 2; }
                   destdir=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$destdir" ] && [ "$(id -u)" != 0 ]; then
    echo "install.sh: installing under / needs root (or pass --destdir DIR)" >&2
    exit 2
fi

bin=${COORFS_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --locked --quiet
    bin=target/release/coorfs
fi
[ -x "$bin" ] || { echo "install.sh: $bin is not an executable" >&2; exit 2; }

root="$destdir"
install -D -m 0755 "$bin" "$root$prefix/bin/coorfs"
install -d "$root/sbin"
ln -sfn "$prefix/bin/coorfs" "$root/sbin/mount.fuse.coorfs"
install -d "$root$prefix/share/man/man1"
gzip -9n < man/coorfs.1 > "$root$prefix/share/man/man1/coorfs.1.gz"
chmod 0644 "$root$prefix/share/man/man1/coorfs.1.gz"
completions() {  # SHELL DEST
    install -d "$(dirname "$2")"
    "$bin" completions "$1" > "$2"
    chmod 0644 "$2"
}
completions bash "$root$prefix/share/bash-completion/completions/coorfs"
completions zsh "$root$prefix/share/zsh/vendor-completions/_coorfs"
completions fish "$root$prefix/share/fish/vendor_completions.d/coorfs.fish"
doc="$root$prefix/share/doc/coorfs"
install -D -m 0644 README.md "$doc/README.md"
install -D -m 0644 docs/USAGE.md "$doc/USAGE.md"
install -D -m 0644 docs/systemd/mnt-train.mount "$doc/examples/mnt-train.mount"
install -D -m 0644 docs/systemd/coorfs-train.service "$doc/examples/coorfs-train.service"
echo "installed coorfs $("$bin" --version | awk '{print $2}') under ${destdir:-/}"
