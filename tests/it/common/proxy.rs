//! An HTTP proxy for the object-store tests: in front of an emulator, it forwards each
//! request on its own connection, delayed if asked (a store across a network), and answers
//! chosen requests itself with an injected fault (a status, a reset, a stall).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to a request.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Answers with this status and an S3 error body.
    Status(u16, &'static str),
    /// Resets the connection without an answer.
    Reset,
    /// Holds the connection for this long without an answer, then closes it.
    Stall(Duration),
    /// Forwards the answer's head and this many bytes of its body, then closes the
    /// connection (one that ends mid-body).
    Cut(usize),
}

/// Faults to inject: a request whose first line contains `matching` gets `fault`, `times`
/// times (u32::MAX: always); and until `down_until`, every connection is reset before its
/// request is read (a store that is down).
#[derive(Default)]
pub struct Faults {
    rules: Vec<(String, Fault, u32)>,
    down_until: Option<std::time::Instant>,
}

impl Faults {
    fn take(&mut self, line: &str) -> Option<Fault> {
        let rule = self
            .rules
            .iter_mut()
            .find(|(m, _, n)| *n > 0 && line.contains(m.as_str()))?;
        if rule.2 != u32::MAX {
            rule.2 -= 1;
        }
        Some(rule.1)
    }
}

/// An HTTP proxy in front of `upstream` that forwards each request on its own connection
/// (and closes the client's after the answer), unless a fault is due.
pub struct FaultProxy {
    pub port: u16,
    faults: Arc<Mutex<Faults>>,
    /// Each request forwarded: its first line, when it came and when its answer was sent.
    log: Arc<Mutex<Vec<Served>>>,
}

/// A request the proxy forwarded: its first line and its Range header (or ""), from its
/// arrival to its answer's end.
#[derive(Clone, Debug)]
pub struct Served {
    pub line: String,
    pub range: String,
    pub came: std::time::Instant,
    pub answered: std::time::Instant,
}

/// The most of `served` that were in flight at once.
pub fn most_at_once(served: &[Served]) -> usize {
    served
        .iter()
        .map(|a| {
            served
                .iter()
                .filter(|b| b.came <= a.came && a.came < b.answered)
                .count()
        })
        .max()
        .unwrap_or(0)
}

impl FaultProxy {
    pub fn start(upstream: u16) -> FaultProxy {
        FaultProxy::delayed(upstream, Duration::ZERO)
    }

    /// A proxy that also holds every request `delay` before forwarding it: a store across
    /// a network.
    pub fn delayed(upstream: u16, delay: Duration) -> FaultProxy {
        FaultProxy::paced(upstream, delay, 0)
    }

    /// [`FaultProxy::delayed`], whose answers' bodies flow at `rate` bytes a second each (0:
    /// as fast as the host copies them): a cloud store's stream, about 100 MB/s a
    /// connection.
    pub fn paced(upstream: u16, delay: Duration, rate: u64) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Mutex::new(Faults::default()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (rules, served) = (faults.clone(), log.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (rules, served) = (rules.clone(), served.clone());
                let how = Serve { delay, rate };
                std::thread::spawn(move || serve(client, upstream, &rules, &served, how));
            }
        });
        FaultProxy { port, faults, log }
    }

    /// The requests forwarded so far whose first line contains `matching`.
    pub fn served(&self, matching: &str) -> Vec<Served> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|s| s.line.contains(matching))
            .cloned()
            .collect()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn inject(&self, matching: &str, fault: Fault, times: u32) {
        self.faults
            .lock()
            .unwrap()
            .rules
            .push((matching.into(), fault, times));
    }

    /// Resets every connection for the next `outage`, before its request is read.
    pub fn down_for(&self, outage: Duration) {
        self.faults.lock().unwrap().down_until = Some(std::time::Instant::now() + outage);
    }

    pub fn clear(&self) {
        self.faults.lock().unwrap().rules.clear();
    }
}

/// Reads one request (head and body) from `client`; None at the end of the stream.
pub fn read_request(client: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte).ok()? == 0 {
            return None;
        }
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).into_owned();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    client.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// Closes `client` with a reset (SO_LINGER 0), answering nothing.
pub fn reset(client: TcpStream) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&client);
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a linger struct of the size passed.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as u32,
        );
    }
}

/// How the proxy answers: each request held `delay`, each body at `rate` bytes a second (0:
/// at once).
#[derive(Clone, Copy)]
pub struct Serve {
    delay: Duration,
    rate: u64,
}

pub fn serve(
    mut client: TcpStream,
    upstream: u16,
    faults: &Mutex<Faults>,
    log: &Mutex<Vec<Served>>,
    Serve { delay, rate }: Serve,
) {
    let down = faults.lock().unwrap().down_until;
    if down.is_some_and(|until| std::time::Instant::now() < until) {
        return reset(client);
    }
    let Some((head, body)) = read_request(&mut client) else {
        return;
    };
    let came = std::time::Instant::now();
    std::thread::sleep(delay);
    let line = head.lines().next().unwrap_or("").to_string();
    let range = (head.lines())
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("range")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    // Taken before the match, which would hold the lock through a stall.
    let fault = faults.lock().unwrap().take(&line);
    match fault {
        Some(Fault::Status(code, s3code)) => {
            let body = format!("<Error><Code>{s3code}</Code><Message>injected</Message></Error>");
            let answer = format!(
                "HTTP/1.1 {code} Injected\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(answer.as_bytes());
            return;
        }
        Some(Fault::Reset) => return reset(client),
        Some(Fault::Stall(hold)) => {
            std::thread::sleep(hold);
            return;
        }
        Some(Fault::Cut(_)) | None => {}
    }
    let cut = match fault {
        Some(Fault::Cut(n)) => Some(n),
        _ => None,
    };
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    // One request per connection, both ways; the Host the upstream's own (fake-gcs-server
    // routes by it).
    let mut forwarded: String = head
        .split("\r\n")
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| match l.to_ascii_lowercase().starts_with("host:") {
            true => format!("Host: 127.0.0.1:{upstream}\r\n"),
            false => format!("{l}\r\n"),
        })
        .collect();
    forwarded.push_str("Connection: close\r\n\r\n");
    if up.write_all(forwarded.as_bytes()).is_err() || up.write_all(&body).is_err() {
        return;
    }
    let mut answer = Vec::new();
    let _ = up.read_to_end(&mut answer);
    // The client must not reuse this connection either.
    if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&answer[..end]).into_owned();
        let kept: String = head
            .split("\r\n")
            .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
            .map(|l| format!("{l}\r\n"))
            .collect();
        let _ = client.write_all(format!("{kept}Connection: close\r\n\r\n").as_bytes());
        let body = &answer[end + 4..];
        if let Some(n) = cut {
            let _ = client.write_all(&body[..n.min(body.len())]);
            log.lock().unwrap().push(Served {
                line,
                range,
                came,
                answered: std::time::Instant::now(),
            });
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        if rate == 0 {
            let _ = client.write_all(body);
        } else {
            // In slices of 64 KiB, each when the rate allows it.
            let began = std::time::Instant::now();
            for (i, slice) in body.chunks(64 << 10).enumerate() {
                let due = Duration::from_secs_f64((i * (64 << 10)) as f64 / rate as f64);
                std::thread::sleep(due.saturating_sub(began.elapsed()));
                if client.write_all(slice).is_err() {
                    break;
                }
            }
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    log.lock().unwrap().push(Served {
        line,
        range,
        came,
        answered: std::time::Instant::now(),
    });
}
