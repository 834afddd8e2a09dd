//! The terminal of `crishim bundle run` with `process.terminal`: the container's pty master is
//! relayed to the caller's stdio, the caller's terminal is put in raw mode (so keys, ^C included,
//! reach the container's line discipline untouched), and its window size follows the caller's.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::stat::SFlag;
use nix::sys::termios::{self, SetArg, Termios};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinHandle;

/// How long output still buffered in the pty may take to reach the caller after the container ended.
const DRAIN: Duration = Duration::from_secs(2);

/// One end of the relay. `Poll` for what epoll can watch (ttys, pipes, sockets); `Plain` for
/// regular files and devices like /dev/null, whose reads and writes never wait.
enum Stream {
    Poll(AsyncFd<OwnedFd>),
    Plain(OwnedFd),
}

impl Stream {
    /// The caller's descriptor `fd`, opened for non-blocking use without touching the caller's
    /// own file description where possible: the shell shares it, and a terminal left
    /// non-blocking breaks it. `restore` collects flags to put back when that was not possible.
    fn open(fd: RawFd, write: bool, restore: &mut Vec<(RawFd, OFlag)>) -> io::Result<Stream> {
        let kind = nix::sys::stat::fstat(fd)?.st_mode & SFlag::S_IFMT.bits();
        let plain = |fd: RawFd| -> io::Result<Stream> { Ok(Stream::Plain(dup(fd)?)) };
        // A new description of a regular file would write at offset 0, not where the caller is.
        if kind == SFlag::S_IFREG.bits() || kind == SFlag::S_IFBLK.bits() {
            return plain(fd);
        }
        let mode = if write {
            OFlag::O_WRONLY
        } else {
            OFlag::O_RDONLY
        };
        let reopened = nix::fcntl::open(
            format!("/proc/self/fd/{fd}").as_str(),
            mode | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        );
        match reopened {
            // SAFETY: open returned a fresh descriptor that we now own, and `register` keeps it
            // open for as long as it is registered.
            Ok(raw) => match unsafe { AsyncFd::register(own(raw)) } {
                Ok(a) => Ok(Stream::Poll(a)),
                Err(_) => plain(fd),
            },
            // Sockets cannot be reopened: share the caller's description, and restore it later.
            Err(_) => {
                let flags = get_flags(fd)?;
                set_flags(fd, flags | OFlag::O_NONBLOCK)?;
                // SAFETY: the registered descriptor is owned by the `AsyncFd`, which keeps it open.
                match unsafe { AsyncFd::register(dup(fd)?) } {
                    Ok(a) => {
                        restore.push((fd, flags));
                        Ok(Stream::Poll(a))
                    }
                    Err(_) => {
                        set_flags(fd, flags)?;
                        plain(fd)
                    }
                }
            }
        }
    }

    async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Poll(a) => read(a, buf).await,
            Stream::Plain(fd) => Ok(nix::unistd::read(fd.as_raw_fd(), buf)?),
        }
    }

    async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Poll(a) => write_all(a, buf).await,
            Stream::Plain(fd) => io::Write::write_all(&mut File::from(fd.try_clone()?), buf),
        }
    }
}

/// The relay between the caller and the container's pty; dropping it restores the caller's
/// terminal and descriptor flags.
pub struct Console {
    output: JoinHandle<()>,
    tasks: Vec<JoinHandle<()>>,
    raw: Option<(OwnedFd, Termios)>,
    restore: Vec<(RawFd, OFlag)>,
}

