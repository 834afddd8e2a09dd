//! A reverse proxy in front of the test registry that behaves like a slow or broken one: it
//! limits the bytes it sends back to a rate shared by every connection, can ignore `Range`
//! (answers 200 with the whole blob), and can stall ranged replies mid-body, keeping the
//! connection open. It counts what it forwards, for tests to assert on.
//!
//! It speaks plaintext HTTP/1.1 (it must read and rewrite request heads), so the registry behind
//! it runs without TLS: `RegistryOptions::default()`. crishim and containerd both allow plain HTTP
//! to loopback registries.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::registry::Registry;

/// The rate the lazy-pull benchmark gives the registry: 100 MiB/s.
pub const BENCH_RATE: u64 = 100 << 20;

/// Bytes forwarded per read: small enough that connections sharing the rate interleave finely.
const PIECE: usize = 16 << 10;
/// A request or response head, or a chunk-size line, longer than this is refused.
const MAX_HEAD: usize = 64 << 10;
/// Stall threshold meaning "off".
const NO_STALL: u64 = u64::MAX;

/// How a [`Throttle`] starts; each setting can be changed later through its setters.
#[derive(Clone, Debug, Default)]
pub struct ThrottleOptions {
    /// Response-body bytes per second, shared by all connections; 0: unlimited.
    pub rate: u64,
    /// Remove `Range` and `If-Range` from requests, so that the registry answers 200 with the
    /// whole blob, as one that does not honour ranges.
    pub ignore_range: bool,
    /// Stop each reply to a request that carried `Range` after this many body bytes, and keep
    /// its connection open without sending anything more.
    pub stall_ranged_after: Option<u64>,
}

impl ThrottleOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn rate(mut self, bytes_per_second: u64) -> Self {
        self.rate = bytes_per_second;
        self
    }

    pub fn ignore_range(mut self) -> Self {
        self.ignore_range = true;
        self
    }

    pub fn stall_ranged_after(mut self, bytes: u64) -> Self {
        self.stall_ranged_after = Some(bytes);
        self
    }
}

/// A token bucket, in bytes; a taker that overdraws it sleeps until its debt is repaid, so
/// takers are served in turn and the rate holds however sleeps round.
struct Bucket {
    rate: AtomicU64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(rate: u64) -> Bucket {
        Bucket {
            rate: AtomicU64::new(rate),
            state: Mutex::new((Self::burst(rate), Instant::now())),
        }
    }

    /// What may be sent at once after an idle spell: a tenth of a second's worth.
    fn burst(rate: u64) -> f64 {
        (rate as f64 / 10.0).max(PIECE as f64)
    }

    async fn take(&self, n: usize) {
        let rate = self.rate.load(Ordering::Relaxed);
        if rate == 0 {
            return;
        }
        let wait = {
            let mut s = self.state.lock().expect("bucket lock");
            let now = Instant::now();
            let refill = now.duration_since(s.1).as_secs_f64() * rate as f64;
            s.0 = (s.0 + refill).min(Self::burst(rate)) - n as f64;
            s.1 = now;
            (s.0 < 0.0).then(|| Duration::from_secs_f64(-s.0 / rate as f64))
        };
        if let Some(w) = wait {
            tokio::time::sleep(w).await;
        }
    }
}

struct Shared {
    upstream: String,
    bucket: Bucket,
    ignore_range: AtomicBool,
    stall_after: AtomicU64,
    requests: AtomicU64,
    ranged_requests: AtomicU64,
    body_bytes: AtomicU64,
    stalled: AtomicU64,
}

