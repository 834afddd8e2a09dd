//! CRI log files: every line as `<RFC3339Nano> <stdout|stderr> <P|F> <text>`. Lines longer than
//! 16 KiB are split into partial (`P`) records followed by a final (`F`) one, as containerd does.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

/// The kubelet's default maximum log line size.
pub const MAX_LINE: usize = 16 * 1024;

/// One container's log file, shared by its stdout and stderr copiers; reopenable after rotation.
pub struct LogSink {
    path: PathBuf,
    file: RefCell<Option<File>>,
    /// Attached clients: every chunk of output also goes to them.
    attached: RefCell<Vec<Subscriber>>,
}

/// An attached client's queue of (stream, bytes). A client that falls this far behind is
/// detached rather than slowing the container or its log down.
pub type Subscriber = tokio::sync::mpsc::Sender<(&'static str, Vec<u8>)>;
pub const ATTACH_QUEUE: usize = 256;

fn open(path: &PathBuf) -> std::io::Result<File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl LogSink {
    /// An empty path means the CRI caller asked for no log file.
    pub fn new(path: PathBuf) -> std::io::Result<Self> {
        let file = if path.as_os_str().is_empty() {
            None
        } else {
            Some(open(&path)?)
        };
        Ok(LogSink {
            path,
            file: RefCell::new(file),
            attached: RefCell::new(Vec::new()),
        })
    }

    /// After the kubelet renamed the file away: start a new one at the same path.
    pub fn reopen(&self) -> std::io::Result<()> {
        if self.path.as_os_str().is_empty() {
            return Ok(());
        }
        *self.file.borrow_mut() = Some(open(&self.path)?);
        Ok(())
    }

    pub fn attach(&self, s: Subscriber) {
        self.attached.borrow_mut().push(s);
    }

    fn fan_out(&self, stream: &'static str, data: &[u8]) {
        self.attached
            .borrow_mut()
            .retain(|s| s.try_send((stream, data.to_vec())).is_ok());
    }

    fn write(&self, stream: &str, partial: bool, text: &[u8]) {
        let mut file = self.file.borrow_mut();
        let Some(f) = file.as_mut() else { return };
        let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let mut line = Vec::with_capacity(text.len() + 48);
        line.extend_from_slice(ts.as_bytes());
        line.push(b' ');
        line.extend_from_slice(stream.as_bytes());
        line.extend_from_slice(if partial { b" P " } else { b" F " });
        line.extend_from_slice(text);
        line.push(b'\n');
        // One write per record so stdout and stderr records never interleave within a line.
        let _ = f.write_all(&line);
    }
}

/// Split a stream into CRI records.
pub struct LineSplitter {
    line: Vec<u8>,
}

impl LineSplitter {
    pub fn new() -> Self {
        LineSplitter { line: Vec::new() }
    }

    /// Feed bytes; `emit(partial, text)` is called for each complete record.
    pub fn feed(&mut self, mut data: &[u8], emit: &mut impl FnMut(bool, &[u8])) {
        while !data.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.line.extend_from_slice(&data[..i]);
                    self.flush_long(emit);
                    emit(false, &self.line);
                    self.line.clear();
                    data = &data[i + 1..];
                }
                None => {
                    self.line.extend_from_slice(data);
                    data = &[];
                    self.flush_long(emit);
                }
            }
        }
    }

    /// Emit full 16 KiB partial records while more than that is buffered.
    fn flush_long(&mut self, emit: &mut impl FnMut(bool, &[u8])) {
        while self.line.len() > MAX_LINE {
            emit(true, &self.line[..MAX_LINE]);
            self.line.drain(..MAX_LINE);
        }
    }

    /// End of stream: a trailing unterminated line is still a record, tagged partial (`P`) as
    /// it has no newline; the kubelet's log reader prints it without one.
    pub fn finish(&mut self, emit: &mut impl FnMut(bool, &[u8])) {
        if !self.line.is_empty() {
            emit(true, &self.line);
            self.line.clear();
        }
    }
}

/// Non-blocking reads from a pipe or a pty master. A pty whose other side has closed reads EIO,
/// which is its end of file.
pub struct FdReader(AsyncFd<OwnedFd>);

impl FdReader {
    pub fn new(fd: OwnedFd) -> std::io::Result<Self> {
        let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))?;
        // SAFETY: the reader owns `fd` and keeps it open for as long as it is registered.
        Ok(FdReader(unsafe { AsyncFd::register(fd)? }))
    }
}

impl AsyncRead for FdReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = match self.0.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| {
                nix::unistd::read(fd.as_raw_fd(), unfilled).map_err(std::io::Error::from)
            }) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// Copy one of a container's outputs (a pipe, or its pty) into its log until it closes.
pub async fn copy(fd: OwnedFd, stream: &'static str, sink: std::rc::Rc<LogSink>) {
    let Ok(mut rx) = FdReader::new(fd) else {
        return;
    };
    let mut buf = vec![0u8; 8 * 1024];
    let mut splitter = LineSplitter::new();
    let emit_to = sink.clone();
    let mut emit = |partial: bool, text: &[u8]| emit_to.write(stream, partial, text);
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                sink.fan_out(stream, &buf[..n]);
                splitter.feed(&buf[..n], &mut emit)
            }
        }
    }
    splitter.finish(&mut emit);
}

/// Non-blocking writes to a pipe or a pty master.
pub struct FdWriter(AsyncFd<OwnedFd>);

impl FdWriter {
    pub fn new(fd: OwnedFd) -> std::io::Result<Self> {
        let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))?;
        // SAFETY: the writer owns `fd` and keeps it open for as long as it is registered.
        Ok(FdWriter(unsafe { AsyncFd::register(fd)? }))
    }

    pub async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.0.writable().await?;
            match guard
                .try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from))
            {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<(bool, Vec<u8>)> {
        let mut out = Vec::new();
        let mut s = LineSplitter::new();
        let mut emit = |p: bool, t: &[u8]| out.push((p, t.to_vec()));
        for c in chunks {
            s.feed(c, &mut emit);
        }
        s.finish(&mut emit);
        out
    }

    #[test]
    fn lines_across_chunks() {
        assert_eq!(
            split(&[b"hel", b"lo\nwor", b"ld\n\nend"]),
            vec![
                (false, b"hello".to_vec()),
                (false, b"world".to_vec()),
                (false, vec![]),
                (true, b"end".to_vec())
            ]
        );
    }

    #[test]
    fn long_lines_become_partial_records() {
        let long = vec![b'x'; MAX_LINE * 2 + 5];
        let mut input = long.clone();
        input.push(b'\n');
        let out = split(&[&input]);
        assert_eq!(out.len(), 3);
        assert_eq!((out[0].0, out[0].1.len()), (true, MAX_LINE));
        assert_eq!((out[1].0, out[1].1.len()), (true, MAX_LINE));
        assert_eq!((out[2].0, out[2].1.len()), (false, 5));
    }
}
