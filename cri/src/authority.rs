//! Accept gRPC clients that send a unix socket path as the HTTP/2 `:authority`.
//!
//! crictl up to 1.26, kubelets of that age and grpc-java all dial a unix socket with the socket path
//! as `:authority` (`/run/crishim/crishim.sock`). hyper's `h2` rejects that as a malformed URI and resets
//! the stream with PROTOCOL_ERROR (hyperium/h2#487), where Go servers such as containerd accept it.
//! This wrapper sits between the socket and `h2`: it decodes each client header block, replaces an
//! authority that is not a valid URI authority with `localhost`, and re-encodes the block. Every
//! block is re-encoded (not only bad ones) so `h2`'s HPACK table always mirrors our encoder's.
//! Server-to-client bytes pass through untouched.

use std::io;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may set; re-encoded blocks are split to fit it.
const MAX_FRAME: usize = 16_384;

enum Phase {
    Preface,
    Frames,
    /// Not HTTP/2 as we understand it: hand bytes over unchanged and let `h2` judge.
    Passthrough,
}

/// A header block being collected across HEADERS + CONTINUATION frames.
struct Pending {
    stream: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

pub struct AuthorityFix<S> {
    inner: S,
    raw: BytesMut,
    out: BytesMut,
    phase: Phase,
    pending: Option<Pending>,
    decoder: fluke_hpack::Decoder<'static>,
    encoder: fluke_hpack::Encoder<'static>,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        AuthorityFix {
            inner,
            raw: BytesMut::with_capacity(16 * 1024),
            out: BytesMut::with_capacity(16 * 1024),
            phase: Phase::Preface,
            pending: None,
            decoder: fluke_hpack::Decoder::new(),
            encoder: fluke_hpack::Encoder::new(),
            eof: false,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Move whatever complete units `raw` holds into `out`, rewritten.
    fn process(&mut self) {
        loop {
            match self.phase {
                Phase::Passthrough => {
                    let all = self.raw.split();
                    self.out.extend_from_slice(&all);
                    return;
                }
                Phase::Preface => {
                    let n = self.raw.len().min(PREFACE.len());
                    if self.raw[..n] != PREFACE[..n] {
                        self.phase = Phase::Passthrough;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return;
                    }
                    let p = self.raw.split_to(PREFACE.len());
                    self.out.extend_from_slice(&p);
                    self.phase = Phase::Frames;
                }
                Phase::Frames => {
                    if self.raw.len() < FRAME_HEADER {
                        return;
                    }
                    let len =
                        u32::from_be_bytes([0, self.raw[0], self.raw[1], self.raw[2]]) as usize;
                    if self.raw.len() < FRAME_HEADER + len {
                        return;
                    }
                    let frame = self.raw.split_to(FRAME_HEADER + len);
                    if !self.frame(&frame) {
                        // Malformed: give h2 the original bytes and stop interpreting.
                        self.out.extend_from_slice(&frame);
                        self.phase = Phase::Passthrough;
                    }
                }
            }
        }
    }

    /// Handle one frame; false if it cannot be interpreted.
    fn frame(&mut self, frame: &[u8]) -> bool {
        let (kind, flags) = (frame[3], frame[4]);
        let stream: [u8; 4] = [frame[5], frame[6], frame[7], frame[8]];
        let mut payload = &frame[FRAME_HEADER..];
        match kind {
            HEADERS if self.pending.is_none() => {
                if flags & PADDED != 0 {
                    let Some((&pad, rest)) = payload.split_first() else {
                        return false;
                    };
                    if pad as usize > rest.len() {
                        return false;
                    }
                    payload = &rest[..rest.len() - pad as usize];
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    if payload.len() < 5 {
                        return false;
                    }
                    priority = Some([payload[0], payload[1], payload[2], payload[3], payload[4]]);
                    payload = &payload[5..];
                }
                self.pending = Some(Pending {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    block: payload.to_vec(),
                });
            }
            CONTINUATION => match &mut self.pending {
                Some(p) if p.stream == stream => p.block.extend_from_slice(payload),
                _ => return false,
            },
            _ if self.pending.is_some() => return false,
            _ => {
                self.out.extend_from_slice(frame);
                return true;
            }
        }
        if flags & END_HEADERS != 0 {
            let p = self.pending.take().expect("pending header block");
            return self.emit(p);
        }
        true
    }

