//! A cluster of three mounts of one dataset on this machine, each a member with its own
//! cache, port and mount point (`--peers`): every member caches the files it owns and serves
//! them to the others, a dead member's files come from the source, and the peer server
//! refuses whoever does not hold the cluster's secret.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::*;
use coorfs::cluster::auth::Secret;
use coorfs::cluster::owner::owner;
use coorfs::cluster::wire::members_digest;

const FILES: usize = 240;
const SIZE: usize = 16 * 1024;
const MEMBERS: usize = 3;

struct Cluster {
    _dir: tempfile::TempDir,
    src: PathBuf,
    rels: Vec<PathBuf>,
    peers: Vec<String>,
    secret: PathBuf,
    mounts: Vec<Option<Mount>>,
}

impl Cluster {
    /// Three members over a fresh dataset, each with a cache of half of it (a member owns a
    /// third of the files, give or take a few: rendezvous hashing spreads them at random).
    fn new() -> Cluster {
        Cluster::with(|_| Vec::new())
    }

    /// The same, each member mounted with the options `extra` gives for the cluster's
    /// directory as well.
    fn with(extra: impl Fn(&Path) -> Vec<String>) -> Cluster {
        let dir = open_tempdir();
        let more = extra(dir.path());
        let src = dir.path().join("src");
        let rels = make_dataset(&src, FILES, SIZE, 6);
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "a-cluster-secret-of-32-bytes....\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let peers: Vec<String> = free_ports(MEMBERS)
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let cache = (FILES * SIZE / 2).to_string();
        let list = peers.join(",");
        let mounts = (0..MEMBERS)
            .map(|rank| {
                let rank = rank.to_string();
                let mut args = vec![
                    "--peers",
                    &list,
                    "--node-rank",
                    &rank,
                    "--cluster-secret-file",
                    secret.to_str().unwrap(),
                    "--cache-size",
                    &cache,
                    // The tests count each member's reads from its peers exactly; a prefetcher
                    // that judged the storage remote under load (reads of 10 ms or more) read
                    // ahead a file its member's shard does not read (a CI run: 50 peer hits
                    // for 49 files asked).
                    "--no-prefetch",
                ];
                args.extend(more.iter().map(String::as_str));
                let m = Mount::new(&src, &args);
                wait_for_scan(&m.mnt);
                Some(m)
            })
            .collect();
        Cluster {
            _dir: dir,
            src,
            rels,
            peers,
            secret,
            mounts,
        }
    }

    /// The member that owns `rel`.
    fn owner(&self, rel: &Path) -> usize {
        owner(&self.peers, rel.as_os_str().as_bytes()).unwrap()
    }

    /// Epoch `epoch` of a job of one rank per member, each reading its own shard (a
    /// different one each epoch, as DistributedSampler's): checks every file's bytes against
    /// the source and returns, per member, the files it read.
    fn epoch(&self, epoch: usize) -> Vec<Vec<PathBuf>> {
        let mut shards = vec![Vec::new(); MEMBERS];
        for (i, rel) in self.rels.iter().enumerate() {
            shards[(i * 7 + epoch * 5) % MEMBERS].push(rel.clone());
        }
        self.read(&shards);
        shards
    }

    /// Each member reads the files of its shard, and their bytes are checked.
    fn read(&self, shards: &[Vec<PathBuf>]) {
        for (member, shard) in shards.iter().enumerate() {
            let Some(m) = &self.mounts[member] else {
                continue;
            };
            for rel in shard {
                let got = std::fs::read(m.path(rel)).unwrap();
                let want = std::fs::read(self.src.join(rel)).unwrap();
                assert!(got == want, "{} through member {member}", rel.display());
            }
        }
    }

    fn stat(&self, member: usize, key: &str) -> u64 {
        num(&stats(&self.mounts[member].as_ref().unwrap().mnt), key)
    }
}