impl Console {
    /// Start relaying. Call before the container starts, so its first read of the window size
    /// already sees the caller's.
    pub fn attach(master: OwnedFd) -> Result<Console, String> {
        // Our own description of the master: non-blocking changes nobody else's.
        get_flags(master.as_raw_fd())
            .and_then(|f| set_flags(master.as_raw_fd(), f | OFlag::O_NONBLOCK))
            .map_err(|e| format!("pty master: {e}"))?;
        // SAFETY: the `AsyncFd` owns the master and keeps it open for as long as it is registered.
        let master = unsafe { AsyncFd::register(master) }
            .map_err(|e| format!("watching the pty master: {}", e.into_parts().1))?;
        let master = Rc::new(master);
        let mut restore = Vec::new();
        // The caller's terminal, if any: the source of the window size, and raw while we run.
        let terminal = (0..3).find(|&fd| nix::unistd::isatty(fd).unwrap_or(false));
        if let Some(fd) = terminal {
            copy_window_size(fd, master.get_ref().as_raw_fd());
        }
        let raw = match nix::unistd::isatty(0) {
            Ok(true) => Some(make_raw(0)?),
            _ => None,
        };
        let stdout = Stream::open(1, true, &mut restore).ok();
        let stdin = Stream::open(0, false, &mut restore).ok();
        let output = tokio::task::spawn_local(pump_output(master.clone(), stdout));
        let mut tasks = Vec::new();
        if let Some(stdin) = stdin {
            tasks.push(tokio::task::spawn_local(pump_input(stdin, master.clone())));
        }
        if let Some(fd) = terminal {
            let mut winch = signal(SignalKind::window_change())
                .map_err(|e| format!("watching SIGWINCH: {e}"))?;
            let m = master.clone();
            tasks.push(tokio::task::spawn_local(async move {
                while winch.recv().await.is_some() {
                    copy_window_size(fd, m.get_ref().as_raw_fd());
                }
            }));
        }
        Ok(Console {
            output,
            tasks,
            raw,
            restore,
        })
    }

    /// After the container is gone: let the output still in the pty reach the caller, then stop.
    pub async fn finish(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = tokio::time::timeout(DRAIN, &mut self.output).await;
        self.output.abort();
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if let Some((fd, saved)) = &self.raw {
            let _ = termios::tcsetattr(fd, SetArg::TCSANOW, saved);
        }
        for &(fd, flags) in &self.restore {
            let _ = set_flags(fd, flags);
        }
    }
}

/// Container output to the caller; ends when every holder of the pty's other side has closed it.
async fn pump_output(master: Rc<AsyncFd<OwnedFd>>, out: Option<Stream>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match read(&master, &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(out) = &out {
            // A caller that stopped reading does not stop the container: its output is dropped.
            let _ = out.write_all(&buf[..n]).await;
        }
    }
}

/// Caller input to the container, until the caller's stdin ends. The pty stays open then, as with
/// runc: closing it would hang the container up.
async fn pump_input(input: Stream, master: Rc<AsyncFd<OwnedFd>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        match input.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if write_all(&master, &buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Raw mode on the caller's terminal; returns what to restore.
fn make_raw(fd: RawFd) -> Result<(OwnedFd, Termios), String> {
    let fd = dup(fd).map_err(|e| format!("stdin: {e}"))?;
    let saved = termios::tcgetattr(&fd).map_err(|e| format!("reading the terminal mode: {e}"))?;
    let mut raw = saved.clone();
    termios::cfmakeraw(&mut raw);
    termios::tcsetattr(&fd, SetArg::TCSANOW, &raw)
        .map_err(|e| format!("setting the terminal to raw mode: {e}"))?;
    Ok((fd, saved))
}

/// The caller's window size onto the container's pty; the kernel then sends the container's
/// foreground process group SIGWINCH.
fn copy_window_size(from: RawFd, to: RawFd) {
    // SAFETY: TIOCGWINSZ/TIOCSWINSZ read and write one winsize struct that we own.
    unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(from, libc::TIOCGWINSZ, &mut size) == 0 {
            libc::ioctl(to, libc::TIOCSWINSZ, &size);
        }
    }
}

async fn read(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|f| Ok(nix::unistd::read(f.get_ref().as_raw_fd(), buf)?)) {
            // A pty master reads EIO once its other side is closed: its end of file.
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

async fn write_all(fd: &AsyncFd<OwnedFd>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let mut guard = fd.writable().await?;
        match guard.try_io(|f| Ok(nix::unistd::write(f.get_ref().as_fd(), buf)?)) {
            Ok(Ok(n)) => buf = &buf[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

fn get_flags(fd: RawFd) -> io::Result<OFlag> {
    Ok(OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?))
}

fn set_flags(fd: RawFd, flags: OFlag) -> io::Result<()> {
    Ok(fcntl(fd, FcntlArg::F_SETFL(flags)).map(drop)?)
}

fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: the caller's descriptor stays open for the duration of the borrow.
    unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
}

/// # Safety
/// `raw` must be an open descriptor owned by nobody else.
unsafe fn own(raw: RawFd) -> OwnedFd {
    <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw)
}