    fn emit(&mut self, p: Pending) -> bool {
        let Ok(mut headers) = self.decoder.decode(&p.block) else {
            return false;
        };
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority"
                && http::uri::Authority::from_str(&String::from_utf8_lossy(value)).is_err()
            {
                tracing::trace!(authority = %String::from_utf8_lossy(value), "rewriting :authority to localhost");
                *value = b"localhost".to_vec();
            }
        }
        let mut block = p.priority.map(|b| b.to_vec()).unwrap_or_default();
        block.extend(
            self.encoder
                .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))),
        );
        let mut chunks = block.chunks(MAX_FRAME).peekable();
        let mut first = true;
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let (kind, mut flags) = if first {
                (HEADERS, 0)
            } else {
                (CONTINUATION, 0)
            };
            if first && p.end_stream {
                flags |= END_STREAM;
            }
            if first && p.priority.is_some() {
                flags |= PRIORITY;
            }
            if last {
                flags |= END_HEADERS;
            }
            let len = (chunk.len() as u32).to_be_bytes();
            self.out.put_slice(&[len[1], len[2], len[3], kind, flags]);
            self.out.put_slice(&p.stream);
            self.out.put_slice(chunk);
            first = false;
        }
        if block.is_empty() {
            // An empty header block is still one HEADERS frame.
            let flags = END_HEADERS | if p.end_stream { END_STREAM } else { 0 };
            self.out.put_slice(&[0, 0, 0, HEADERS, flags]);
            self.out.put_slice(&p.stream);
        }
        true
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.out.is_empty() {
                let n = buf.remaining().min(this.out.len());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // Whatever could not be parsed goes to h2 as is; then EOF.
                let rest = this.raw.split();
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.out.extend_from_slice(&rest);
                continue;
            }
            let mut tmp = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut tmp);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.raw.extend_from_slice(rb.filled());
                        this.process();
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for AuthorityFix<tokio::net::UnixStream> {
    type ConnectInfo = <tokio::net::UnixStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn headers(authority: &str, path: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":authority".to_vec(), authority.as_bytes().to_vec()),
            (b":path".to_vec(), path.as_bytes().to_vec()),
        ]
    }

    /// Parse the rewritten stream back into (kind, flags, payload) frames.
    fn frames(mut b: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
        assert!(b.starts_with(PREFACE));
        b = &b[PREFACE.len()..];
        let mut out = Vec::new();
        while !b.is_empty() {
            let len = u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize;
            out.push((b[3], b[4], b[9..9 + len].to_vec()));
            b = &b[9 + len..];
        }
        out
    }

    async fn rewrite(input: Vec<u8>) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut client, &input)
            .await
            .unwrap();
        drop(client);
        let mut out = Vec::new();
        AuthorityFix::new(server)
            .read_to_end(&mut out)
            .await
            .unwrap();
        out
    }

    #[tokio::test]
    async fn socket_path_authority_becomes_localhost_and_tables_stay_in_sync() {
        let mut enc = fluke_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS passes through
        for (i, path) in ["/a", "/b"].iter().enumerate() {
            let h = headers("/run/crishim/crishim.sock", path);
            let block = enc.encode(h.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
            // Split the second block over HEADERS + CONTINUATION, with padding on the first.
            let stream = 1 + 2 * i as u32;
            if i == 0 {
                let mut padded = vec![3u8];
                padded.extend_from_slice(&block);
                padded.extend_from_slice(&[0, 0, 0]);
                input.extend(frame(HEADERS, END_HEADERS | PADDED, stream, &padded));
            } else {
                input.extend(frame(HEADERS, END_STREAM, stream, &block[..3]));
                input.extend(frame(CONTINUATION, END_HEADERS, stream, &block[3..]));
            }
            input.extend(frame(0x0, END_STREAM, stream, b"data"));
        }
        let out = rewrite(input).await;
        let fr = frames(&out);
        let kinds: Vec<u8> = fr.iter().map(|f| f.0).collect();
        assert_eq!(kinds, [0x4, HEADERS, 0x0, HEADERS, 0x0]);
        assert_eq!(fr[3].1 & END_STREAM, END_STREAM, "END_STREAM kept");
        let mut dec = fluke_hpack::Decoder::new();
        for (idx, path) in [(1, "/a"), (3, "/b")] {
            let got = dec.decode(&fr[idx].2).unwrap();
            assert_eq!(got, headers("localhost", path));
        }
        assert_eq!(fr[4].2, b"data");
    }

    #[tokio::test]
    async fn valid_authorities_and_non_http2_bytes_are_untouched() {
        let mut enc = fluke_hpack::Encoder::new();
        let h = headers("localhost:1234", "/x");
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &enc.encode(h.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))),
        ));
        let out = rewrite(input).await;
        let mut dec = fluke_hpack::Decoder::new();
        assert_eq!(dec.decode(&frames(&out)[0].2).unwrap(), h);
        assert_eq!(
            rewrite(b"GET / HTTP/1.1\r\n\r\n".to_vec()).await,
            b"GET / HTTP/1.1\r\n\r\n"
        );
    }
}
