//! The checks before a mount: the configuration, the source, the mount point, the FUSE
//! device, and the memory the cache and staging area may take (the budget, from the memory
//! cgroup or the host). Each failure is a [`MountError`], one line for the user; nothing is
//! mounted or written before they pass.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use tracing::warn;

use super::MountError;
use crate::config::MountConfig;
use crate::mountinfo;
use crate::units::format_size;

/// Held by the mount that is being set up at a mount point, from before its checks until
/// the kernel has the mount (see [`lock_mountpoint`]).
#[derive(Debug)]
pub struct SetupLock {
    /// The locked mount point directory; None where the filesystem cannot lock.
    _dir: Option<OwnedFd>,
}

/// Checks the configuration, the source and the mount point, and makes both paths absolute
/// and canonical in `config`. The returned lock keeps any other `coorfs mount` from setting
/// up at the same mount point until it is dropped.
pub fn preflight(config: &mut MountConfig) -> Result<SetupLock, MountError> {
    if config.cache_size_given
        && config.cache.capacity == 0
        && config.cache.policy.caches()
        && config.disk.is_none()
    {
        return Err(MountError::CacheSizeZero);
    }
    crate::fs::told_by().map_err(MountError::BadEnv)?;
    let object = crate::source::object::ObjectUrl::is_url(&config.source);
    if let (Some(m), false) = (&config.manifest, object) {
        return Err(MountError::BadUrl(format!(
            "{}: --manifest {} is for an object store's source (s3://, gs://, az://)",
            config.source.display(),
            m.display()
        )));
    }
    let source = if object {
        // An object store: the URL is checked here, the store when the mount lists it.
        crate::source::object::ObjectUrl::parse(&config.source).map_err(MountError::BadUrl)?;
        config.source.clone()
    } else {
        let absolute = std::path::absolute(&config.source)
            .map_err(|e| MountError::SourceUnreadable(config.source.clone(), e))?;
        checked_source(absolute)?
    };
    let mountpoint = std::path::absolute(&config.mountpoint)
        .map_err(|e| MountError::MountpointUnusable(config.mountpoint.clone(), e))?;
    let mountpoint = checked_mountpoint(mountpoint)?;
    if !object && mountpoint.starts_with(&source) {
        return Err(MountError::MountpointInsideSource {
            mountpoint,
            dataset: source,
        });
    }
    if !object && source.starts_with(&mountpoint) {
        return Err(MountError::SourceInsideMountpoint {
            mountpoint,
            dataset: source,
        });
    }
    if let Some(disk) = &mut config.disk {
        if !config.cache.policy.caches() {
            return Err(MountError::DiskWithoutPolicy);
        }
        check_disk_dir(disk, &source, &mountpoint)?;
    }
    let lock = lock_mountpoint(&mountpoint)?;
    if !config.allow_non_empty {
        let mut entries = std::fs::read_dir(&mountpoint)
            .map_err(|e| MountError::MountpointUnusable(mountpoint.clone(), e))?;
        if entries.next().is_some() {
            return Err(MountError::MountpointNotEmpty(mountpoint));
        }
    }
    if let Some(total) = crate::config::meminfo("MemTotal:")
        && config.cache_size_given
        && config.cache.capacity > total
    {
        return Err(MountError::CacheTooLarge {
            size: format_size(config.cache.capacity),
            total: format_size(total),
        });
    }
    decide_budget(config)?;
    check_fuse_device()?;
    config.source = source;
    config.mountpoint = mountpoint;
    Ok(lock)
}

