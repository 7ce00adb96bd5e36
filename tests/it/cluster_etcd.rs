//! A cluster whose members find each other in a real etcd (`--cluster`, `--etcd`): three
//! mounts of one dataset on this machine, each through a view of its own (a bind mount),
//! register, partition the cache, survive a member's
//! `kill -9` mid-epoch with no read error, re-home its files, and take it back when it
//! restarts. A record written to etcd without the cluster's secret is ignored.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use coorfs::cluster::owner::owner;

const FILES: usize = 240;
const SIZE: usize = 16 * 1024;
const MEMBERS: usize = 3;
const CLUSTER: &str = "test-cluster";

/// A real etcd server (Debian's etcd-server) on free loopback ports, in a directory of its
/// own; stopped when dropped.
struct Etcd {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    fn start() -> Etcd {
        let dir = open_tempdir();
        let ports = free_ports(2);
        let url = format!("http://127.0.0.1:{}", ports[0]);
        let peer = format!("http://127.0.0.1:{}", ports[1]);
        let child = Command::new("etcd")
            .args(["--name", "coorfs-test", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("coorfs-test={peer}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
            .spawn()
            .expect("etcd (apt-get install etcd-server)");
        let etcd = Etcd {
            child,
            url,
            _dir: dir,
        };
        let health = format!("127.0.0.1:{}", ports[0]);
        assert!(
            wait_for(Duration::from_secs(20), || healthy(&health)),
            "etcd did not start"
        );
        etcd
    }

    /// Runs `f` with a client of this etcd.
    fn with_client<T>(&self, f: impl AsyncFnOnce(&mut etcd_client::Client) -> T) -> T {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut client = etcd_client::Client::connect([&self.url], None)
                .await
                .unwrap();
            f(&mut client).await
        })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// True if etcd at `addr` answers its health check.
fn healthy(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(b"GET /health HTTP/1.0\r\n\r\n");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.contains("\"health\":\"true\"")
}

/// A bind mount of a directory: one server's view of the shared dataset.
struct View(PathBuf);

impl View {
    fn new(of: &Path, at: PathBuf) -> View {
        std::fs::create_dir_all(&at).unwrap();
        let ok = Command::new("mount")
            .arg("--bind")
            .arg(of)
            .arg(&at)
            .status()
            .unwrap();
        assert!(ok.success(), "mount --bind {}", of.display());
        View(at)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Dropped in this order: the mounts first.
struct Cluster {
    mounts: Vec<Option<Mount>>,
    etcd: Etcd,
    /// Each member's view of the dataset.
    views: Vec<View>,
    dir: tempfile::TempDir,
    src: PathBuf,
    rels: Vec<PathBuf>,
    addrs: Vec<String>,
    extra: &'static [&'static str],
}

impl Cluster {
    /// Three members in etcd over a fresh dataset, each with a cache of 60% of it: together
    /// they cover it, and two of them still do. `extra`: more mount options.
    fn new(extra: &'static [&'static str]) -> Cluster {
        let etcd = Etcd::start();
        let dir = open_tempdir();
        let src = dir.path().join("src");
        let rels = make_dataset(&src, FILES, SIZE, 6);
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "a-cluster-secret-of-32-bytes....\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let addrs: Vec<String> = free_ports(MEMBERS)
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let views = (0..MEMBERS)
            .map(|m| View::new(&src, dir.path().join(format!("view{m}"))))
            .collect();
        let mut c = Cluster {
            etcd,
            views,
            dir,
            src,
            rels,
            addrs,
            mounts: Vec::new(),
            extra,
        };
        for member in 0..MEMBERS {
            let m = c.mount(member);
            c.mounts.push(Some(m));
        }
        for member in 0..MEMBERS {
            c.wait_for_members(member, MEMBERS);
        }
        c
    }

    /// Mounts member `member`.
    fn mount(&self, member: usize) -> Mount {
        let secret = self.dir.path().join("secret");
        let cache = (FILES * SIZE * 6 / 10).to_string();
        let mut args = self.extra.to_vec();
        let log = self.log(member);
        args.extend([
            "--log-file",
            log.to_str().unwrap(),
            "--cluster",
            CLUSTER,
            "--etcd",
            &self.etcd.url,
            "--peer-listen",
            &self.addrs[member],
            "--cluster-secret-file",
            secret.to_str().unwrap(),
            "--cache-size",
            &cache,
        ]);
        let m = Mount::new(&self.views[member].0, &args);
        wait_for_scan(&m.mnt);
        m
    }

    /// Where member `member`'s daemon logs (appended to across its restarts).
    fn log(&self, member: usize) -> PathBuf {
        self.dir.path().join(format!("member{member}.log"))
    }

    /// Waits until member `member` sees `n` members; on failure, shows its log.
    fn wait_for_members(&self, member: usize, n: usize) {
        let mnt = &self.mounts[member].as_ref().unwrap().mnt;
        let of = format!(" of {n} (");
        assert!(
            wait_for(Duration::from_secs(20), || {
                stats(mnt)["cluster"].as_str().unwrap_or("").contains(&of)
            }),
            "member {member} never saw {n} members: {}\nits log:\n{}",
            stats(mnt)["cluster"],
            std::fs::read_to_string(self.log(member)).unwrap_or_default()
        );
    }

    /// The member that owns `rel` among `live`.
    fn owner(&self, live: &[usize], rel: &Path) -> usize {
        let names: Vec<&String> = live.iter().map(|m| &self.addrs[*m]).collect();
        live[owner(&names, rel.as_os_str().as_bytes()).unwrap()]
    }

    /// DistributedSampler's shards of epoch `epoch` over the members `live`.
    fn shards(&self, live: &[usize], epoch: usize) -> Vec<Vec<PathBuf>> {
        let mut shards = vec![Vec::new(); MEMBERS];
        for (i, rel) in self.rels.iter().enumerate() {
            shards[live[(i * 7 + epoch * 5) % live.len()]].push(rel.clone());
        }
        shards
    }

    /// Member `member` reads `files`; every byte is checked against the source.
    fn read(&self, member: usize, files: &[PathBuf]) {
        let m = self.mounts[member].as_ref().unwrap();
        for rel in files {
            let got = std::fs::read(m.path(rel))
                .unwrap_or_else(|e| panic!("{} through member {member}: {e}", rel.display()));
            let want = std::fs::read(self.src.join(rel)).unwrap();
            assert!(got == want, "{} through member {member}", rel.display());
        }
    }

    /// One epoch over the members `live`.
    fn epoch(&self, live: &[usize], epoch: usize) {
        for (member, shard) in self.shards(live, epoch).iter().enumerate() {
            if live.contains(&member) {
                self.read(member, shard);
            }
        }
    }

    fn stat(&self, member: usize, key: &str) -> u64 {
        num(&stats(&self.mounts[member].as_ref().unwrap().mnt), key)
    }

    /// Bytes the members `live` read from the source so far.
    fn source_bytes(&self, live: &[usize]) -> u64 {
        live.iter()
            .map(|m| self.stat(*m, "bytes_from_source"))
            .sum()
    }
}

#[test]
fn members_in_etcd_share_one_cache_survive_a_death_re_home_and_rejoin() {
    // Without prefetch, so that what comes from where is exact (a prefetcher would have
    // fetched the rest of the epoch from the member before it died).
    let mut c = Cluster::new(&["--no-prefetch"]);
    let all = [0, 1, 2];
    let dataset = (FILES * SIZE) as u64;
    // Epoch 1: each file is read from the source once, by its owner.
    c.epoch(&all, 1);
    assert_eq!(c.source_bytes(&all), dataset);
    for member in all {
        let owned = c.rels.iter().filter(|r| c.owner(&all, r) == member).count() as u64;
        assert_eq!(c.stat(member, "cached_files"), owned, "member {member}");
        // The stats name every member and its share of the dataset.
        let s = stats(&c.mounts[member].as_ref().unwrap().mnt);
        let cluster = s["cluster"].as_str().unwrap();
        assert!(
            cluster.ends_with(&format!("({}), cluster {CLUSTER} in etcd", c.addrs[member])),
            "{cluster}"
        );
        let members = s["members"].as_str().unwrap();
        for (other, addr) in c.addrs.iter().enumerate() {
            let files = c.rels.iter().filter(|r| c.owner(&all, r) == other).count();
            let pct = 100.0 * files as f64 / FILES as f64;
            let line = format!("{addr} owns {pct:.1}% ({files} files, ");
            assert!(members.contains(&line), "{line} in {members}");
        }
        let budget = coorfs::units::format_size((FILES * SIZE * 6 / 10) as u64);
        assert!(members.contains(&format!("cache {budget})")), "{members}");
        let epochs = s["epochs"].as_array().unwrap();
        assert_eq!(
            num(&epochs[0], "peer_hits"),
            c.stat(member, "peer_hits"),
            "{s}"
        );
    }
    // Epoch 2, other shards: nothing from the source.
    c.epoch(&all, 2);
    assert_eq!(c.source_bytes(&all), dataset, "epoch 2 read the source");

    // Epoch 3: member 2 is killed halfway through. The survivors finish their shards with no
    // read error; its files come from the source.
    let shards = c.shards(&all, 3);
    let half = |s: &Vec<PathBuf>| s.len() / 2;
    for member in all {
        c.read(member, &shards[member][..half(&shards[member])]);
    }
    let dead = c.mounts[2].take().unwrap();
    let pid = dead.kill();
    assert!(wait_for(Duration::from_secs(10), || !process_alive(pid)));
    drop(dead);
    let survivors = [0, 1];
    let before = c.source_bytes(&survivors);
    for member in survivors {
        c.read(member, &shards[member][half(&shards[member])..]);
    }
    let fell_back: u64 = survivors
        .iter()
        .map(|m| {
            let s = stats(&c.mounts[*m].as_ref().unwrap().mnt);
            s["epochs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| num(e, "peer_fallbacks"))
                .sum::<u64>()
        })
        .sum();
    let errors: u64 = survivors.iter().map(|m| c.stat(*m, "peer_errors")).sum();
    assert_eq!(
        fell_back, errors,
        "every peer error fell back to the source"
    );
    let its_read = survivors
        .iter()
        .flat_map(|m| &shards[*m][half(&shards[*m])..])
        .filter(|r| c.owner(&all, r) == 2)
        .count() as u64;
    assert!(its_read > 0);
    // Its files came from the source, once each.
    assert_eq!(c.source_bytes(&survivors) - before, its_read * SIZE as u64);
    assert!(errors > 0);

    // Its lease runs out: the survivors own its files now (re-home) and cache them as they
    // read them, once; the epoch after reads nothing from the source.
    for member in survivors {
        c.wait_for_members(member, 2);
    }
    c.epoch(&survivors, 4);
    let after_4 = c.source_bytes(&survivors);
    c.epoch(&survivors, 5);
    assert_eq!(
        c.source_bytes(&survivors),
        after_4,
        "epoch 5 read the source"
    );
    for member in survivors {
        let owned = c
            .rels
            .iter()
            .filter(|r| c.owner(&survivors, r) == member)
            .count() as u64;
        assert!(c.stat(member, "cached_files") >= owned, "member {member}");
    }

    // Member 2 restarts at its address (once its old lease is gone) and rejoins: the others
    // ask it for its files again, and it serves them.
    c.mounts[2] = Some(c.mount(2));
    for member in all {
        c.wait_for_members(member, MEMBERS);
    }
    c.epoch(&all, 6);
    c.epoch(&all, 7);
    assert!(
        c.stat(2, "peer_served") > 0,
        "the restarted member served nothing"
    );
    let settled = c.source_bytes(&all);
    c.epoch(&all, 8);
    assert_eq!(c.source_bytes(&all), settled, "epoch 8 read the source");
    // A member that unmounts leaves at once, without waiting for its lease.
    let leaving = c.mounts[0].take().unwrap();
    leaving.unmount();
    for member in [1, 2] {
        assert!(
            wait_for(Duration::from_secs(3), || {
                stats(&c.mounts[member].as_ref().unwrap().mnt)["cluster"]
                    .as_str()
                    .unwrap_or("")
                    .contains(" of 2 (")
            }),
            "member {member} still counts the member that unmounted"
        );
    }
}

#[test]
fn a_member_record_not_signed_with_the_secret_is_ignored() {
    let c = Cluster::new(&[]);
    let prefix = format!("/coorfs/clusters/{CLUSTER}/members/");
    // Someone who can write to etcd but lacks the secret adds a member, to draw reads.
    c.etcd.with_client(async |client| {
        client
            .put(
                format!("{prefix}127.0.0.1:9"),
                r#"{"record":"{\"addr\":\"127.0.0.1:9\",\"cache_bytes\":1,\"host\":\"x\",\"pid\":1}","sig":"00"}"#,
                None,
            )
            .await
            .unwrap();
    });
    // The members re-read the set (a change) and still count three.
    std::thread::sleep(Duration::from_millis(500));
    for member in 0..MEMBERS {
        let s = stats(&c.mounts[member].as_ref().unwrap().mnt);
        assert!(
            s["cluster"].as_str().unwrap().contains(" of 3 ("),
            "{}",
            s["cluster"]
        );
        assert!(!s["members"].as_str().unwrap().contains("127.0.0.1:9"));
    }
    c.epoch(&[0, 1, 2], 1);
    assert_eq!(c.source_bytes(&[0, 1, 2]), (FILES * SIZE) as u64);
    let errors: u64 = (0..MEMBERS).map(|m| c.stat(m, "peer_errors")).sum();
    assert_eq!(errors, 0);
    // A second daemon at a member's address is refused, with one line: the address is taken.
    let mnt = c.dir.path().join("second");
    std::fs::create_dir(&mnt).unwrap();
    let secret = c.dir.path().join("secret");
    let listen = format!("127.0.0.1:{}", free_ports(1)[0]);
    let out = coorfs([
        "mount",
        "--cluster",
        CLUSTER,
        "--etcd",
        &c.etcd.url,
        "--peer-listen",
        &listen,
        "--advertise",
        &c.addrs[0],
        "--cluster-secret-file",
        secret.to_str().unwrap(),
        c.src.to_str().unwrap(),
        mnt.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "another member holds {} in cluster {CLUSTER}",
            c.addrs[0]
        )),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn etcd_out_of_reach_or_bad_cluster_options_get_one_line_and_a_failure() {
    let scratch = scratch(0o600);
    let (src, mnt, s) = (&*scratch.src, &*scratch.mnt, &*scratch.secret);
    for (args, line) in [
        (
            vec!["--cluster", "c", "--etcd", "http://127.0.0.1:1"],
            "etcd at http://127.0.0.1:1: ",
        ),
        (
            vec!["--cluster", "a/b", "--etcd", "http://127.0.0.1:1"],
            "--cluster \"a/b\": a cluster's name is 1 to 64 letters",
        ),
        (
            vec![
                "--cluster",
                "c",
                "--etcd",
                "http://127.0.0.1:1",
                "--advertise",
                "nohost",
            ],
            "--advertise: \"nohost\" is not HOST:PORT",
        ),
    ] {
        // A port drawn free may be bound by another process before the daemon binds it (CI
        // once: "the peer server cannot listen on 127.0.0.1:22657: Address already in use",
        // a right answer to the wrong question): then another is drawn, twice at most.
        let mut tries = 0;
        let (out, what) = loop {
            let listen = format!("127.0.0.1:{}", free_ports(1)[0]);
            let mut all = vec!["mount"];
            all.extend(args.iter().copied());
            all.extend(["--cluster-secret-file", s, "--peer-listen", &listen]);
            all.extend([src, mnt]);
            let out = coorfs(&all);
            tries += 1;
            if tries < 3 && stderr(&out).contains("Address already in use") {
                continue;
            }
            break (out, format!("{all:?}"));
        };
        // The daemon finds etcd out of reach: the mount fails (1); bad options are usage (2).
        let code = if line.starts_with("etcd") { 1 } else { 2 };
        fails_with_line(&out, code, line, &what);
        assert!(!is_mounted(Path::new(mnt)));
    }
    // Every interface, and no address to tell the others.
    let out = coorfs([
        "mount",
        "--cluster",
        "c",
        "--etcd",
        "http://127.0.0.1:1",
        "--peer-listen",
        "0.0.0.0:7070",
        "--cluster-secret-file",
        s,
        src,
        mnt,
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--peer-listen 0.0.0.0:7070 is every interface: pass --advertise"),
        "{}",
        stderr(&out)
    );
    // --cluster without etcd is a usage error.
    let out = coorfs(["mount", "--cluster", "c", src, mnt]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--etcd"), "{}", stderr(&out));
}