#[test]
fn members_serve_each_other_their_files_and_the_source_serves_a_dead_members() {
    let mut c = Cluster::new();
    // Epoch 1: each file is read from the source once, by its owner, whoever asked for it.
    let shards = c.epoch(1);
    let dataset = (FILES * SIZE) as u64;
    let from_source: u64 = (0..MEMBERS).map(|i| c.stat(i, "bytes_from_source")).sum();
    assert_eq!(from_source, dataset);
    for (member, shard) in shards.iter().enumerate() {
        let owned = c.rels.iter().filter(|r| c.owner(r) == member).count() as u64;
        let asked = shard.iter().filter(|r| c.owner(r) != member).count() as u64;
        let served = shards
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != member)
            .flat_map(|(_, s)| s)
            .filter(|r| c.owner(r) == member)
            .count() as u64;
        assert_eq!(c.stat(member, "peer_hits"), asked, "member {member}");
        assert_eq!(c.stat(member, "bytes_from_peers"), asked * SIZE as u64);
        assert_eq!(c.stat(member, "peer_served"), served, "member {member}");
        assert_eq!(c.stat(member, "bytes_to_peers"), served * SIZE as u64);
        // Each member caches exactly the files it owns.
        assert_eq!(c.stat(member, "cached_files"), owned, "member {member}");
        assert_eq!(c.stat(member, "peer_errors"), 0);
        // The epoch records count them too: every read was the dataset-wide epoch 1's.
        let s = stats(&c.mounts[member].as_ref().unwrap().mnt);
        let epochs = s["epochs"].as_array().unwrap();
        assert_eq!(
            num(&epochs[0], "bytes_from_peers"),
            asked * SIZE as u64,
            "{s}"
        );
        assert_eq!(num(&epochs[0], "peer_hits"), asked, "{s}");
        assert_eq!(num(&epochs[0], "peer_fallbacks"), 0, "{s}");
    }
    // `coorfs stats` names the members and each one's share of the dataset.
    let view = coorfs([
        OsStr::new("stats"),
        c.mounts[1].as_ref().unwrap().mnt.as_os_str(),
    ]);
    let view = String::from_utf8_lossy(&view.stdout);
    let line = format!("cluster: member 1 of 3 ({}), --peers\n", c.peers[1]);
    assert!(view.contains(&line), "{view}");
    for (member, addr) in c.peers.iter().enumerate() {
        let files = c.rels.iter().filter(|r| c.owner(r) == member).count();
        let pct = 100.0 * files as f64 / FILES as f64;
        let size = coorfs::units::format_size((files * SIZE) as u64);
        let line = format!("\n    {addr} owns {pct:.1}% ({files} files, {size})\n");
        assert!(view.contains(&line), "{line} in {view}");
    }
    // Its epoch table has the peers' columns.
    assert!(view.contains("from peers peer fails  state"), "{view}");
    // Epoch 2, other shards: nothing more from the source anywhere.
    let last = c.epoch(2);
    for member in 0..MEMBERS {
        assert!(c.stat(member, "peer_hits") > 0);
    }
    let again: u64 = (0..MEMBERS).map(|i| c.stat(i, "bytes_from_source")).sum();
    assert_eq!(again, dataset, "epoch 2 read the source");

    // Member 2 dies. The others read the whole dataset between them with no error: its files
    // come from the source, and it is asked once or twice, not for every file.
    let dead = c.mounts[2].take().unwrap();
    let pid = dead.kill();
    assert!(wait_for(std::time::Duration::from_secs(10), || {
        !process_alive(pid)
    }));
    drop(dead);
    // The survivors read its files, each one a file it did not read last (so that nothing
    // comes from the blocks a member keeps of what it read moments ago, for a re-read).
    let its: Vec<&PathBuf> = c.rels.iter().filter(|r| c.owner(r) == 2).collect();
    let mut shards = vec![Vec::new(); MEMBERS];
    for (i, rel) in its.iter().enumerate() {
        let survivor = if last[i % 2].contains(rel) {
            1 - i % 2
        } else {
            i % 2
        };
        shards[survivor].push(rel.to_path_buf());
    }
    c.read(&shards);
    let its_files = its.len() as u64;
    let fallback: u64 = (0..2).map(|i| c.stat(i, "bytes_from_source")).sum::<u64>()
        - (0..2)
            .map(|i| {
                // What each survivor had read from the source before: its own files, once.
                c.rels.iter().filter(|r| c.owner(r) == i).count() as u64 * SIZE as u64
            })
            .sum::<u64>();
    // Each of the dead member's files came from the source, once.
    assert_eq!(fallback, its_files * SIZE as u64);
    // Each survivor asked it once, then again after a second, two, four (an epoch of this
    // size takes well under 7 s).
    let errors: Vec<u64> = (0..2).map(|i| c.stat(i, "peer_errors")).collect();
    assert!(errors.iter().all(|e| (1..=3).contains(e)), "{errors:?}");
}