/// The checks of [`preflight`] that a daemon started by a keeper makes again: the source and
/// the budget. The mount point is the keeper's live mount, which nothing may touch before
/// this daemon serves it (a lookup there would wait for this very daemon): its path is made
/// absolute, not resolved.
pub(super) fn preflight_handed(config: &mut MountConfig) -> Result<(), MountError> {
    crate::fs::told_by().map_err(MountError::BadEnv)?;
    if !crate::source::object::ObjectUrl::is_url(&config.source) {
        let absolute = std::path::absolute(&config.source)
            .map_err(|e| MountError::SourceUnreadable(config.source.clone(), e))?;
        config.source = checked_source(absolute)?;
    }
    config.mountpoint = std::path::absolute(&config.mountpoint)
        .map_err(|e| MountError::MountpointUnusable(config.mountpoint.clone(), e))?;
    if let Some(disk) = &mut config.disk {
        disk.dir = resolve_partly(&disk.dir)
            .map_err(|e| crate::tier::disk::DiskError::Io(disk.dir.clone(), e))?;
    }
    match decide_budget(config) {
        // A successor replaces a daemon the OOM killer may just have killed, in a pod whose
        // memory others now hold: a fixed cache that does not fit now would be refused, and
        // the mount with it. It starts with the elastic budget, which takes what is free
        // and grows as memory comes back.
        Err(MountError::Memory(refusal)) if config.cache_size_given => {
            warn!("{refusal}; this daemon's cache follows the free memory instead");
            config.cache_size_given = false;
            decide_budget(config)
        }
        decided => decided,
    }
}

/// The source directory `source` (absolute), canonical: a readable directory that is no
/// coorfs mount nor inside one.
fn checked_source(source: PathBuf) -> Result<PathBuf, MountError> {
    let source = match std::fs::canonicalize(&source) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(MountError::SourceMissing(source));
        }
        Err(e) => return Err(MountError::SourceUnreadable(source, e)),
    };
    if !source.is_dir() {
        return Err(MountError::SourceNotDir(source));
    }
    check_source_not_coorfs(&source)?;
    if let Err(e) = std::fs::read_dir(&source) {
        return Err(MountError::SourceUnreadable(source, e));
    }
    Ok(source)
}

/// The mount point `mountpoint` (absolute), canonical: a directory, neither a coorfs mount
/// already nor a dead FUSE mount.
fn checked_mountpoint(mountpoint: PathBuf) -> Result<PathBuf, MountError> {
    if mountinfo::is_coorfs_mount(&mountpoint) {
        return Err(MountError::AlreadyMounted(mountpoint));
    }
    let mountpoint = match std::fs::canonicalize(&mountpoint) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(MountError::MountpointMissing(mountpoint));
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(MountError::DeadMount(mountpoint));
        }
        Err(e) => return Err(MountError::MountpointUnusable(mountpoint, e)),
    };
    if mountinfo::is_coorfs_mount(&mountpoint) {
        return Err(MountError::AlreadyMounted(mountpoint));
    }
    if !mountpoint.is_dir() {
        return Err(MountError::MountpointNotDir(mountpoint));
    }
    Ok(mountpoint)
}

/// Resolves the disk tier's directory in `disk` and checks it: outside the source and the
/// mount point, and used by no other daemon.
fn check_disk_dir(
    disk: &mut crate::tier::disk::DiskConfig,
    source: &Path,
    mountpoint: &Path,
) -> Result<(), MountError> {
    disk.dir = resolve_partly(&disk.dir)
        .map_err(|e| crate::tier::disk::DiskError::Io(disk.dir.clone(), e))?;
    if disk.dir.starts_with(source) || disk.dir.starts_with(mountpoint) {
        return Err(MountError::DiskInside(disk.dir.clone()));
    }
    // Refused here, in one line, rather than by the daemon once it has forked; the daemon
    // takes the lock again.
    drop(crate::tier::disk::take(&disk.dir)?);
    Ok(())
}

