//! Prometheus metrics (`--metrics-addr`): a real Prometheus server (Debian's `prometheus`)
//! scrapes a mount, and a query returns the mount's hit rate; the endpoint serves nothing
//! else.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;

/// `GET path` from `addr`, as HTTP/1.0: the status and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// A Prometheus server scraping `target` every second, on a free port; stopped when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = open_tempdir();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: coorfs\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_ports(1)[0]);
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .expect("prometheus (apt-get install prometheus)");
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// The value of the instant query `query`'s one result, if it has one.
    fn query(&self, query: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query={query}");
        let Ok(mut s) = std::net::TcpStream::connect(&self.addr) else {
            return None;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).ok()?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).ok()?;
        let body = reply.split_once("\r\n\r\n")?.1;
        let json: serde_json::Value = serde_json::from_str(body).ok()?;
        json["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_every_stat_and_a_query_returns_the_hit_rate() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 60, 8 * 1024, 3);
    let addr = format!("127.0.0.1:{}", free_ports(1)[0]);
    // A cache of half the dataset: epoch 2 hits about half.
    let cache = (60 * 8 * 1024 / 2).to_string();
    let m = Mount::new(
        &src,
        &[
            "--metrics-addr",
            &addr,
            "--cache-size",
            &cache,
            "--no-prefetch",
        ],
    );
    wait_for_scan(&m.mnt);
    for _ in 0..2 {
        for rel in &rels {
            std::fs::read(m.path(rel)).unwrap();
        }
    }
    let st = stats(&m.mnt);

    // Every stat, by the name of its attribute, and the epochs by label.
    let (status, text) = get(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    // A word (`transport`) is one series of 1 labelled with it.
    for stat in coorfs::stats::Stat::ALL {
        let name = format!("\ncoorfs_{}", stat.name());
        assert!(
            text.contains(&format!("{name} ")) || text.contains(&format!("{name}{{")),
            "{name} in {text}"
        );
    }
    assert!(
        text.contains("\ncoorfs_transport{transport=\"dev_fuse\"} 1.0"),
        "{text}"
    );
    let line = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {text}"))
    };
    assert_eq!(line("coorfs_reads"), num(&st, "reads") as f64);
    assert_eq!(line("coorfs_cached_bytes"), num(&st, "cached_bytes") as f64);
    let epoch2 = &st["epochs"][1];
    assert_eq!(
        line("coorfs_epoch_hit_rate{epoch=\"2\"}"),
        epoch2["hit_rate"].as_f64().unwrap()
    );
    assert_eq!(
        line("coorfs_epoch_bytes_from_source{epoch=\"1\"}"),
        (60 * 8 * 1024) as f64
    );
    // Nothing else is served, to anyone.
    let other = as_nobody(
        "python3",
        &[
            OsStr::new("-c"),
            OsStr::new(
                "import http.client, sys\n\
                 for method, path in (('GET', '/'), ('GET', '/metrics/../etc/passwd'), ('POST', '/metrics')):\n\
                 \x20   c = http.client.HTTPConnection(sys.argv[1], timeout=10)\n\
                 \x20   c.request(method, path)\n\
                 \x20   print(c.getresponse().status)\n",
            ),
            OsStr::new(&addr),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&other.stdout),
        "404\n404\n405\n",
        "{}",
        stderr(&other)
    );

    // A real Prometheus scrapes it: its query gives the mount's hit rate.
    let prometheus = Prometheus::start(&addr);
    let want = st["hit_rate"].as_f64().unwrap();
    assert!(want > 0.2 && want < 0.8, "{want}");
    let mut got = None;
    assert!(
        wait_for(Duration::from_secs(60), || {
            got = prometheus.query("coorfs_hit_rate");
            got.is_some()
        }),
        "Prometheus never scraped the mount"
    );
    assert!((got.unwrap() - want).abs() < 1e-4, "{got:?} against {want}");
    m.unmount();
}

#[test]
fn a_metrics_address_that_is_taken_fails_the_mount_with_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let s = scratch(0o600);
    let out = coorfs(["mount", "--metrics-addr", &addr, &s.src, &s.mnt]);
    fails_with_line(
        &out,
        1,
        &format!("the metrics server cannot listen on {addr}"),
        "taken",
    );
    let out = coorfs(["mount", "--metrics-addr", "localhost", &s.src, &s.mnt]);
    fails_with_line(&out, 2, "--metrics-addr", "not an address");
}
