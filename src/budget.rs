//! How much memory the daemon may use, and the check of a fixed cache budget.
//!
//! A daemon that outgrows the memory it may use is killed, and the training job with it
//! (`ECONNABORTED`, then `ENOTCONN`). On a host, what it may use is what `/proc/meminfo` calls
//! `MemAvailable`. In a container it is what its memory cgroup allows, which `MemAvailable`
//! does not show: a Kubernetes pod limited to 1 GiB on a host with 22 GiB available saw a
//! budget of 11 GiB and was OOM-killed in its first epoch (issue 11).
//!
//! ```text
//! free = limit - (usage - reclaimable page cache)     of the limited memory cgroup
//! ```
//!
//! - *The cgroup* is the daemon's own memory cgroup or an ancestor of it with a limit (v2
//!   `memory.max`, or `memory.high` when lower; v1 `memory.limit_in_bytes`); of several, the
//!   one that leaves the least free. The daemon inherits the cgroup of `coorfs mount`.
//!   [`Chain`] finds them once; the elastic budget reads them every tick.
//! - *Usage* (v2 `memory.current`, v1 `memory.usage_in_bytes`) counts page cache, which the
//!   kernel reclaims before it kills anything; its file pages (v2 `memory.stat` `file`, v1
//!   `total_cache`) are subtracted, except shared memory (`shmem`: tmpfs, `/dev/shm`, which
//!   PyTorch's DataLoader uses for its batches, and the cache's own files that the kernel
//!   reads by passthrough), which cannot be reclaimed without swap.
//!
//! The default budget is elastic and follows `free` while the mount runs
//! ([`crate::elastic`]). A fixed one (`--cache-size SIZE`) is taken as given, but a cache and
//! staging area larger than everything the cgroup has left cannot work: `coorfs mount`
//! refuses them (exit 2) and says what would fit, instead of mounting a daemon that will be
//! killed once its cache fills ([`check_given`]).
//!
//! Reading and deciding are apart: [`MemoryView::read`] gets every file's contents through
//! a function (the real one reads `/proc` and `/sys/fs/cgroup`), so that the walk and the
//! parsers are tested on sample text of both cgroup versions.

use std::path::{Path, PathBuf};

use crate::units::format_size;

/// A v1 limit at or above this is "unlimited": the kernel stores no limit as the largest page
/// count, 9223372036854771712 bytes with 4 KiB pages (another number with larger pages).
const V1_UNLIMITED: u64 = 1 << 62;

/// A memory cgroup with a limit, as it was when read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMemory {
    /// Its path in the cgroup hierarchy, as `/proc/self/cgroup` names it (`/kubepods/...`).
    pub path: String,
    /// Bytes it may hold.
    pub limit: u64,
    /// Bytes it holds, page cache included.
    pub usage: u64,
    /// Of `usage`, page cache the kernel can reclaim (file pages that are not shared memory).
    pub reclaimable: u64,
}

impl CgroupMemory {
    /// Bytes in use that the kernel cannot simply reclaim.
    pub fn in_use(&self) -> u64 {
        self.usage.saturating_sub(self.reclaimable)
    }

    /// Bytes it can still take before the kernel has to kill something.
    pub fn free(&self) -> u64 {
        self.limit.saturating_sub(self.in_use())
    }
}

/// What the memory the daemon may use looks like now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryView {
    /// `MemAvailable` of `/proc/meminfo`, bytes.
    pub mem_available: Option<u64>,
    /// The limited memory cgroup (own or ancestor) that leaves the least free; None when no
    /// cgroup above the daemon has a limit, or the cgroup files cannot be read.
    pub cgroup: Option<CgroupMemory>,
}

/// How the budget was chosen, for the daemon's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The cache budget, bytes.
    pub cache: u64,
    /// Why, e.g. `--cache-size; memory cgroup /pod: limit 1.0 GiB, used 140 MiB, staging 64.0 MiB`.
    pub why: String,
}

