//! A GET's body read from the socket straight into the memory that keeps it: S3 over plain
//! HTTP (an `http://` endpoint: MinIO, Ceph, a store inside the cluster), one copy a byte.
//!
//! object_store's client takes a body through hyper into chunks of its own, which a task of
//! the source's runtime hands over a channel to the reading thread, which copies them into
//! blocks: two copies and a task hop a chunk. Here the reading thread writes the request on
//! a kept-alive connection, parses the answer's head ([`httparse`]) and `read`s the body into
//! the blocks ([`Body`]) itself.
//!
//! Only the plain case is taken here: a 206 of exactly the range asked (or a 200 of a whole
//! object asked whole), of the version asked, with a Content-Length. Any other answer (a 503,
//! a 412, a redirect), a connection that breaks, a read that times out: the rest of the range
//! goes to object_store's client ([`Got::Rest`]), which retries, backs off and words the
//! error as it always did, from the first byte not yet read. Each failure here is counted as
//! object_store's are ([`Counters`]). A kept-alive connection that the store closed while it
//! waited in the pool is not a failure: its request is sent again on a new one, once.
//!
//! Requests are presigned by object_store's [`Signer`] (SigV4 in the query, `host` its one
//! signed header), so Range and If-Match go as plain headers and the credentials stay
//! object_store's (profiles, instance roles, their refresh).

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use object_store::signer::Signer;
use parking_lot::Mutex;

use super::counting::Counters;
use super::tree::same_etag;

/// How long a presigned URL is good for: it is used at once, or by a GET sent ahead within
/// `AHEAD_FOR`; the margin is for clocks that disagree.
const SIGNED_FOR: Duration = Duration::from_secs(15 * 60);

/// Connections kept alive, idle, for the next GETs: a few jobs' readers and prefetch threads.
const IDLE_MAX: usize = 32;

/// How long an idle connection is kept: S3 closes one idle for about 20 s.
const IDLE_FOR: Duration = Duration::from_secs(15);

/// The most a head may take: S3's are well under 2 KiB.
const HEAD_MAX: usize = 64 << 10;

/// The memory a GET's body is read into, handed out a piece at a time: a caller's buffer, or
/// the blocks of a run, each allocated when the body reaches it.
pub(super) trait Body {
    /// Free memory for the body's next bytes; None if there is no more (the blocks could not
    /// be had: the caller knows why).
    fn room(&mut self) -> Option<&mut [u8]>;

    /// The first `n` bytes of the last [`Body::room`] are the body's.
    fn filled(&mut self, n: usize);

    /// Copies `from` in; false if the room ran out first.
    fn put(&mut self, mut from: &[u8]) -> bool {
        while !from.is_empty() {
            let Some(room) = self.room() else {
                return false;
            };
            let n = room.len().min(from.len());
            room[..n].copy_from_slice(&from[..n]);
            self.filled(n);
            from = &from[n..];
        }
        true
    }
}

/// The plain-HTTP client of an S3 source (see the module's header).
pub(super) struct Direct {
    signer: Arc<dyn Signer>,
    /// Idle kept-alive connections, oldest first.
    idle: Mutex<Vec<Idle>>,
    timeout: Duration,
    counters: Arc<Counters>,
    /// False once signing failed: every GET is object_store's from then on.
    on: AtomicBool,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Direct({} idle)", self.idle.lock().len())
    }
}

/// An idle connection: the `host:port` it reaches and since when it waits.
struct Idle {
    authority: String,
    conn: TcpStream,
    since: Instant,
}

/// A GET written to its connection, its answer not read yet: the body waits in the socket.
pub(super) struct Sent {
    conn: TcpStream,
    url: url::Url,
    /// `host:port` of `url`, which a kept connection is filed under.
    authority: String,
    /// The request's bytes, to send again if a kept-alive connection turns out closed.
    request: Vec<u8>,
    reused: bool,
}

/// What came of a GET ([`Direct::receive`]).
#[derive(Debug, PartialEq)]
pub(super) enum Got {
    /// This many bytes of the body are in the [`Body`]: all of them, or as many as it took.
    Read(usize),
    /// This many are, and object_store's client is to GET the rest (an answer not taken
    /// here, a connection that failed).
    Rest(usize),
    /// The store answered with another version of the object.
    Changed,
}