/// Sends `target` with `authorization` (if any) to `addr` as nobody; the status.
fn status_as_nobody(addr: &str, target: &str, authorization: Option<&str>) -> u16 {
    let script = r#"
import http.client, sys
c = http.client.HTTPConnection(sys.argv[1], timeout=10)
headers = {"Authorization": sys.argv[3]} if len(sys.argv) > 3 else {}
c.request("GET", sys.argv[2], headers=headers)
print(c.getresponse().status)
"#;
    let mut args: Vec<&OsStr> = vec![OsStr::new("-c"), OsStr::new(script)];
    args.extend([OsStr::new(addr), OsStr::new(target)]);
    if let Some(a) = authorization {
        args.push(OsStr::new(a));
    }
    let out = as_nobody("python3", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn the_peer_server_refuses_whoever_lacks_the_secret_and_paths_outside_the_dataset() {
    let c = Cluster::new();
    std::os::unix::fs::symlink("/etc/passwd", c.src.join("escape")).unwrap();
    let addr = &c.peers[0];
    let rel = &c.rels[0];
    let meta = std::fs::metadata(c.src.join(rel)).unwrap();
    use std::os::unix::fs::MetadataExt;
    let target = coorfs::cluster::wire::BlockRequest {
        path: rel.as_os_str().as_bytes().to_vec(),
        block: 0,
        size: meta.size(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
        members: members_digest(&c.peers),
    }
    .target();
    let ours = format!("&members={:016x}", members_digest(&c.peers));
    let secret = Secret::load(&c.secret).unwrap();
    // A member's request is served; nobody's, without the secret, is not.
    assert_eq!(
        status_as_nobody(addr, &target, Some(&secret.sign("GET", &target))),
        200
    );
    let refused = [
        status_as_nobody(addr, &target, None),
        status_as_nobody(addr, &target, Some("coorfs-hmac t=1,s=00")),
        status_as_nobody(
            addr,
            &target,
            Some(&Secret::new(vec![7; 32]).unwrap().sign("GET", &target)),
        ),
    ];
    assert_eq!(refused, [401, 401, 401]);
    // Signed, but outside the dataset: refused before the source is asked.
    let outside = [
        "/v1/block?path=..%2F..%2Fetc%2Fpasswd&block=0&size=1&mtime=0&ctime=0",
        "/v1/block?path=%2Fetc%2Fpasswd&block=0&size=1&mtime=0&ctime=0",
    ];
    for t in outside.map(|t| format!("{t}{ours}")) {
        assert_eq!(
            status_as_nobody(addr, &t, Some(&secret.sign("GET", &t))),
            400,
            "{t}"
        );
    }
    // A symbolic link out of the dataset is no file of it.
    let link = format!("/v1/block?path=escape&block=0&size=1&mtime=0&ctime=0{ours}");
    assert_eq!(
        status_as_nobody(addr, &link, Some(&secret.sign("GET", &link))),
        404
    );
    // A member that lists other members would disagree on owners: refused.
    let others = target.replace(
        &ours,
        &format!("&members={:016x}", members_digest(&["x:1"])),
    );
    assert_eq!(
        status_as_nobody(addr, &others, Some(&secret.sign("GET", &others))),
        409
    );
    let long = format!("/v1/block?path={}", "a".repeat(20_000));
    assert_eq!(status_as_nobody(addr, &long, None), 414);
    assert_eq!(c.stat(0, "peer_refused"), 3 + 2 + 1 + 1);
    assert_eq!(c.stat(0, "peer_served"), 1);
}

/// A certificate authority (`ca.pem`) and a certificate for 127.0.0.1 it signed
/// (`member.pem`, `member.key`), made in `dir` with openssl.
fn make_certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", stderr(&out));
    };
    std::fs::write(
        dir.join("openssl.cnf"),
        "[req]\ndistinguished_name=dn\nprompt=no\n[dn]\nCN=coorfs test CA\n\
         [ca]\nbasicConstraints=critical,CA:true\nkeyUsage=critical,keyCertSign\n",
    )
    .unwrap();
    let ec = [
        "-config",
        "openssl.cnf",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let ca = ["-x509", "-extensions", "ca", "-days", "2"];
    run(&[
        &["req"],
        &ec[..],
        &ca,
        &["-keyout", "ca.key", "-out", "ca.pem"],
    ]
    .concat());
    run(&[
        &["req"],
        &ec[..],
        &[
            "-keyout",
            "member.key",
            "-out",
            "member.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    ]
    .concat());
    std::fs::write(dir.join("san"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "member.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-out",
        "member.pem",
        "-days",
        "2",
        "-extfile",
        "san",
    ]);
}

#[test]
fn members_over_tls_serve_each_other_and_nothing_in_the_clear() {
    let c = Cluster::with(|dir| {
        make_certificates(dir);
        let file = |name: &str| dir.join(name).to_str().unwrap().to_string();
        vec![
            "--peer-tls-cert".into(),
            file("member.pem"),
            "--peer-tls-key".into(),
            file("member.key"),
            "--peer-tls-ca".into(),
            file("ca.pem"),
        ]
    });
    // The members serve each other, over HTTPS.
    c.epoch(1);
    let dataset = (FILES * SIZE) as u64;
    let from_source: u64 = (0..MEMBERS).map(|i| c.stat(i, "bytes_from_source")).sum();
    assert_eq!(from_source, dataset);
    for member in 0..MEMBERS {
        assert!(c.stat(member, "peer_hits") > 0, "member {member}");
        assert_eq!(c.stat(member, "peer_errors"), 0, "member {member}");
    }
    // Plain HTTP gets no answer; HTTPS trusting the cluster's authority gets the server, which
    // still wants the signature.
    let script = r#"
import http.client, ssl, sys
host, port = sys.argv[1].rsplit(":", 1)
try:
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    c.request("GET", "/v1/block")
    print("plain", c.getresponse().status)
except Exception as e:
    print("plain refused")
ctx = ssl.create_default_context(cadata=sys.argv[2])
c = http.client.HTTPSConnection(host, int(port), timeout=10, context=ctx)
c.request("GET", "/v1/block")
print("tls", c.getresponse().status)
"#;
    let ca = std::fs::read_to_string(c._dir.path().join("ca.pem")).unwrap();
    let out = as_nobody(
        "python3",
        &[
            OsStr::new("-c"),
            OsStr::new(script),
            OsStr::new(&c.peers[0]),
            OsStr::new(&ca),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "plain refused\ntls 401\n",
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_cluster_options_get_one_line_and_exit_2() {
    let scratch = scratch(0o644);
    let (src, mnt, s) = (&*scratch.src, &*scratch.mnt, &*scratch.secret);
    for (args, line) in [
        (
            vec![
                "--peers",
                "a:1,b:2",
                "--node-rank",
                "0",
                "--cluster-secret-file",
                s,
            ],
            "may be read by other users (mode 644): chmod 600 it",
        ),
        (
            vec![
                "--peers",
                "a:1,b",
                "--node-rank",
                "0",
                "--cluster-secret-file",
                s,
            ],
            "--peers: \"b\" is not HOST:PORT",
        ),
        (
            vec![
                "--peers",
                "a:1,a:1",
                "--node-rank",
                "0",
                "--cluster-secret-file",
                s,
            ],
            "--peers names a:1 twice",
        ),
        (
            vec![
                "--peers",
                "a:1,b:2",
                "--node-rank",
                "2",
                "--cluster-secret-file",
                s,
            ],
            "--node-rank 2 is no place in --peers (2 members: 0 to 1)",
        ),
        (
            vec!["--peers", "a:1,b:2", "--node-rank", "0"],
            "--cluster-secret-file",
        ),
        (
            vec![
                "--peers",
                "a:1,b:2",
                "--node-rank",
                "0",
                "--cluster-secret-file",
                s,
                "--peer-tls-cert",
                "/nonexistent.pem",
            ],
            "--peer-tls-key",
        ),
    ] {
        let mut all = vec!["mount"];
        all.extend(args);
        all.extend([src, mnt]);
        fails_with_line(&coorfs(&all), 2, line, &format!("{all:?}"));
        assert!(!is_mounted(Path::new(mnt)));
    }
    // Without --node-rank, the rank comes from the launcher's environment.
    for (env, line) in [
        (
            vec![],
            "--peers needs this member's place: --node-rank N, or COORFS_NODE_RANK",
        ),
        (
            vec![("NODE_RANK", "one")],
            "NODE_RANK=\"one\" is not a node rank",
        ),
        // torchrun's GROUP_RANK first; a good rank moves on to the next check, the secret's.
        (
            vec![("GROUP_RANK", "1"), ("NODE_RANK", "one")],
            "may be read by other users",
        ),
    ] {
        let mut cmd = std::process::Command::new(bin());
        cmd.args([
            "mount",
            "--peers",
            "a:1,b:2",
            "--cluster-secret-file",
            s,
            src,
            mnt,
        ]);
        for name in ["COORFS_NODE_RANK", "GROUP_RANK", "NODE_RANK"] {
            cmd.env_remove(name);
        }
        cmd.envs(env.iter().copied());
        let out = output_within(&mut cmd, std::time::Duration::from_secs(30));
        fails_with_line(&out, 2, line, &format!("{env:?}"));
    }
}