/// `path`, absolute, with every part that exists resolved (symlinks, `..`): where a directory
/// that may not exist yet would be.
fn resolve_partly(path: &Path) -> io::Result<PathBuf> {
    let path = std::path::absolute(path)?;
    let mut existing = path.as_path();
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(real) => {
                return Ok(rest.iter().rev().fold(real, |p, part| p.join(part)));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match (existing.parent(), existing.file_name()) {
                    (Some(parent), Some(name)) => {
                        rest.push(name.to_owned());
                        existing = parent;
                    }
                    _ => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sets the cache budget from the memory the daemon may use: without `--cache-size` an
/// elastic one (`elastic.rs`), with a staging area sized to the memory cgroup unless
/// `--prefetch-memory` says; a given `--cache-size` (with the staging area) that cannot fit
/// the cgroup is refused (`budget.rs`).
fn decide_budget(config: &mut MountConfig) -> Result<(), MountError> {
    let view = crate::budget::MemoryView::probe();
    if !config.prefetch_memory_given {
        config.prefetch.memory =
            crate::elastic::default_staging(view.cgroup.as_ref().map(|cg| cg.limit));
    }
    if !config.cache.policy.caches() {
        config.cache_size_why = "--policy none caches nothing".into();
        return Ok(());
    }
    let staging = config.prefetch.staging_bytes();
    if config.cache_size_given {
        let decision = crate::budget::check_given(&view, config.cache.capacity, staging)?;
        config.cache.capacity = decision.cache;
        config.cache_size_why = decision.why;
    } else {
        let watched = crate::elastic::Watched::probe();
        let start = crate::elastic::start(&watched, staging).ok_or_else(|| {
            MountError::Mount(
                config.mountpoint.clone(),
                "cannot read how much memory is free (/proc/meminfo)".into(),
            )
        })?;
        config.cache.capacity = start.capacity;
        config.cache.ceiling = Some(start.rules.ceiling);
        config.elastic = Some(start.rules);
        config.cache_size_why = start.why;
    }
    // What the node table may grow to before cache, staging and node table together pass
    // what the machine or the cgroup leaves (the scan warns then). An elastic cache gives way
    // to it as to any other memory: only a fixed one stands in its way.
    let room = match &view.cgroup {
        Some(cgroup) => Some(cgroup.free()),
        None => view.mem_available,
    };
    let fixed = match config.elastic {
        Some(_) => 0,
        None => config.cache.capacity,
    };
    config.metadata_room = room.map(|r| r.saturating_sub(fixed + staging + DAEMON_ALLOWANCE));
    Ok(())
}

/// Memory the daemon needs beside cache, staging and node table (threads, buffers in
/// flight): the allowance the budget's default leaves it.
const DAEMON_ALLOWANCE: u64 = 64 << 20;

/// Refuses a source that is a caching coorfs mount or lies inside one: a second cache in
/// front of the first would hold the same files twice, and the first mount would count the
/// second's reads and prefetches as a job of its own. A `--policy none` mount caches nothing
/// and passes reads through: the tests and benchmarks mount coorfs over one with
/// `--read-delay` to emulate network storage (and count its bytes), so it is accepted. The
/// filesystem holding the source is found by its device number (for FUSE the kernel's,
/// whatever the daemon answers), so a symlink to the mount or a bind mount of it is
/// recognised too.
fn check_source_not_coorfs(source: &Path) -> Result<(), MountError> {
    let passthrough = |mnt: &Path| {
        crate::stats::view::fetch(mnt)
            .ok()
            .is_some_and(|doc| doc.get("policy").and_then(|p| p.as_str()) == Some("none"))
    };
    match mountinfo::containing_mount(source) {
        Some(m) if m.fstype == mountinfo::FS_TYPE && !passthrough(&m.mountpoint) => {
            if m.mountpoint == source {
                Err(MountError::SourceIsCoorfs(source.to_path_buf()))
            } else {
                Err(MountError::SourceInsideCoorfs {
                    dataset: source.to_path_buf(),
                    mount: m.mountpoint,
                })
            }
        }
        _ => Ok(()),
    }
}

/// Makes concurrent `coorfs mount`s at one mount point agree on a single winner. The checks
/// above ("not a coorfs mount yet") and the mount itself are separate steps, so two commands
/// started together would both pass the checks and stack two mounts. Each takes an exclusive
/// `flock` on the mount point directory, without waiting: the loser is told that a mount is
/// being set up there. The winner holds it until the kernel has its mount
/// ([`serve`] drops it then): from that moment the mount table refuses newcomers, and a
/// lock held longer would refuse a new mount while an unmounted daemon is still exiting (or
/// lives on behind a lazy unmount). Once it holds the lock it checks the mount table again:
/// a mount that completed after the check above, but before this process opened the
/// directory, means the descriptor is the new mount's root, which locks fine on its own.
/// A filesystem that cannot lock (`ENOLCK`, as some network filesystems answer) gets no
/// guard rather than a refusal.
fn lock_mountpoint(mountpoint: &Path) -> Result<SetupLock, MountError> {
    use std::os::unix::fs::OpenOptionsExt;
    let unusable = |e| MountError::MountpointUnusable(mountpoint.to_path_buf(), e);
    // std opens with O_CLOEXEC: the lock does not leak into fusermount3.
    let dir: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(mountpoint)
        .map_err(unusable)?
        .into();
    // SAFETY: flock on a descriptor we own; it touches no memory.
    let lock = if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        SetupLock { _dir: Some(dir) }
    } else {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => {
                return Err(MountError::MountInProgress(mountpoint.to_path_buf()));
            }
            Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => {
                SetupLock { _dir: None }
            }
            _ => return Err(unusable(e)),
        }
    };
    if mountinfo::is_coorfs_mount(mountpoint) {
        return Err(MountError::AlreadyMounted(mountpoint.to_path_buf()));
    }
    Ok(lock)
}

fn check_fuse_device() -> Result<(), MountError> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(MountError::NoFuseDevice),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(MountError::FuseDenied),
        Err(e) => Err(MountError::FuseUnusable(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_plain_file_source_or_mount_point_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(
            matches!(checked_source(gone.clone()), Err(MountError::SourceMissing(p)) if p == gone)
        );
        assert!(
            matches!(checked_source(file.clone()), Err(MountError::SourceNotDir(p)) if p == file)
        );
        assert!(
            matches!(checked_mountpoint(gone.clone()), Err(MountError::MountpointMissing(p)) if p == gone)
        );
        assert!(
            matches!(checked_mountpoint(file.clone()), Err(MountError::MountpointNotDir(p)) if p == file)
        );
        // Good ones come back canonical: no `..`, no symlink.
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::os::unix::fs::symlink(&data, dir.path().join("link")).unwrap();
        let real = std::fs::canonicalize(&data).unwrap();
        assert_eq!(checked_source(dir.path().join("link")).unwrap(), real);
        assert_eq!(
            checked_mountpoint(data.join("..").join("data")).unwrap(),
            real
        );
    }

    #[test]
    fn a_directory_that_does_not_exist_yet_resolves_under_its_real_parent() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(real.join("a")).unwrap();
        std::os::unix::fs::symlink(real.join("a"), real.join("to-a")).unwrap();
        assert_eq!(
            resolve_partly(&real.join("to-a/b/c")).unwrap(),
            real.join("a/b/c")
        );
        assert_eq!(
            resolve_partly(&real.join("a/../x")).unwrap(),
            real.join("x")
        );
    }

    #[test]
    fn a_disk_cache_inside_the_source_or_the_mount_point_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        let (src, mnt) = (real.join("src"), real.join("mnt"));
        for inside in [src.join("cache"), mnt.join("deep/cache")] {
            let mut disk = crate::tier::disk::DiskConfig {
                dir: inside.clone(),
                size: 1 << 20,
            };
            let refused = check_disk_dir(&mut disk, &src, &mnt);
            assert!(matches!(refused, Err(MountError::DiskInside(p)) if p == inside));
        }
    }

    #[test]
    fn with_policy_none_no_cache_budget_is_decided() {
        let mut config = MountConfig::new("/src".into(), "/mnt".into());
        config.cache.policy = crate::cache::PolicyKind::None;
        decide_budget(&mut config).unwrap();
        assert_eq!(config.cache_size_why, "--policy none caches nothing");
        assert!(config.elastic.is_none());
    }
}