impl Direct {
    /// A client that signs with `signer`, each read waiting at most `timeout`.
    pub(super) fn new(signer: Arc<dyn Signer>, timeout: Duration, counters: Arc<Counters>) -> Self {
        Direct {
            signer,
            idle: Mutex::new(Vec::new()),
            timeout,
            counters,
            on: AtomicBool::new(true),
        }
    }

    /// False once signing failed.
    pub(super) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Signing failed with `why`: GETs are object_store's from now on, said once.
    pub(super) fn signing_failed(&self, name: &std::path::Path, why: &str) {
        if self.on.swap(false, Ordering::Relaxed) {
            tracing::info!(
                "{}: GETs go through object_store's client: presigning failed: {why}",
                name.display()
            );
        }
    }

    /// The presigning of a GET of `key`, to run on the source's runtime (object_store may
    /// fetch or refresh credentials on it).
    pub(super) fn presign(
        &self,
        key: &object_store::path::Path,
    ) -> impl Future<Output = object_store::Result<url::Url>> + Send + 'static {
        let (signer, key) = (self.signer.clone(), key.clone());
        async move { signer.signed_url(http::Method::GET, &key, SIGNED_FOR).await }
    }

    /// Writes the GET of `range` of the object at `url` (presigned), if it is still `etag`,
    /// on a kept-alive connection to its host or a new one.
    pub(super) fn send(&self, url: url::Url, range: Range<u64>, etag: &str) -> io::Result<Sent> {
        let authority = authority(&url)?;
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {authority}\r\nRange: bytes={}-{}\r\n\
             If-Match: {etag}\r\nUser-Agent: coorfs/{}\r\n\r\n",
            range.start,
            range.end - 1,
            env!("CARGO_PKG_VERSION"),
        )
        .into_bytes();
        if let Some(mut conn) = self.take_idle(&authority) {
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            if conn.write_all(&request).is_ok() {
                return Ok(Sent {
                    conn,
                    url,
                    authority,
                    request,
                    reused: true,
                });
            }
        }
        let mut conn = self.connect(&url)?;
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        conn.write_all(&request)?;
        Ok(Sent {
            conn,
            url,
            authority,
            request,
            reused: false,
        })
    }

    /// Reads the answer to `sent`, the GET of `range` at `etag`, into `body`.
    pub(super) fn receive(
        &self,
        mut sent: Sent,
        range: Range<u64>,
        etag: &str,
        body: &mut dyn Body,
    ) -> Got {
        let want = (range.end - range.start) as usize;
        let mut buf = vec![0u8; 4096];
        let (len, head) = loop {
            match read_head(&mut sent.conn, &mut buf) {
                Ok(got) => break got,
                // The store closed a kept-alive connection before this request reached it:
                // the request goes again on a new one, as every HTTP client does for a GET.
                Err(Fail::Closed) if sent.reused => {
                    let resent = self.connect(&sent.url).and_then(|mut conn| {
                        self.counters.requests.fetch_add(1, Ordering::Relaxed);
                        conn.write_all(&sent.request).map(|()| conn)
                    });
                    match resent {
                        Ok(conn) => (sent.conn, sent.reused) = (conn, false),
                        Err(_) => return self.failed(0),
                    }
                }
                Err(_) => return self.failed(0),
            }
        };
        if let Some(status) = head.unusual(&range) {
            // Counted as object_store's client counts it: it sends the request again.
            self.counters.answered(status);
            return Got::Rest(0);
        }
        if head
            .etag
            .as_deref()
            .is_some_and(|got| !same_etag(etag, got))
        {
            return Got::Changed;
        }
        let surplus = &buf[head.len..len];
        if surplus.len() > want {
            return self.failed(0);
        }
        if !body.put(surplus) {
            return Got::Read(0);
        }
        let mut got = surplus.len();
        while got < want {
            let Some(room) = body.room() else {
                return Got::Read(got);
            };
            let n = room.len().min(want - got);
            match sent.conn.read(&mut room[..n]) {
                Ok(0) => return self.failed(got),
                Ok(n) => {
                    body.filled(n);
                    got += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.failed(got),
            }
        }
        if head.keep_alive {
            self.keep(sent.authority, sent.conn);
        }
        Got::Read(got)
    }

    /// A GET that failed after `got` bytes: counted as a retry, the rest object_store's.
    pub(super) fn failed(&self, got: usize) -> Got {
        self.counters.retried.fetch_add(1, Ordering::Relaxed);
        Got::Rest(got)
    }

    /// A connection to the host of `url`, with this client's timeouts.
    fn connect(&self, url: &url::Url) -> io::Result<TcpStream> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for addr in url.socket_addrs(|| Some(80))? {
            match TcpStream::connect_timeout(&addr, self.timeout) {
                Ok(conn) => {
                    conn.set_nodelay(true)?;
                    conn.set_read_timeout(Some(self.timeout))?;
                    conn.set_write_timeout(Some(self.timeout))?;
                    return Ok(conn);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// An idle connection to `authority` young enough to use; older ones are closed.
    fn take_idle(&self, authority: &str) -> Option<TcpStream> {
        let mut idle = self.idle.lock();
        idle.retain(|i| i.since.elapsed() < IDLE_FOR);
        let at = idle.iter().rposition(|i| i.authority == authority)?;
        Some(idle.remove(at).conn)
    }

    /// Keeps `conn` for the next GET to `authority`; past [`IDLE_MAX`], the oldest goes.
    fn keep(&self, authority: String, conn: TcpStream) {
        let mut idle = self.idle.lock();
        if idle.len() >= IDLE_MAX {
            idle.remove(0);
        }
        idle.push(Idle {
            authority,
            conn,
            since: Instant::now(),
        });
    }
}

/// True if `value` (an ETag the store gave) can go in a header as it is: no control
/// character, which would end the header, or the request.
pub(super) fn header_safe(value: &str) -> bool {
    value.bytes().all(|b| b >= 0x20 && b != 0x7f)
}

/// `host:port` of `url`, as its Host header says it (the port only if it is not the
/// scheme's).
fn authority(url: &url::Url) -> io::Result<String> {
    let host = url
        .host_str()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a URL with no host"))?;
    Ok(match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    })
}

/// Why an answer's head could not be read.
#[derive(Debug)]
enum Fail {
    /// The connection ended before a byte of it.
    Closed,
    /// Anything else: a timeout, a reset mid-head, a head that is no HTTP.
    Broken,
}

/// What the head of an answer says.
#[derive(Debug)]
struct Head {
    /// The head's bytes: the body begins after them.
    len: usize,
    status: u16,
    length: Option<u64>,
    /// `bytes START-END/SIZE`.
    content_range: Option<String>,
    etag: Option<String>,
    /// A body in chunks: not taken here.
    chunked: bool,
    keep_alive: bool,
}

impl Head {
    /// None if this is the answer to a GET of `range` whose body can be read as it is; else
    /// its status, for the rest to go to object_store's client.
    fn unusual(&self, range: &Range<u64>) -> Option<u16> {
        let want = range.end - range.start;
        let exact = match self.status {
            206 => self.content_range.as_deref().is_some_and(|r| {
                r.strip_prefix("bytes ")
                    .and_then(|r| r.split_once('/'))
                    .is_some_and(|(span, _)| span == format!("{}-{}", range.start, range.end - 1))
            }),
            // The whole object, where the range was all of it.
            200 => range.start == 0,
            _ => false,
        };
        (!exact || self.chunked || self.length != Some(want)).then_some(self.status)
    }
}

/// Reads the head of an answer from `conn` into `buf` (grown as needed): the bytes read and
/// the head, whose body's first bytes follow it in `buf`.
fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(usize, Head), Fail> {
    let mut len = 0;
    loop {
        if len == buf.len() {
            if buf.len() >= HEAD_MAX {
                return Err(Fail::Broken);
            }
            buf.resize(buf.len() * 2, 0);
        }
        match conn.read(&mut buf[len..]) {
            Ok(0) if len == 0 => return Err(Fail::Closed),
            Err(e) if len == 0 && e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(Fail::Closed);
            }
            Ok(0) => return Err(Fail::Broken),
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(Fail::Broken),
        }
        if let Some(head) = parse_head(&buf[..len])? {
            return Ok((len, head));
        }
    }
}

/// The head at the start of `bytes`, or None if more of it is to come.
fn parse_head(bytes: &[u8]) -> Result<Option<Head>, Fail> {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut answer = httparse::Response::new(&mut headers);
    let len = match answer.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Fail::Broken),
    };
    let mut head = Head {
        len,
        status: answer.code.unwrap_or(0),
        length: None,
        content_range: None,
        etag: None,
        chunked: false,
        // HTTP/1.1 keeps the connection unless it says otherwise; 1.0 closes it.
        keep_alive: answer.version == Some(1),
    };
    for h in answer.headers.iter() {
        let Ok(value) = std::str::from_utf8(h.value) else {
            continue;
        };
        let value = value.trim();
        match h.name.to_ascii_lowercase().as_str() {
            "content-length" => head.length = value.parse().ok(),
            "content-range" => head.content_range = Some(value.to_string()),
            "etag" => head.etag = Some(value.to_string()),
            "transfer-encoding" => head.chunked = true,
            "connection" => head.keep_alive = value.eq_ignore_ascii_case("keep-alive"),
            _ => {}
        }
    }
    Ok(Some(head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A caller's buffer as a [`Body`].
    struct Buf(Vec<u8>, usize);

    impl Body for Buf {
        fn room(&mut self) -> Option<&mut [u8]> {
            (self.1 < self.0.len()).then(|| &mut self.0[self.1..])
        }
        fn filled(&mut self, n: usize) {
            self.1 += n;
        }
    }

    /// Signs nothing: the URL as it is.
    #[derive(Debug)]
    struct Unsigned;

    #[async_trait::async_trait]
    impl Signer for Unsigned {
        async fn signed_url(
            &self,
            _method: http::Method,
            path: &object_store::path::Path,
            _expires_in: Duration,
        ) -> object_store::Result<url::Url> {
            Ok(url::Url::parse(&format!("http://127.0.0.1/b/{path}")).unwrap())
        }
    }

    const OBJECT: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

    /// A store of one object, `"v1"`, that answers each connection's requests by `script`:
    /// for the n-th request on it, its answer's head (with `{range}` and `{len}` filled in)
    /// and whether the connection then closes. Returns its port and the requests it read.
    fn store(
        script: impl Fn(usize, usize) -> (String, bool) + Clone + Send + 'static,
    ) -> (u16, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = log.clone();
        std::thread::spawn(move || {
            for (c, conn) in listener.incoming().enumerate() {
                let mut conn = conn.unwrap();
                let (log, script) = (seen.clone(), script.clone());
                std::thread::spawn(move || {
                    for n in 0.. {
                        let mut raw = Vec::new();
                        let mut byte = [0u8];
                        while !raw.ends_with(b"\r\n\r\n") {
                            if conn.read(&mut byte).unwrap_or(0) == 0 {
                                return;
                            }
                            raw.push(byte[0]);
                        }
                        let text = String::from_utf8(raw).unwrap();
                        log.lock().push(text.clone());
                        let range = (text.lines())
                            .find_map(|l| l.strip_prefix("Range: bytes="))
                            .unwrap();
                        let (a, b) = range.split_once('-').unwrap();
                        let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                        let (head, close) = script(c, n);
                        let head = head
                            .replace("{range}", &format!("{a}-{b}/{}", OBJECT.len()))
                            .replace("{len}", &(b + 1 - a).to_string());
                        let _ = conn.write_all(head.as_bytes());
                        let _ = conn.write_all(&OBJECT[a..=b.min(OBJECT.len() - 1)]);
                        if close {
                            return;
                        }
                    }
                });
            }
        });
        (port, log)
    }

    const OK: &str = "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {range}\r\nContent-Length: {len}\r\nETag: \"v1\"\r\n\r\n";

    fn client() -> Direct {
        Direct::new(
            Arc::new(Unsigned),
            Duration::from_secs(5),
            Default::default(),
        )
    }

    fn get(d: &Direct, port: u16, range: Range<u64>) -> (Got, Vec<u8>) {
        let url =
            url::Url::parse(&format!("http://127.0.0.1:{port}/b/k?X-Amz-Signature=s")).unwrap();
        let mut body = Buf(vec![0; (range.end - range.start) as usize], 0);
        let sent = d.send(url, range.clone(), "\"v1\"").unwrap();
        let got = d.receive(sent, range, "\"v1\"", &mut body);
        (got, body.0[..body.1].to_vec())
    }

    /// Bytes as the store has them, two GETs on one kept-alive connection, with the
    /// presigned query, the range and the version asked in each request.
    #[test]
    fn gets_read_their_ranges_and_keep_the_connection() {
        let (port, log) = store(|_, _| (OK.into(), false));
        let d = client();
        assert_eq!(
            get(&d, port, 3..13),
            (Got::Read(10), OBJECT[3..13].to_vec())
        );
        assert_eq!(get(&d, port, 0..36), (Got::Read(36), OBJECT.to_vec()));
        let log = log.lock();
        assert_eq!(log.len(), 2);
        assert!(
            log[0].starts_with("GET /b/k?X-Amz-Signature=s HTTP/1.1\r\n"),
            "{}",
            log[0]
        );
        assert!(log[0].contains(&format!("Host: 127.0.0.1:{port}\r\n")));
        assert!(log[0].contains("Range: bytes=3-12\r\nIf-Match: \"v1\"\r\n"));
        assert_eq!(d.counters.requests.load(Ordering::Relaxed), 2);
        assert_eq!(d.idle.lock().len(), 1, "one connection, kept");
    }

    /// A store that closes each connection after its answer: the next GET, sent on the
    /// closed one, goes again on a new connection, uncounted as a failure.
    #[test]
    fn a_kept_connection_the_store_closed_is_replaced() {
        let (port, log) = store(|_, _| (OK.into(), true));
        let d = client();
        for _ in 0..3 {
            assert_eq!(get(&d, port, 0..5), (Got::Read(5), OBJECT[..5].to_vec()));
        }
        assert_eq!(d.counters.retried.load(Ordering::Relaxed), 0);
        assert_eq!(log.lock().len(), 3);
    }

    /// An answer that says `Connection: close` is not pooled.
    #[test]
    fn connection_close_is_not_kept() {
        let close = "HTTP/1.1 206 P\r\nContent-Range: bytes {range}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n";
        let (port, _) = store(|_, _| (close.into(), true));
        let d = client();
        assert_eq!(get(&d, port, 1..4).0, Got::Read(3));
        assert_eq!(d.idle.lock().len(), 0);
    }

    #[test]
    fn an_etag_that_would_end_its_header_is_not_sent_here() {
        assert!(header_safe("\"9b2cf535f27731c974343645a3985328-3\""));
        assert!(!header_safe("\"v1\"\r\nX-Evil: 1"));
        assert!(!header_safe("\"v1\0\""));
    }

    /// Answers not taken here leave the whole range to object_store's client, counted as
    /// its client counts them; another version is refused.
    #[test]
    fn other_answers_go_to_the_store_client() {
        let d = client();
        let (port, _) = store(|_, _| {
            (
                "HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\n\r\n".into(),
                false,
            )
        });
        assert_eq!(get(&d, port, 0..5), (Got::Rest(0), vec![]));
        assert_eq!(d.counters.throttled.load(Ordering::Relaxed), 1);
        assert_eq!(d.counters.retried.load(Ordering::Relaxed), 1);
        // Another range than asked.
        let (port, _) = store(|_, _| {
            (
                "HTTP/1.1 206 P\r\nContent-Range: bytes 0-4/36\r\nContent-Length: {len}\r\n\r\n"
                    .into(),
                false,
            )
        });
        assert_eq!(get(&d, port, 1..6).0, Got::Rest(0));
        // A body in chunks.
        let (port, _) = store(|_, _| {
            ("HTTP/1.1 206 P\r\nContent-Range: bytes {range}\r\nTransfer-Encoding: chunked\r\n\r\n".into(), false)
        });
        assert_eq!(get(&d, port, 1..6).0, Got::Rest(0));
        let (port, _) = store(|_, _| (OK.replace("v1", "v2"), false));
        assert_eq!(get(&d, port, 0..5).0, Got::Changed);
    }

    /// A body cut short: the bytes read are kept, the rest is object_store's.
    #[test]
    fn a_body_cut_short_leaves_the_rest() {
        let short = "HTTP/1.1 206 P\r\nContent-Range: bytes {range}\r\nContent-Length: 99\r\n\r\n";
        let (port, _) = store(|_, _| (short.into(), true));
        let d = client();
        // The store says 99 bytes for a range of 10: not taken.
        assert_eq!(get(&d, port, 0..10).0, Got::Rest(0));
        let cut = "HTTP/1.1 206 P\r\nContent-Range: bytes 0-39/40\r\nContent-Length: 40\r\n\r\n";
        let (port, _) = store(|_, _| (cut.into(), true));
        let (got, bytes) = get(&d, port, 0..40);
        assert_eq!(got, Got::Rest(36));
        assert_eq!(bytes, OBJECT);
        assert_eq!(d.counters.retried.load(Ordering::Relaxed), 1);
    }
}