/// A budget that cannot work. Each is one line for the user.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "--cache-size {cache} and --prefetch-memory {staging} do not fit the memory cgroup {cgroup} (limit {limit}, {in_use} in use): at most {fits} of cache fits beside that prefetch memory; leave --cache-size out (or pass auto) for a cache that grows and shrinks with what is free"
    )]
    CacheAndStagingDoNotFit {
        cache: String,
        staging: String,
        cgroup: String,
        limit: String,
        in_use: String,
        fits: String,
    },
    #[error(
        "--cache-size {cache} does not fit the memory cgroup {cgroup} (limit {limit}, {in_use} in use): at most {fits} fits; leave --cache-size out (or pass auto) for a cache that grows and shrinks with what is free"
    )]
    CacheDoesNotFit {
        cache: String,
        cgroup: String,
        limit: String,
        in_use: String,
        fits: String,
    },
}

impl MemoryView {
    /// The view of this process, from `/proc/self` and the cgroup filesystems.
    pub fn probe() -> Self {
        Self::read(&|path| std::fs::read_to_string(path).ok())
    }

    /// The view that the files returned by `read` describe: `/proc/meminfo`,
    /// `/proc/self/cgroup`, `/proc/self/mountinfo` and the files of the cgroups they lead to.
    pub fn read(read: &dyn Fn(&Path) -> Option<String>) -> Self {
        let mem_available =
            read(Path::new("/proc/meminfo")).and_then(|t| meminfo_field(&t, "MemAvailable:"));
        MemoryView {
            mem_available,
            cgroup: tightest_cgroup(read),
        }
    }
}

/// Which cgroup hierarchy accounts this process's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The daemon's memory cgroup: which hierarchy, and its path there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnCgroup {
    pub version: Version,
    pub path: PathBuf,
}

/// The OOM kills a cgroup's `memory.events` (v2) or `memory.oom_control` (v1) counts: its
/// `oom_kill` line.
pub fn parse_oom_kills(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// Parses `/proc/self/cgroup` (`hierarchy-ID:controllers:path` per line): the v1 hierarchy
/// with the `memory` controller if there is one (on a hybrid host the v2 line `0::/...` is
/// there too, without the controller), else the v2 line.
pub fn parse_proc_cgroup(text: &str) -> Option<OwnCgroup> {
    let mut v2 = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !path.starts_with('/') {
            continue;
        }
        if controllers.split(',').any(|c| c == "memory") {
            return Some(OwnCgroup {
                version: Version::V1,
                path: PathBuf::from(path),
            });
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some(OwnCgroup {
                version: Version::V2,
                path: PathBuf::from(path),
            });
        }
    }
    v2
}

/// Where a cgroup's files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupDir {
    /// The cgroup's directory, e.g. `/sys/fs/cgroup/memory/kubepods/pod1`.
    pub dir: PathBuf,
    /// The mount point of its hierarchy: the walk up to ancestors ends there.
    pub top: PathBuf,
    /// The cgroup that is mounted at `top` (`/` unless a container sees only its own).
    pub root: PathBuf,
}

/// Where `own`'s directory is: the cgroup mount of its version (v1: the one with the `memory`
/// controller) whose root holds its path, the one with the longest root if several do. A
/// container without its own cgroup namespace sees its cgroup mounted as the root (`/docker/
/// ID` on `/sys/fs/cgroup/memory`), so the path is taken relative to the root.
pub fn cgroup_dir(own: &OwnCgroup, mountinfo: &str) -> Option<CgroupDir> {
    let mounts = crate::mountinfo::parse(mountinfo);
    let mount = mounts
        .iter()
        .filter(|m| match own.version {
            Version::V1 => {
                m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == "memory")
            }
            Version::V2 => m.fstype == "cgroup2",
        })
        .filter(|m| own.path.starts_with(&m.root))
        .max_by_key(|m| m.root.components().count())?;
    let rel = own.path.strip_prefix(&mount.root).ok()?;
    Some(CgroupDir {
        dir: mount.mountpoint.join(rel),
        top: mount.mountpoint.clone(),
        root: mount.root.clone(),
    })
}

/// The daemon's memory cgroup and its ancestors up to the top of their mount: where a limit
/// may be. Found once; read as often as the elastic budget needs ([`Chain::tightest`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub version: Version,
    /// Each cgroup's directory and its path in the hierarchy, the daemon's own first.
    pub cgroups: Vec<(PathBuf, PathBuf)>,
}

