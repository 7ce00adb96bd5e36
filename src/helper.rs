//! coorfs as a mount helper: `mount -t fuse.coorfs SOURCE MOUNTPOINT -o OPTIONS` and
//! `/etc/fstab` lines of type `fuse.coorfs`.
//!
//! mount(8) runs `/sbin/mount.fuse.coorfs SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS]` (a link to
//! this binary) if there is one; otherwise `mount.fuse3` runs `coorfs SOURCE MOUNTPOINT -o
//! OPTIONS`. Either command line becomes `coorfs mount [flags] SOURCE MOUNTPOINT`: each option
//! `name` or `name=value` is the mount option `--name` (underscores for dashes, as fstab
//! writes them: `cache_size=8G` is `--cache-size 8G`), and a value with commas is quoted
//! (`peers="a:7070,b:7070"`). The generic options of mount(8), fstab and systemd (`defaults`,
//! `ro`, `rw`, `nofail`, `_netdev`, `noauto`, `nosuid`, `x-systemd.*`, ...) are for mount(8)
//! itself, not the filesystem, and are passed over; the mount is read-only whatever they say.
//! Anything else is refused with one line. `-f` (fake) checks the options and mounts nothing.

use std::ffi::OsString;
use std::path::Path;

use clap::CommandFactory;

/// What a helper's command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Helper {
    /// `coorfs mount ...` with these arguments (the program's name first).
    Mount(Vec<OsString>),
    /// `-f`: nothing to do once the options check.
    Fake,
}

/// Why a helper's command line cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HelperError {
    #[error("mount option \"{0}\" is not one of coorfs's (see coorfs mount --help)")]
    Unknown(String),
    #[error("mount option \"{0}\" takes a value ({0}=...)")]
    NeedsValue(String),
    #[error("mount option \"{0}\" takes no value")]
    NoValue(String),
    #[error(
        "mount option \"{0}\": a mount helper must return, so the daemon runs in the background"
    )]
    Foreground(String),
    #[error("mount -t {0}: coorfs mounts type fuse.coorfs")]
    Type(String),
    #[error("mount helper: {0}")]
    Usage(String),
}

/// Generic options: mount(8)'s, fstab's and systemd's own, not the filesystem's.
const GENERIC: &[&str] = &[
    "defaults",
    "ro",
    "rw",
    "auto",
    "noauto",
    "nofail",
    "_netdev",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "diratime",
    "nodiratime",
    "lazytime",
    "nolazytime",
    "sync",
    "async",
    "dirsync",
    "silent",
    "loud",
    "default_permissions",
];

/// Generic options that carry a value or a namespace of their own.
const GENERIC_PREFIXES: &[&str] = &["x-", "comment=", "fsname=", "subtype=", "helper="];

/// The subcommands, which a helper's first argument (a path) is not.
fn is_subcommand(arg: &str) -> bool {
    crate::cli::Cli::command()
        .get_subcommands()
        .any(|c| c.get_name() == arg)
        || arg == "help"
}

/// The helper's command line in `argv`, if that is what it is: the program is called
/// `mount.*`, or its first argument is no subcommand and no option (`coorfs SRC MNT ...`).
pub fn parse(argv: &[OsString]) -> Option<Result<Helper, HelperError>> {
    let program = argv.first()?;
    let name = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let first = argv.get(1).map(|a| a.to_string_lossy().into_owned());
    let helper = name.starts_with("mount.")
        || first
            .as_deref()
            .is_some_and(|f| !f.starts_with('-') && !is_subcommand(f) && argv.len() >= 3);
    helper.then(|| command_line(argv))
}

/// The `coorfs mount` command line of helper arguments `argv`.
fn command_line(argv: &[OsString]) -> Result<Helper, HelperError> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut args = argv[1..].iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        match text.as_ref() {
            "-o" => options.push(
                args.next()
                    .ok_or_else(|| HelperError::Usage("-o needs options".into()))?
                    .to_string_lossy()
                    .into_owned(),
            ),
            "-t" => {
                let kind = args
                    .next()
                    .ok_or_else(|| HelperError::Usage("-t needs a type".into()))?;
                let kind = kind.to_string_lossy();
                if kind != "fuse.coorfs" && kind != "coorfs" {
                    return Err(HelperError::Type(kind.into_owned()));
                }
            }
            // Fake, and mount(8)'s sloppy, no-mtab and verbose flags.
            "-f" => fake = true,
            "-s" | "-n" | "-v" => {}
            t if t.starts_with("-o") => options.push(t[2..].to_string()),
            t if t.starts_with('-') => {
                return Err(HelperError::Usage(format!("unknown flag {t}")));
            }
            _ => positional.push(arg.clone()),
        }
    }
    let [source, mountpoint] = <[OsString; 2]>::try_from(positional).map_err(|p| {
        HelperError::Usage(format!(
            "expected SOURCE MOUNTPOINT, got {} arguments",
            p.len()
        ))
    })?;
    let mut out: Vec<OsString> = vec!["coorfs".into(), "mount".into()];
    for option in options.iter().flat_map(|o| split(o)) {
        out.extend(flag(&option)?.into_iter().map(OsString::from));
    }
    out.extend([source, mountpoint]);
    Ok(if fake {
        Helper::Fake
    } else {
        Helper::Mount(out)
    })
}