/// The proxy, listening on `127.0.0.1:<random port>`. Dropping it closes the listener and every
/// connection, stalled ones included.
pub struct Throttle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Throttle {
    /// Proxy to `upstream` (`host:port`, plain HTTP). Must be called within a tokio runtime,
    /// which then runs the proxy.
    pub async fn start(upstream: &str, opts: ThrottleOptions) -> Result<Throttle> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream: upstream.to_string(),
            bucket: Bucket::new(opts.rate),
            ignore_range: AtomicBool::new(opts.ignore_range),
            stall_after: AtomicU64::new(opts.stall_ranged_after.unwrap_or(NO_STALL)),
            requests: AtomicU64::new(0),
            ranged_requests: AtomicU64::new(0),
            body_bytes: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
        });
        let task = tokio::spawn(serve(listener, shared.clone()));
        tracing::debug!(%addr, upstream, ?opts, "throttling proxy started");
        Ok(Throttle { addr, shared, task })
    }

    /// Proxy to `registry`, which must serve plain HTTP (the proxy reads and rewrites requests).
    pub async fn in_front_of(registry: &Registry, opts: ThrottleOptions) -> Result<Throttle> {
        ensure!(
            registry.url().starts_with("http://"),
            "the throttling proxy needs a plain-HTTP registry (RegistryOptions without TLS)"
        );
        Self::start(&registry.host(), opts).await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT`: the registry host to pull from through the proxy.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Response-body bytes per second from now on, shared by all connections; 0: unlimited.
    pub fn set_rate(&self, bytes_per_second: u64) {
        self.shared
            .bucket
            .rate
            .store(bytes_per_second, Ordering::Relaxed);
    }

    /// Strip `Range` from the requests that arrive from now on (or stop stripping it).
    pub fn set_ignore_range(&self, on: bool) {
        self.shared.ignore_range.store(on, Ordering::Relaxed);
    }

    /// Stall each reply to a ranged request whose body starts from now on after `bytes` body
    /// bytes (`None`: never). A reply already under way keeps the setting it started with.
    pub fn set_stall_ranged_after(&self, bytes: Option<u64>) {
        self.shared
            .stall_after
            .store(bytes.unwrap_or(NO_STALL), Ordering::Relaxed);
    }

    /// Requests received.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Requests received with a `Range` header (counted before it is stripped).
    pub fn ranged_requests(&self) -> u64 {
        self.shared.ranged_requests.load(Ordering::Relaxed)
    }

    /// Response-body bytes sent to clients (chunked framing included), heads left out.
    pub fn body_bytes(&self) -> u64 {
        self.shared.body_bytes.load(Ordering::Relaxed)
    }

    /// Replies stalled so far.
    pub fn stalled_replies(&self) -> u64 {
        self.shared.stalled.load(Ordering::Relaxed)
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it drops them all.
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((sock, peer)) => {
                    let shared = shared.clone();
                    conns.spawn(async move {
                        if let Err(e) = connection(sock, &shared).await {
                            tracing::debug!(%peer, "throttling proxy connection: {e:#}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("throttling proxy accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// A parsed request or response head (the raw bytes stay with the caller).
struct Head {
    /// Request line or status line.
    first: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn parse(raw: &[u8]) -> Result<Head> {
        let text = std::str::from_utf8(raw).context("HTTP head is not UTF-8")?;
        let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
        let first = lines.next().context("empty HTTP head")?.to_string();
        let mut headers = Vec::new();
        for l in lines {
            let (k, v) = l.split_once(':').context("header line without ':'")?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        Ok(Head { first, headers })
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// The head as bytes, without the headers named in `drop`.
    fn render_without(&self, drop: &[&str]) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.first);
        for (k, v) in &self.headers {
            if !drop.iter().any(|d| k.eq_ignore_ascii_case(d)) {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    fn framing(&self) -> Result<Framing> {
        if self.has_token("transfer-encoding", "chunked") {
            return Ok(Framing::Chunked);
        }
        match self.get("content-length") {
            Some(v) => Ok(Framing::Length(
                v.parse().with_context(|| format!("Content-Length {v:?}"))?,
            )),
            None => Ok(Framing::UntilClose),
        }
    }

    fn status(&self) -> Result<u16> {
        let code = self.first.split_whitespace().nth(1).unwrap_or("");
        code.parse()
            .with_context(|| format!("status line {:?}", self.first))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// Read a line ending in `\n` (kept) onto `out`; `Ok(false)` at a clean end of stream.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, out: &mut Vec<u8>) -> Result<bool> {
    let start = out.len();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            ensure!(out.len() == start, "stream ended inside a line");
            return Ok(false);
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        out.extend_from_slice(&buf[..take]);
        r.consume(take);
        ensure!(
            out.len() - start <= MAX_HEAD,
            "HTTP line over {MAX_HEAD} bytes"
        );
        if done {
            return Ok(true);
        }
    }
}

/// Read a head up to its empty line; `None` when the stream ends before any byte of it.
async fn read_head<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        if !read_line(r, &mut head).await? {
            ensure!(head.is_empty(), "stream ended inside an HTTP head");
            return Ok(None);
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            if before == 0 {
                // Stray empty lines before a request are allowed (RFC 9112 2.2).
                head.clear();
                continue;
            }
            return Ok(Some(head));
        }
        ensure!(head.len() <= MAX_HEAD, "HTTP head over {MAX_HEAD} bytes");
    }
}

/// Where a response body goes: the rate, the stall threshold, the counters.
struct Out<'a> {
    shared: &'a Shared,
    /// A response body: under the rate, and counted.
    throttled: bool,
    stall_at: u64,
    sent: u64,
}

impl Out<'_> {
    /// Send `data`; `Ok(true)` when the reply stalled instead (what fits under the threshold
    /// was sent).
    async fn send<W: AsyncWrite + Unpin>(&mut self, w: &mut W, data: &[u8]) -> Result<bool> {
        let room = self.stall_at.saturating_sub(self.sent);
        let n = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        if n > 0 {
            if self.throttled {
                self.shared.bucket.take(n).await;
            }
            w.write_all(&data[..n]).await?;
            self.sent += n as u64;
            if self.throttled {
                self.shared
                    .body_bytes
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        if n < data.len() {
            w.flush().await?;
            self.shared.stalled.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }
}

/// Copy exactly `len` bytes (or to the end of the stream, with `None`); `Ok(true)` if stalled.
async fn copy_bytes<R, W>(r: &mut R, w: &mut W, len: Option<u64>, out: &mut Out<'_>) -> Result<bool>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut left = len.unwrap_or(u64::MAX);
    while left > 0 {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            ensure!(
                len.is_none(),
                "stream ended {left} bytes before the body's end"
            );
            break;
        }
        let n = buf
            .len()
            .min(PIECE)
            .min(usize::try_from(left).unwrap_or(PIECE));
        let piece = buf[..n].to_vec();
        r.consume(n);
        if out.send(w, &piece).await? {
            return Ok(true);
        }
        left -= n as u64;
    }
    Ok(false)
}

/// Forward one body framed as `framing`; `Ok(true)` if it stalled.
async fn forward_body<R, W>(
    r: &mut R,
    w: &mut W,
    framing: Framing,
    out: &mut Out<'_>,
) -> Result<bool>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match framing {
        Framing::Length(n) => copy_bytes(r, w, Some(n), out).await,
        Framing::UntilClose => copy_bytes(r, w, None, out).await,
        Framing::Chunked => loop {
            let mut line = Vec::new();
            ensure!(
                read_line(r, &mut line).await?,
                "stream ended in a chunked body"
            );
            let text = std::str::from_utf8(&line).context("chunk size line")?;
            let hex = text.split(';').next().unwrap_or("").trim();
            let size =
                u64::from_str_radix(hex, 16).with_context(|| format!("chunk size {hex:?}"))?;
            if out.send(w, &line).await? {
                return Ok(true);
            }
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    let mut t = Vec::new();
                    ensure!(read_line(r, &mut t).await?, "stream ended in trailers");
                    if out.send(w, &t).await? {
                        return Ok(true);
                    }
                    if t == b"\r\n" || t == b"\n" {
                        return Ok(false);
                    }
                }
            }
            // The chunk's data and its CRLF.
            if copy_bytes(r, w, Some(size + 2), out).await? {
                return Ok(true);
            }
        },
    }
}

/// Serve one client connection: its requests in turn, each over a fresh upstream connection,
/// so that an upstream that closed an idle keep-alive connection never fails a request.
async fn connection(client: TcpStream, shared: &Shared) -> Result<()> {
    client.set_nodelay(true)?;
    let mut client = BufReader::new(client);
    // A TLS handshake (a client trying HTTPS first, as crishim does on loopback) is refused at
    // once, as a plain-HTTP registry refuses it, rather than left waiting for a head.
    if client.fill_buf().await?.first() == Some(&0x16) {
        return Ok(());
    }
    loop {
        let Some(raw) = read_head(&mut client).await? else {
            return Ok(());
        };
        let req = Head::parse(&raw)?;
        shared.requests.fetch_add(1, Ordering::Relaxed);
        let ranged = req.get("range").is_some();
        if ranged {
            shared.ranged_requests.fetch_add(1, Ordering::Relaxed);
        }
        let mut strip = vec!["expect"];
        if ranged && shared.ignore_range.load(Ordering::Relaxed) {
            strip.extend(["range", "if-range"]);
        }
        let expect_continue = req.has_token("expect", "100-continue");
        let is_head = req.first.starts_with("HEAD ");
        let req_framing = match req.framing()? {
            // A request without a length has no body (RFC 9112 6.3).
            Framing::UntilClose => Framing::Length(0),
            f => f,
        };

        let upstream = TcpStream::connect(&shared.upstream)
            .await
            .with_context(|| format!("connecting to {}", shared.upstream))?;
        upstream.set_nodelay(true)?;
        let mut upstream = BufReader::new(upstream);
        upstream.write_all(&req.render_without(&strip)).await?;
        if expect_continue {
            // The upstream never sees the Expect; the client hears the go-ahead from us.
            client.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
            client.flush().await?;
        }
        let mut plain = Out {
            shared,
            throttled: false,
            stall_at: NO_STALL,
            sent: 0,
        };
        forward_body(&mut client, upstream.get_mut(), req_framing, &mut plain).await?;
        upstream.flush().await?;

        // Interim 1xx replies go straight through; then the final one.
        let (raw, resp) = loop {
            let raw = read_head(&mut upstream)
                .await?
                .context("upstream closed before replying")?;
            let resp = Head::parse(&raw)?;
            let status = resp.status()?;
            if status == 101 {
                bail!("upstream switched protocols, which the proxy does not forward");
            }
            if (100..200).contains(&status) {
                client.write_all(&raw).await?;
                continue;
            }
            break (raw, resp);
        };
        let status = resp.status()?;
        let framing = if is_head || status == 204 || status == 304 {
            Framing::Length(0)
        } else {
            resp.framing()?
        };
        client.write_all(&raw).await?;
        let mut out = Out {
            shared,
            throttled: true,
            stall_at: if ranged {
                shared.stall_after.load(Ordering::Relaxed)
            } else {
                NO_STALL
            },
            sent: 0,
        };
        let stalled = forward_body(&mut upstream, client.get_mut(), framing, &mut out).await?;
        client.flush().await?;
        if stalled {
            tracing::debug!(request = %req.first, bytes = out.sent, "throttling proxy stalled a reply");
            // Hold both connections open, silent, until the proxy is dropped.
            std::future::pending::<()>().await;
        }
        let close = framing == Framing::UntilClose
            || req.has_token("connection", "close")
            || resp.has_token("connection", "close")
            || resp.first.starts_with("HTTP/1.0");
        if close {
            client.get_mut().shutdown().await.ok();
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn forward(input: &[u8], framing: Framing, stall_at: u64) -> (Vec<u8>, bool, Vec<u8>) {
        let shared = Shared {
            upstream: String::new(),
            bucket: Bucket::new(0),
            ignore_range: AtomicBool::new(false),
            stall_after: AtomicU64::new(NO_STALL),
            requests: AtomicU64::new(0),
            ranged_requests: AtomicU64::new(0),
            body_bytes: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
        };
        let mut out = Out {
            shared: &shared,
            throttled: true,
            stall_at,
            sent: 0,
        };
        let mut r = BufReader::new(input);
        let mut w = Vec::new();
        let stalled = forward_body(&mut r, &mut w, framing, &mut out)
            .await
            .unwrap();
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut r, &mut rest)
            .await
            .unwrap();
        (w, stalled, rest)
    }

    #[tokio::test]
    async fn a_chunked_body_is_forwarded_to_its_end_and_no_further() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\n";
        let mut input = body.to_vec();
        input.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let (w, stalled, rest) = forward(&input, Framing::Chunked, NO_STALL).await;
        assert_eq!(w, body);
        assert!(!stalled);
        assert_eq!(rest, b"HTTP/1.1 200 OK\r\n");
    }

    #[tokio::test]
    async fn a_length_body_stops_at_its_length_and_a_stall_at_its_threshold() {
        let (w, stalled, rest) = forward(b"0123456789next", Framing::Length(10), NO_STALL).await;
        assert_eq!(
            (w.as_slice(), stalled, rest.as_slice()),
            (&b"0123456789"[..], false, &b"next"[..])
        );
        let (w, stalled, _) = forward(b"0123456789", Framing::Length(10), 4).await;
        assert_eq!((w.as_slice(), stalled), (&b"0123"[..], true));
        let (w, stalled, _) = forward(b"0123456789", Framing::Length(10), 10).await;
        assert_eq!((w.as_slice(), stalled), (&b"0123456789"[..], false));
    }

    #[test]
    fn range_headers_are_stripped_and_the_rest_kept() {
        let h = Head::parse(
            b"GET /v2/a/blobs/sha256:x HTTP/1.1\r\nHost: h\r\nrange: bytes=0-9\r\nIf-Range: x\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h.get("Range"), Some("bytes=0-9"));
        assert_eq!(
            h.render_without(&["range", "if-range"]),
            b"GET /v2/a/blobs/sha256:x HTTP/1.1\r\nHost: h\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn the_bucket_holds_the_rate_across_takers() {
        let b = Arc::new(Bucket::new(1 << 20));
        let t0 = Instant::now();
        let mut set = JoinSet::new();
        for _ in 0..4 {
            let b = b.clone();
            set.spawn(async move {
                for _ in 0..(256 << 10) / PIECE {
                    b.take(PIECE).await;
                }
            });
        }
        while set.join_next().await.is_some() {}
        // 1 MiB at 1 MiB/s, less the initial burst of a tenth of a second.
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(850), "{took:?}");
    }
}