impl Chain {
    /// The chain of this process, from the files `read` returns (`/proc/self/cgroup`,
    /// `/proc/self/mountinfo`).
    pub fn find(read: &dyn Fn(&Path) -> Option<String>) -> Option<Chain> {
        let own = parse_proc_cgroup(&read(Path::new("/proc/self/cgroup"))?)?;
        let mountinfo = read(Path::new("/proc/self/mountinfo"))?;
        let CgroupDir { dir, top, root } = cgroup_dir(&own, &mountinfo)?;
        let mut cgroups = Vec::new();
        let mut dir = dir.as_path();
        loop {
            let rel = dir.strip_prefix(&top).ok()?;
            cgroups.push((dir.to_path_buf(), root.join(rel)));
            if dir == top {
                break;
            }
            dir = dir.parent()?;
        }
        Some(Chain {
            version: own.version,
            cgroups,
        })
    }

    /// The limited cgroup of the chain that leaves the least free now, and its directory.
    pub fn tightest(
        &self,
        read: &dyn Fn(&Path) -> Option<String>,
    ) -> Option<(CgroupMemory, &Path)> {
        let mut found: Option<(CgroupMemory, &Path)> = None;
        for (dir, path) in &self.cgroups {
            if let Some(cg) = read_cgroup(self.version, dir, path, read)
                && found.as_ref().is_none_or(|(f, _)| cg.free() < f.free())
            {
                found = Some((cg, dir));
            }
        }
        found
    }
}

/// Reads every cgroup from the daemon's own up to the top of its mount and returns the
/// limited one that leaves the least free.
fn tightest_cgroup(read: &dyn Fn(&Path) -> Option<String>) -> Option<CgroupMemory> {
    Chain::find(read)?.tightest(read).map(|(cg, _)| cg)
}

/// One cgroup's limit and usage, if it has a limit.
fn read_cgroup(
    version: Version,
    dir: &Path,
    path: &Path,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Option<CgroupMemory> {
    let file = |name: &str| read(&dir.join(name));
    let (limit, usage) = match version {
        Version::V1 => (
            parse_v1_limit(&file("memory.limit_in_bytes")?)?,
            parse_number(&file("memory.usage_in_bytes")?)?,
        ),
        Version::V2 => {
            let max = file("memory.max").and_then(|t| parse_v2_limit(&t));
            let high = file("memory.high").and_then(|t| parse_v2_limit(&t));
            let limit = match (max, high) {
                (Some(m), Some(h)) => m.min(h),
                (m, h) => m.or(h)?,
            };
            (limit, parse_number(&file("memory.current")?)?)
        }
    };
    let reclaimable = file("memory.stat")
        .map(|t| reclaimable_page_cache(version, &t))
        .unwrap_or(0);
    Some(CgroupMemory {
        path: path.display().to_string(),
        limit,
        usage,
        reclaimable,
    })
}

/// A number alone in a file (`memory.current`, `memory.usage_in_bytes`).
pub fn parse_number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// v2 `memory.max` or `memory.high`: bytes, or `max` for none (None).
pub fn parse_v2_limit(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => None,
        t => t.parse().ok(),
    }
}

/// v1 `memory.limit_in_bytes`: bytes, None for the huge number that means no limit.
pub fn parse_v1_limit(text: &str) -> Option<u64> {
    parse_number(text).filter(|&v| v < V1_UNLIMITED)
}

/// Page cache of a `memory.stat` that the kernel can reclaim: file pages minus shared memory
/// (v2 `file` - `shmem`; v1 `total_cache` - `total_shmem`, hierarchical like
/// `memory.usage_in_bytes`, else `cache` - `shmem`).
pub fn reclaimable_page_cache(version: Version, stat: &str) -> u64 {
    let field = |name: &str| {
        stat.lines().find_map(|l| {
            let (key, value) = l.split_once(' ')?;
            (key == name).then(|| value.trim().parse::<u64>().ok())?
        })
    };
    let (file, shmem) = match version {
        Version::V2 => (field("file"), field("shmem")),
        Version::V1 => match field("total_cache") {
            Some(cache) => (Some(cache), field("total_shmem")),
            None => (field("cache"), field("shmem")),
        },
    };
    file.unwrap_or(0).saturating_sub(shmem.unwrap_or(0))
}