/// The options of one `-o`, split at commas outside double quotes, the quotes removed.
fn split(options: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    for c in options.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(String::new()),
            c => out.last_mut().expect("one at least").push(c),
        }
    }
    out.retain(|o| !o.is_empty());
    out
}

/// The `coorfs mount` arguments of one mount option (none for a generic one).
fn flag(option: &str) -> Result<Vec<String>, HelperError> {
    if GENERIC.contains(&option) || GENERIC_PREFIXES.iter().any(|p| option.starts_with(p)) {
        return Ok(Vec::new());
    }
    let (name, value) = match option.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (option, None),
    };
    let long = match name {
        "nonempty" => "allow-non-empty".to_string(),
        n => n.replace('_', "-"),
    };
    let command = crate::cli::Cli::command();
    let mount = command
        .find_subcommand("mount")
        .expect("coorfs has a mount command");
    let arg = mount
        .get_arguments()
        .find(|a| a.get_long() == Some(long.as_str()) && !a.is_positional())
        .ok_or_else(|| HelperError::Unknown(name.to_string()))?;
    if arg.get_id() == "foreground" {
        return Err(HelperError::Foreground(name.to_string()));
    }
    let takes_value = arg.get_action().takes_values();
    match (takes_value, value) {
        (true, Some(v)) => Ok(vec![format!("--{long}"), v.to_string()]),
        (true, None) => Err(HelperError::NeedsValue(name.to_string())),
        (false, None) => Ok(vec![format!("--{long}")]),
        (false, Some(_)) => Err(HelperError::NoValue(name.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn mount_args(args: &[&str]) -> Vec<String> {
        match parse(&argv(args)) {
            Some(Ok(Helper::Mount(a))) => a
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn fstab_options_become_mount_flags_and_generic_ones_are_passed_over() {
        assert_eq!(
            mount_args(&[
                "/sbin/mount.fuse.coorfs",
                "/data",
                "/mnt/train",
                "-o",
                "rw,cache_size=8G,allow_other,_netdev,nofail,x-systemd.automount,policy=lru",
            ]),
            [
                "coorfs",
                "mount",
                "--cache-size",
                "8G",
                "--allow-other",
                "--policy",
                "lru",
                "/data",
                "/mnt/train"
            ]
        );
        // mount.fuse3's form: the program's own name, options last, quoted commas.
        assert_eq!(
            mount_args(&[
                "coorfs",
                "/data",
                "/mnt",
                "-o",
                "peers=\"a:1,b:2\",node_rank=1,nonempty",
                "-t",
                "fuse.coorfs"
            ]),
            [
                "coorfs",
                "mount",
                "--peers",
                "a:1,b:2",
                "--node-rank",
                "1",
                "--allow-non-empty",
                "/data",
                "/mnt"
            ]
        );
        assert_eq!(
            mount_args(&["mount.coorfs", "/d", "/m", "-s", "-n", "-odefaults"]),
            ["coorfs", "mount", "/d", "/m"]
        );
        assert_eq!(
            parse(&argv(&[
                "mount.fuse.coorfs",
                "/d",
                "/m",
                "-f",
                "-o",
                "cache_size=1G"
            ])),
            Some(Ok(Helper::Fake))
        );
    }

    #[test]
    fn subcommands_are_no_helper_and_bad_options_say_which() {
        assert_eq!(parse(&argv(&["coorfs", "mount", "/d", "/m"])), None);
        assert_eq!(parse(&argv(&["coorfs", "stats", "/m"])), None);
        assert_eq!(parse(&argv(&["coorfs", "--help"])), None);
        assert_eq!(parse(&argv(&["coorfs", "/d"])), None);
        let err = |args: &[&str]| match parse(&argv(args)) {
            Some(Err(e)) => e,
            other => panic!("{args:?}: {other:?}"),
        };
        let m = ["mount.fuse.coorfs", "/d", "/m", "-o"];
        assert_eq!(
            err(&[&m[..], &["bogus=1"]].concat()),
            HelperError::Unknown("bogus".into())
        );
        assert_eq!(
            err(&[&m[..], &["cache_size"]].concat()),
            HelperError::NeedsValue("cache_size".into())
        );
        assert_eq!(
            err(&[&m[..], &["allow_other=1"]].concat()),
            HelperError::NoValue("allow_other".into())
        );
        assert_eq!(
            err(&[&m[..], &["foreground"]].concat()),
            HelperError::Foreground("foreground".into())
        );
        assert_eq!(
            err(&["mount.coorfs", "/d", "/m", "-t", "ext4"]),
            HelperError::Type("ext4".into())
        );
        assert_eq!(
            err(&["mount.coorfs", "/d", "/m", "/x"]),
            HelperError::Usage("expected SOURCE MOUNTPOINT, got 3 arguments".into())
        );
    }
}
