//! CRI log files: every line as `<RFC3339Nano> <stdout|stderr> <P|F> <text>`. Lines longer than
//! 16 KiB are split into partial (`P`) records followed by a final (`F`) one, as containerd does.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

/// The kubelet's default maximum log line size.
pub const MAX_LINE: usize = 16 * 1024;

/// One container's log file, shared by its stdout and stderr copiers; reopenable after rotation.
pub struct LogSink {
    root: PathBuf,
    path: PathBuf,
    file: RefCell<Option<File>>,
    /// Attached clients: every chunk of output also goes to them.
    attached: RefCell<Vec<Subscriber>>,
}

/// An attached client's queue of (stream, bytes). A client that falls this far behind is
/// detached rather than slowing the container or its log down.
pub type Subscriber = tokio::sync::mpsc::Sender<(&'static str, Vec<u8>)>;
pub const ATTACH_QUEUE: usize = 256;

/// Open (creating it if needed) the log file `path`, which lies below `root` (its own directory
/// when `root` is empty), for appending.
///
/// `root` is the kubelet's pod log directory, made if missing as containerd makes it. Below it,
/// a container that can write the directory (a log shipper with a hostPath of `/var/log`) may
/// have planted symlinks, FIFOs or devices: no symlink is followed there, a missing directory is
/// made with `mkdirat` in its parent's descriptor, an existing file is looked at (`O_PATH`)
/// before it is opened, and only a regular file is written.
fn open(root: &Path, path: &Path) -> std::io::Result<File> {
    let root = if root.as_os_str().is_empty() || !path.starts_with(root) {
        path.parent().unwrap_or(Path::new("/"))
    } else {
        root
    };
    let rel = path.strip_prefix(root).map_err(std::io::Error::other)?;
    let Some(name) = rel.file_name() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("log path {} names no file", path.display()),
        ));
    };
    std::fs::create_dir_all(root)?;
    let mut dir = open_dir_at(None, root).map_err(refused)?;
    if let Some(parents) = rel.parent() {
        for c in parents.components() {
            let std::path::Component::Normal(c) = c else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "log path {} climbs out of {}",
                        path.display(),
                        root.display()
                    ),
                ));
            };
            dir = match open_dir_at(Some(&dir), Path::new(c)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    mkdirat(&dir, Path::new(c))?;
                    open_dir_at(Some(&dir), Path::new(c)).map_err(refused)?
                }
                other => other.map_err(refused)?,
            };
        }
    }
    open_log_file_at(&dir, Path::new(name))
        .map_err(refused)
        .map_err(|e| std::io::Error::new(e.kind(), format!("log file {}: {e}", path.display())))
}

/// A symlink where a directory or the file was wanted (`ELOOP`, `ENOTDIR`) is refused as bad
/// input, as a FIFO or device is: what lies there is the pod's doing, not the node's failure.
fn refused(e: std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR) => std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a symlink below the pod's log directory is never followed",
        ),
        _ => e,
    }
}

/// `openat(2)`; `dir` `None` is the working directory (`path` is then absolute).
fn openat(dir: Option<&OwnedFd>, path: &Path, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd as _;
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
    let fd = unsafe { libc::openat(dirfd, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A directory, never through a symlink in its last component.
fn open_dir_at(dir: Option<&OwnedFd>, path: &Path) -> std::io::Result<OwnedFd> {
    openat(
        dir,
        path,
        libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_RDONLY,
        0,
    )
}

/// A directory `name` (0755, as the kubelet makes them) in `dir`; one already there is fine.
fn mkdirat(dir: &OwnedFd, name: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(name.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

/// The regular file `name` in `dir` for appending: an existing one is first opened `O_PATH` and
/// checked (so a FIFO or a device is never opened for real), then reopened through its
/// descriptor; a missing one is created `O_EXCL`.
fn open_log_file_at(dir: &OwnedFd, name: &Path) -> std::io::Result<File> {
    let append = libc::O_WRONLY | libc::O_APPEND;
    // Two rounds: a file made between the look and the create is looked at again.
    for _ in 0..2 {
        match openat(Some(dir), name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
            Ok(pathfd) => {
                let st = crishim_sys::confined::fstat(pathfd.as_raw_fd())?;
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "not a regular file (a symlink, FIFO, device or directory is never written)",
                    ));
                }
                return crishim_sys::confined::reopen(&pathfd, &st, append).map(|(f, _)| f);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                match openat(
                    Some(dir),
                    name,
                    append | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                    0o640,
                ) {
                    Ok(fd) => return Ok(File::from(fd)),
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(
        "the log file kept changing while it was opened",
    ))
}

impl LogSink {
    /// An empty path means the CRI caller asked for no log file. Below `root`, no symlink in
    /// `path` is followed (see [`open`]).
    pub fn new(root: PathBuf, path: PathBuf) -> std::io::Result<Self> {
        let file = if path.as_os_str().is_empty() {
            None
        } else {
            Some(open(&root, &path)?)
        };
        Ok(LogSink {
            root,
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
        *self.file.borrow_mut() = Some(open(&self.root, &self.path)?);
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

    /// What a container that can write the pod's log directory plants there is never followed
    /// or opened: a symlink as the file or as its directory, a FIFO (which would block the
    /// single-threaded shim), a device.
    #[test]
    fn the_log_file_is_never_reached_through_a_symlink_fifo_or_device() {
        use std::os::unix::fs::{symlink, MetadataExt as _};
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("pod-logs");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("profile.sh"), "kept\n").unwrap();

        // A fresh file and its directory are made, 0640; reopened after a rotation.
        let sink = LogSink::new(root.clone(), root.join("ctr/0.log")).unwrap();
        sink.write("stdout", false, b"one");
        let md = std::fs::metadata(root.join("ctr/0.log")).unwrap();
        assert_eq!(md.mode() & 0o777, 0o640);
        std::fs::rename(root.join("ctr/0.log"), root.join("ctr/0.log.1")).unwrap();
        sink.reopen().unwrap();
        assert!(root.join("ctr/0.log").is_file());

        // The file a symlink out: refused, the target untouched.
        std::fs::remove_file(root.join("ctr/0.log")).unwrap();
        symlink(outside.join("profile.sh"), root.join("ctr/0.log")).unwrap();
        assert!(sink.reopen().is_err());
        assert!(LogSink::new(root.clone(), root.join("ctr/0.log")).is_err());
        // Its directory a symlink out.
        symlink(&outside, root.join("evil")).unwrap();
        assert!(LogSink::new(root.clone(), root.join("evil/profile.sh")).is_err());
        assert!(LogSink::new(root.clone(), root.join("evil/new/0.log")).is_err());
        assert!(!outside.join("new").exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("profile.sh")).unwrap(),
            "kept\n"
        );
        // A FIFO with no reader: refused at once rather than blocking.
        let fifo = root.join("ctr/fifo.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        assert!(LogSink::new(root.clone(), fifo).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // A device node.
        let dev = root.join("ctr/null.log");
        nix::sys::stat::mknod(
            &dev,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
        assert!(LogSink::new(root.clone(), dev).is_err());
        // Without a root, the file's own directory is the root.
        assert!(LogSink::new(PathBuf::new(), root.join("ctr/0.log.1")).is_ok());
        assert!(LogSink::new(PathBuf::new(), root.join("ctr/0.log")).is_err());
    }
}