/// A field of `/proc/meminfo` text (`MemAvailable:`), in bytes.
pub fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Checks a given budget: `cache` bytes of cache (0 with `--policy none`) and `staging` bytes
/// of staging (0 with prefetch off) must fit in what the cgroup has left. Returns the note
/// for the daemon's log.
pub fn check_given(view: &MemoryView, cache: u64, staging: u64) -> Result<Decision, Box<Refusal>> {
    let Some(cg) = &view.cgroup else {
        return Ok(Decision {
            cache,
            why: "--cache-size".into(),
        });
    };
    if cache.saturating_add(staging) > cg.free() {
        let (cgroup, limit, in_use) = (
            cg.path.clone(),
            format_size(cg.limit),
            format_size(cg.in_use()),
        );
        let fits = format_size(cg.free().saturating_sub(staging) >> 20 << 20);
        return Err(Box::new(if staging > 0 {
            Refusal::CacheAndStagingDoNotFit {
                cache: format_size(cache),
                staging: format_size(staging),
                cgroup,
                limit,
                in_use,
                fits,
            }
        } else {
            Refusal::CacheDoesNotFit {
                cache: format_size(cache),
                cgroup,
                limit,
                in_use,
                fits,
            }
        }));
    }
    Ok(Decision {
        cache,
        why: format!(
            "--cache-size; memory cgroup {}: limit {}, used {}, staging {}",
            cg.path,
            format_size(cg.limit),
            format_size(cg.in_use()),
            format_size(staging)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// A hybrid host like CI's: v1 controllers, the v2 hierarchy without them.
    const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/e131\n\
                                 1:cpu:/\n0::/\n";
    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    /// A v2-only host (systemd, Kubernetes with cgroup v2).
    const V2_CGROUP: &str = "0::/kubepods.slice/pod1/ctr\n";
    const V2_MOUNTINFO: &str =
        "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";

    fn fake(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        move |p: &Path| map.get(p).cloned()
    }

    fn cg(path: &str, limit: u64, usage: u64, reclaimable: u64) -> CgroupMemory {
        CgroupMemory {
            path: path.into(),
            limit,
            usage,
            reclaimable,
        }
    }

    #[test]
    fn parses_proc_self_cgroup_of_both_versions() {
        let own = |v, p: &str| {
            Some(OwnCgroup {
                version: v,
                path: PathBuf::from(p),
            })
        };
        assert_eq!(
            parse_proc_cgroup(HYBRID_CGROUP),
            own(Version::V1, "/process_api/e131")
        );
        assert_eq!(
            parse_proc_cgroup(V2_CGROUP),
            own(Version::V2, "/kubepods.slice/pod1/ctr")
        );
        // Controllers mounted together, and a named hierarchy that is not memory.
        assert_eq!(
            parse_proc_cgroup("5:name=memory:/x\n3:cpuset,memory:/docker/abc\n"),
            own(Version::V1, "/docker/abc")
        );
        assert_eq!(parse_proc_cgroup(""), None);
        assert_eq!(parse_proc_cgroup("garbage\n2:cpu:/\n"), None);
    }

    #[test]
    fn parses_limits_usage_and_page_cache() {
        assert_eq!(parse_v1_limit("9223372036854771712\n"), None);
        assert_eq!(parse_v1_limit("9223372036854710272\n"), None); // 64 KiB pages
        assert_eq!(parse_v1_limit("1073741824\n"), Some(GIB));
        assert_eq!(parse_v1_limit("junk"), None);
        assert_eq!(parse_v2_limit("max\n"), None);
        assert_eq!(parse_v2_limit("1073741824\n"), Some(GIB));
        assert_eq!(parse_number("123456\n"), Some(123456));

        let v1 = "cache 100\nrss 5\nshmem 10\ntotal_cache 3000\ntotal_rss 7\ntotal_shmem 1000\n";
        assert_eq!(reclaimable_page_cache(Version::V1, v1), 2000);
        // Without the hierarchical totals.
        assert_eq!(
            reclaimable_page_cache(Version::V1, "cache 100\nshmem 10\n"),
            90
        );
        let v2 = "anon 500\nfile 4096\nkernel 12\nshmem 1024\nfile_mapped 0\n";
        assert_eq!(reclaimable_page_cache(Version::V2, v2), 3072);
        assert_eq!(reclaimable_page_cache(Version::V2, ""), 0);
        assert_eq!(
            meminfo_field(
                "MemTotal: 100 kB\nMemAvailable:   2048 kB\n",
                "MemAvailable:"
            ),
            Some(2 * MIB)
        );
    }

    fn dir(dir: &str, top: &str, root: &str) -> CgroupDir {
        CgroupDir {
            dir: dir.into(),
            top: top.into(),
            root: root.into(),
        }
    }

    #[test]
    fn finds_the_cgroup_directory_through_the_mount_table() {
        let own = parse_proc_cgroup(HYBRID_CGROUP).unwrap();
        assert_eq!(
            cgroup_dir(&own, HYBRID_MOUNTINFO),
            Some(dir(
                "/sys/fs/cgroup/memory/process_api/e131",
                "/sys/fs/cgroup/memory",
                "/"
            ))
        );
        // v2 on a hybrid host is mounted below /sys/fs/cgroup.
        let v2 = OwnCgroup {
            version: Version::V2,
            path: PathBuf::from("/user.slice"),
        };
        assert_eq!(
            cgroup_dir(&v2, HYBRID_MOUNTINFO),
            Some(dir(
                "/sys/fs/cgroup/unified/user.slice",
                "/sys/fs/cgroup/unified",
                "/"
            ))
        );
        // A container without a cgroup namespace: its own cgroup is the mount's root.
        let docker = OwnCgroup {
            version: Version::V1,
            path: PathBuf::from("/docker/abc"),
        };
        let mounts = "40 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        assert_eq!(
            cgroup_dir(&docker, mounts),
            Some(dir(
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/memory",
                "/docker/abc"
            ))
        );
        // No memory controller mounted: nothing to read.
        let cpu_only = "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(cgroup_dir(&own, cpu_only), None);
    }

    #[test]
    fn reads_the_tightest_limited_cgroup_of_both_versions() {
        let meminfo = ("/proc/meminfo", "MemAvailable: 23068672 kB\n");
        let unlimited = "9223372036854771712\n";
        // (name, the files, the cgroup that should be found)
        type Case = (
            &'static str,
            Vec<(&'static str, &'static str)>,
            Option<CgroupMemory>,
        );
        let cases: Vec<Case> = vec![
            (
                "v1, own cgroup limited",
                vec![
                    meminfo,
                    ("/proc/self/cgroup", HYBRID_CGROUP),
                    ("/proc/self/mountinfo", HYBRID_MOUNTINFO),
                    (
                        "/sys/fs/cgroup/memory/process_api/e131/memory.limit_in_bytes",
                        "1073741824\n",
                    ),
                    (
                        "/sys/fs/cgroup/memory/process_api/e131/memory.usage_in_bytes",
                        "209715200\n",
                    ),
                    (
                        "/sys/fs/cgroup/memory/process_api/e131/memory.stat",
                        "cache 1\ntotal_cache 104857600\ntotal_shmem 0\n",
                    ),
                    (
                        "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
                        unlimited,
                    ),
                    (
                        "/sys/fs/cgroup/memory/process_api/memory.usage_in_bytes",
                        "999999999\n",
                    ),
                    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", unlimited),
                    (
                        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                        "9999999999\n",
                    ),
                ],
                Some(cg("/process_api/e131", GIB, 200 * MIB, 100 * MIB)),
            ),
            (
                "v1, only an ancestor limited",
                vec![
                    ("/proc/self/cgroup", HYBRID_CGROUP),
                    ("/proc/self/mountinfo", HYBRID_MOUNTINFO),
                    (
                        "/sys/fs/cgroup/memory/process_api/e131/memory.limit_in_bytes",
                        unlimited,
                    ),
                    (
                        "/sys/fs/cgroup/memory/process_api/e131/memory.usage_in_bytes",
                        "1\n",
                    ),
                    (
                        "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
                        "2147483648\n",
                    ),
                    (
                        "/sys/fs/cgroup/memory/process_api/memory.usage_in_bytes",
                        "1073741824\n",
                    ),
                    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", unlimited),
                ],
                Some(cg("/process_api", 2 * GIB, GIB, 0)),
            ),
            (
                "v1, nothing limited",
                vec![
                    ("/proc/self/cgroup", HYBRID_CGROUP),
                    ("/proc/self/mountinfo", HYBRID_MOUNTINFO),
                    (
                        "/sys/fs/cgroup/memory/process_api/e131/memory.limit_in_bytes",
                        unlimited,
                    ),
                    (
                        "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
                        unlimited,
                    ),
                    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", unlimited),
                ],
                None,
            ),
            (
                "v2, the pod's limit leaves less than the container's",
                vec![
                    ("/proc/self/cgroup", V2_CGROUP),
                    ("/proc/self/mountinfo", V2_MOUNTINFO),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max",
                        "1073741824\n",
                    ),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.high",
                        "max\n",
                    ),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.current",
                        "104857600\n",
                    ),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/memory.max",
                        "1073741824\n",
                    ),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/memory.current",
                        "524288000\n",
                    ),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/memory.stat",
                        "anon 1\nfile 209715200\nshmem 104857600\n",
                    ),
                    ("/sys/fs/cgroup/kubepods.slice/memory.max", "max\n"),
                    ("/sys/fs/cgroup/kubepods.slice/memory.current", "1\n"),
                    // The root cgroup has no memory.max.
                    ("/sys/fs/cgroup/memory.current", "1\n"),
                ],
                Some(cg("/kubepods.slice/pod1", GIB, 500 * MIB, 100 * MIB)),
            ),
            (
                "v2, memory.high below memory.max",
                vec![
                    ("/proc/self/cgroup", V2_CGROUP),
                    ("/proc/self/mountinfo", V2_MOUNTINFO),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max",
                        "2147483648\n",
                    ),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.high",
                        "1073741824\n",
                    ),
                    (
                        "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.current",
                        "0\n",
                    ),
                ],
                Some(cg("/kubepods.slice/pod1/ctr", GIB, 0, 0)),
            ),
            (
                "v2 without the memory controller (no memory.* files)",
                vec![
                    ("/proc/self/cgroup", V2_CGROUP),
                    ("/proc/self/mountinfo", V2_MOUNTINFO),
                ],
                None,
            ),
            ("no /proc (unreadable)", vec![], None),
        ];
        for (name, files, want) in cases {
            let view = MemoryView::read(&fake(&files));
            assert_eq!(view.cgroup, want, "{name}");
        }
        let view = MemoryView::read(&fake(&[meminfo]));
        assert_eq!(view.mem_available, Some(22 * GIB));
    }

    #[test]
    fn a_given_budget_must_fit_what_the_cgroup_has_left() {
        let view = MemoryView {
            mem_available: Some(22 * GIB),
            cgroup: Some(cg("/bench", GIB, 200 * MIB, 60 * MIB)),
        };
        // (cache, staging, fits): 1024 - 140 = 884 MiB left.
        let cases = [
            (850 * MIB, 0, true),
            (884 * MIB, 0, true),
            (885 * MIB, 0, false),
            (600 * MIB, 256 * MIB, true),
            (700 * MIB, 256 * MIB, false),
            (2 * GIB, 256 * MIB, false),
        ];
        for (cache, staging, fits) in cases {
            let r = check_given(&view, cache, staging);
            assert_eq!(r.is_ok(), fits, "{cache} + {staging}: {r:?}");
        }
        assert_eq!(
            check_given(&view, 2 * GIB, 256 * MIB)
                .unwrap_err()
                .to_string(),
            "--cache-size 2.0 GiB and --prefetch-memory 256 MiB do not fit the memory cgroup \
             /bench (limit 1.0 GiB, 140 MiB in use): at most 628 MiB of cache fits beside that \
             prefetch memory; leave --cache-size out (or pass auto) for a cache that grows and \
             shrinks with what is free"
        );
        assert_eq!(
            check_given(&view, 2 * GIB, 0).unwrap_err().to_string(),
            "--cache-size 2.0 GiB does not fit the memory cgroup /bench (limit 1.0 GiB, 140 MiB \
             in use): at most 884 MiB fits; leave --cache-size out (or pass auto) for a cache \
             that grows and shrinks with what is free"
        );
        // No cgroup limit: anything goes here (preflight still checks MemTotal).
        let host = MemoryView {
            mem_available: Some(GIB),
            cgroup: None,
        };
        assert_eq!(check_given(&host, 64 * GIB, GIB).unwrap().cache, 64 * GIB);
    }
}
