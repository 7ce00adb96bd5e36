//! What `/proc/self/mountinfo` says of a path: is it a mount point, and of which type; and
//! which mount holds it.

use std::path::{Path, PathBuf};

/// The filesystem type the kernel reports for a coorfs mount (`fuse.` + the subtype).
pub const FS_TYPE: &str = "fuse.coorfs";

/// One line of mountinfo: the filesystem's device number, the mount point and the type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// `st_dev` of every file of the mount, as (major, minor).
    pub dev: (u32, u32),
    /// The directory of the filesystem that is mounted (`/` unless a subtree is: a bind
    /// mount, or a cgroup hierarchy seen from a container).
    pub root: PathBuf,
    pub mountpoint: PathBuf,
    pub fstype: String,
    /// The filesystem's own options (the last field; for cgroup v1, its controllers).
    pub super_options: String,
}

/// Parses mountinfo text (`man 5 proc`): field 3 is major:minor, field 4 the root, field 5
/// the mount point, the field after `-` the type and the one after the source the super
/// options. Octal escapes (`\040` for a space) are decoded.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let (major, minor) = fields.get(2)?.split_once(':')?;
            let root = fields.get(3)?;
            let mountpoint = fields.get(4)?;
            let dash = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(dash + 1)?;
            Some(MountEntry {
                dev: (major.parse().ok()?, minor.parse().ok()?),
                root: PathBuf::from(unescape(root)),
                mountpoint: PathBuf::from(unescape(mountpoint)),
                fstype: fstype.to_string(),
                super_options: fields.get(dash + 3).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

fn unescape(s: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b));
        if bytes[i] == b'\\' && octal {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// The type of the mount whose mount point is exactly `path`, if any (the last, topmost one).
pub fn mount_type(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse(&text)
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == path)
        .map(|m| m.fstype)
}

/// True if `path` is the mount point of a coorfs mount.
pub fn is_coorfs_mount(path: &Path) -> bool {
    mount_type(path).as_deref() == Some(FS_TYPE)
}

/// The mount that holds `path` (which must exist): the entry with the device number of
/// `path`; of several (bind mounts of one filesystem), the topmost whose mount point is a
/// prefix of `path`, else the topmost. None when no entry has that device (btrfs
/// subvolumes, for one, give their files other device numbers than the mount table's).
pub fn containing_mount(path: &Path) -> Option<MountEntry> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let dev = (libc::major(dev), libc::minor(dev));
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let same: Vec<MountEntry> = parse(&text).into_iter().filter(|m| m.dev == dev).collect();
    let under = same.iter().rev().find(|m| path.starts_with(&m.mountpoint));
    under.or(same.last()).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_types_and_escaped_mount_points() {
        let text = "36 35 98:0 /mnt1 /mnt/my\\040data rw,noatime master:1 - fuse.coorfs /data rw\n\
                    37 35 98:0 / /proc rw shared:2 - proc proc rw\n";
        let entries = parse(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].dev, (98, 0));
        assert_eq!(entries[0].root, PathBuf::from("/mnt1"));
        assert_eq!(entries[0].mountpoint, PathBuf::from("/mnt/my data"));
        assert_eq!(entries[0].fstype, "fuse.coorfs");
        assert_eq!(entries[0].super_options, "rw");
        assert_eq!(entries[1].fstype, "proc");
        assert_eq!(entries[1].root, PathBuf::from("/"));
    }

    #[test]
    fn the_containing_mount_is_found_by_device() {
        let proc_entry = containing_mount(Path::new("/proc/self/status")).unwrap();
        assert_eq!(proc_entry.fstype, "proc");
        assert_eq!(proc_entry.mountpoint, PathBuf::from("/proc"));
        assert!(containing_mount(Path::new("/no/such/path")).is_none());
    }
}
