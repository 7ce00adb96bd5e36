//! Builds the eBPF program that tells the daemon of the opens the kernel makes itself
//! (src/fs/told/told.bpf.c) with clang, into OUT_DIR/told.bpf.o. Without clang (or libbpf's
//! headers, Debian's libbpf-dev) the object is left empty and the daemon is told of opens by
//! fanotify instead; the build says so. `CLANG` names another clang.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/fs/told/told.bpf.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("told.bpf.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // <linux/types.h> wants <asm/types.h>, which Debian keeps under the host's multiarch folder.
    let multiarch = Command::new("cc")
        .arg("-print-multiarch")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let mut cmd = Command::new(&clang);
    cmd.args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"]);
    if let Some(m) = multiarch {
        cmd.arg(format!("-I/usr/include/{m}"));
    }
    cmd.arg("-c").arg(SOURCE).arg("-o").arg(&out);
    let why = match cmd.output() {
        Ok(o) if o.status.success() => return,
        Ok(o) => String::from_utf8_lossy(&o.stderr)
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or("failed")
            .to_string(),
        Err(e) => format!("{clang}: {e}"),
    };
    std::fs::write(&out, []).expect("OUT_DIR is writable");
    println!(
        "cargo:warning=built without the eBPF program for told opens ({why}); \
         install clang and libbpf-dev for it. Opens are told by fanotify."
    );
}
