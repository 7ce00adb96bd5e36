# What each step needs from Debian/Ubuntu, in one place (sourced, not run): scripts/demo.sh,
# scripts/test.sh and .ci/run ask it for their steps, so that the three never drift apart.
# The steps:
#   build  cargo build / cargo test's build (Rust itself is not a package: https://rustup.rs)
#   demo   scripts/demo.sh's run: a mount, the dataset, the tables
#   test   cargo test --release: the tests mount for real and start etcd and Prometheus
#   ci     .ci/run's check of the Python package in a fresh venv
#
# prereqs WHO STEP...: as root with apt-get, installs the packages missing for the STEPs;
# otherwise prints one line naming what is missing and the command that installs it, and
# exits 1 (the script that sourced this). Then makes sure of /dev/fuse (demo, test): as root,
# modprobe fuse if it is missing; otherwise the same one line and exit 1.
#
#   source scripts/prereqs.sh
#   prereqs demo.sh build demo
# shellcheck shell=bash

# The table. prereq STEPS CHECK PACKAGE: Debian's PACKAGE is needed by the comma-separated
# STEPS, and is there when CHECK is: a command on PATH, py:MODULE, a module python3 imports, or
# /PATH, a file.
prereqs_table() {
    prereq build     cc           gcc               # the linker rustc calls; ring's C (rustls)
    prereq build     protoc       protobuf-compiler # building etcd-client (gRPC)
    prereq build     clang        clang             # src/build.rs: the eBPF program that tells opens
    prereq build     /usr/include/bpf/bpf_helpers.h libbpf-dev # its headers
    prereq demo,test fusermount3  fuse3             # non-root mounts; tests/it/helper.rs's mount.fuse3
    prereq demo,test python3      python3           # the demo; tests/*.rs (standard library only)
    prereq test      mount        mount             # tests/it/helper.rs, tests/it/disk.rs: mount(8)
    prereq test      getfattr     attr              # the README's getfattr; no test or demo uses it
    prereq test      setfacl      acl               # tests/it/security.rs: ACLs of the source
    prereq test      unshare      util-linux        # tests/it/lifecycle.rs: a mount namespace
    prereq test      etcd         etcd-server       # tests/it/cluster_etcd.rs starts a real etcd
    prereq test      prometheus   prometheus        # tests/it/metrics.rs: a real scrape
    prereq test      openssl      openssl           # tests/it/cluster.rs: certificates for TLS
    prereq test,ci   py:ensurepip python3-venv      # tests/it/s3.rs's moto server; .ci/run's package check
    prereq test      npm          npm               # tests/it/stores.rs's Azure emulator (Azurite, from npm)
}

# prereq STEPS CHECK PACKAGE: one row of the table; adds CHECK to prereqs_missing and PACKAGE
# to prereqs_packages if one of STEPS is wanted (prereqs_steps) and CHECK fails.
prereq() {
    local step wanted=0
    for step in ${1//,/ }; do
        case " $prereqs_steps " in *" $step "*) wanted=1 ;; esac
    done
    [ "$wanted" = 1 ] || return 0
    case $2 in
        py:*) python3 -c "import ${2#py:}" 2>/dev/null && return 0 ;;
        /*) [ -e "$2" ] && return 0 ;;
        *) command -v "$2" >/dev/null && return 0 ;;
    esac
    prereqs_missing+=("${2#py:}")
    case " ${prereqs_packages[*]} " in *" $3 "*) ;; *) prereqs_packages+=("$3") ;; esac
}

# prereqs_check STEP...: sets prereqs_missing and prereqs_packages for the STEPs.
prereqs_check() {
    prereqs_steps="$*" prereqs_missing=() prereqs_packages=()
    prereqs_table
}

# prereqs_say WHO WHAT: the one line, on stderr, and exit 1.
prereqs_say() {
    echo "$1: needs $2" >&2
    exit 1
}

prereqs() {
    local who=$1 sudo=sudo
    shift
    [ "$(id -u)" = 0 ] && sudo=
    case " $* " in *" build "*)
        # Before installing anything: `sudo scripts/demo.sh` often loses ~/.cargo/bin from PATH.
        command -v cargo >/dev/null || prereqs_say "$who" \
            "Rust's cargo on PATH: https://rustup.rs (with sudo: sudo env PATH=\"\$PATH\" $0)"
        ;;
    esac
    prereqs_check "$@"
    if [ ${#prereqs_packages[@]} -gt 0 ]; then
        local missing="${prereqs_missing[*]}" packages="${prereqs_packages[*]}"
        missing=${missing// /, }
        if ! command -v apt-get >/dev/null; then
            prereqs_say "$who" "$missing (Debian/Ubuntu: apt-get install -y $packages)"
        elif [ -n "$sudo" ]; then
            prereqs_say "$who" "$missing: sudo apt-get install -y $packages"
        fi
        echo "== $who: installing $packages (apt-get), for $missing"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${prereqs_packages[@]}" >/dev/null
        prereqs_check "$@"
        [ ${#prereqs_packages[@]} = 0 ] || prereqs_say "$who" \
            "${prereqs_missing[*]}, still missing after apt-get install -y $packages"
    fi
    case " $* " in *" demo "* | *" test "*)
        if [ ! -e /dev/fuse ] && [ -z "$sudo" ] && command -v modprobe >/dev/null; then
            modprobe fuse || true
        fi
        [ -e /dev/fuse ] || prereqs_say "$who" \
            "/dev/fuse, the fuse kernel module: ${sudo:+sudo }modprobe fuse"
        ;;
    esac
}
