//! Interactive stdio on a shim connection: `ExecStream` runs a process whose stdio is relayed as
//! frames; `Attach` relays a running container's output (alongside its log) and feeds its stdin.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use crishim_proto::shim::{frames, ErrorKind, Response, Status};
use nix::fcntl::OFlag;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::container::{self, ExecIo, Shared, Spawned};
use crate::logs::{FdReader, FdWriter, ATTACH_QUEUE};

/// How long output may still drain after the process exited (a background child can hold a pipe
/// open for ever).
const DRAIN: Duration = Duration::from_secs(2);
/// After an attached container exited, how long its output may pause before the session ends.
const LAST_OUTPUT: Duration = Duration::from_millis(100);

pub(crate) async fn answer(w: &mut OwnedWriteHalf, r: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    w.write_all(&line).await
}

/// One frame from the daemon; None at the end of the connection.
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; frames::HEADER];
    r.read_exact(&mut h).await.ok()?;
    let (kind, len) = frames::decode_header(h);
    if len > frames::MAX_PAYLOAD {
        return None;
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.ok()?;
    Some((kind, payload))
}

fn set_winsize(fd: i32, payload: &[u8]) {
    if let [w0, w1, h0, h1] = payload {
        let ws = libc::winsize {
            ws_col: u16::from_be_bytes([*w0, *w1]),
            ws_row: u16::from_be_bytes([*h0, *h1]),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize we own; a non-pty fd just fails.
        unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) };
    }
}

fn dup(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    fd.try_clone()
}

/// Apply the daemon's frames until it hangs up (false) or detaches (true): stdin to `input`,
/// sizes to the pty `resize`; `stdin_eof` decides what the end of the caller's stdin means.
async fn inbound(
    r: &mut BufReader<OwnedReadHalf>,
    mut input: Option<FdWriter>,
    resize: Option<OwnedFd>,
    mut stdin_eof: impl FnMut(&mut Option<FdWriter>),
) -> bool {
    while let Some((kind, payload)) = read_frame(r).await {
        match kind {
            frames::DETACH => return true,
            frames::STDIN => {
                if let Some(i) = &input {
                    if i.write_all(&payload).await.is_err() {
                        input = None;
                    }
                }
            }
            frames::STDIN_EOF => stdin_eof(&mut input),
            frames::RESIZE => {
                if let Some(fd) = &resize {
                    set_winsize(fd.as_raw_fd(), &payload);
                }
            }
            _ => {}
        }
    }
    false
}

/// Copy an output into frames until it closes.
async fn pump(fd: OwnedFd, kind: u8, tx: mpsc::Sender<Vec<u8>>) {
    let Ok(mut r) = FdReader::new(fd) else { return };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(frames::encode(kind, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Write frames to the daemon until the EXIT frame went out. Once the daemon is gone (a detached
/// caller, or one about to be killed for leaving) output is drained and dropped: the process never
/// blocks on a full pipe or pty, and its pty stays open for as long as it runs.
async fn write_frames(mut w: OwnedWriteHalf, mut rx: mpsc::Receiver<Vec<u8>>) {
    let mut open = true;
    while let Some(f) = rx.recv().await {
        if f.first() == Some(&frames::EXIT) {
            let _ = w.write_all(&f).await;
            break;
        }
        open = open && w.write_all(&f).await.is_ok();
    }
    let _ = w.shutdown().await;
}

pub async fn exec(
    shim: &Shared,
    id: &str,
    args: Vec<String>,
    tty: bool,
    stdin: bool,
    mut r: BufReader<OwnedReadHalf>,
    mut w: OwnedWriteHalf,
) {
    let mut outputs = Vec::new();
    let mut input = None;
    let io = if tty {
        ExecIo::Tty
    } else {
        let pipes = (|| -> nix::Result<_> {
            let out = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
            let err = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
            let inp = match stdin {
                true => Some(nix::unistd::pipe2(OFlag::O_CLOEXEC)?),
                false => None,
            };
            Ok((out, err, inp))
        })();
        let ((out_r, out_w), (err_r, err_w), inp) = match pipes {
            Ok(p) => p,
            Err(e) => {
                let r = Response::error(ErrorKind::Internal, format!("exec pipes: {e}"));
                let _ = answer(&mut w, &r).await;
                return;
            }
        };
        outputs = vec![(frames::STDOUT, out_r), (frames::STDERR, err_r)];
        let stdin = inp.map(|(r, w)| {
            input = Some(w);
            r
        });
        ExecIo::Pipes {
            stdin,
            stdout: out_w,
            stderr: err_w,
        }
    };
    let Spawned { pid, exited, pty } = match container::spawn_exec(shim, id, args, io) {
        Ok(s) => s,
        Err(r) => {
            let _ = answer(&mut w, &r).await;
            return;
        }
    };
    let mut resize_fd = None;
    if let Some(master) = pty {
        if stdin {
            input = dup(&master).ok();
        }
        resize_fd = dup(&master).ok();
        outputs.push((frames::STDOUT, master));
    }
    if answer(&mut w, &Response::Ok).await.is_err() {
        container::kill_exec(pid);
        return;
    }
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let writer = tokio::task::spawn_local(write_frames(w, rx));
    let pumps: Vec<_> = outputs
        .into_iter()
        .map(|(kind, fd)| tokio::task::spawn_local(pump(fd, kind, tx.clone())))
        .collect();
    let input = input.and_then(|fd| FdWriter::new(fd).ok());
    // With a tty, stdin and output are one pty: it stays open at the caller's EOF.
    let inbound = inbound(&mut r, input, resize_fd, |input| {
        if !tty {
            *input = None;
        }
    });
    tokio::select! {
        status = exited => {
            let code = status.ok().as_ref().and_then(container::exit_code).unwrap_or(-1);
            let _ = tokio::time::timeout(DRAIN, futures_join(pumps)).await;
            let _ = tx.send(frames::encode(frames::EXIT, &code.to_be_bytes())).await;
        }
        detach = inbound => {
            if detach {
                // The process runs on; the writer drains its output until it exits, and the
                // reaper collects it.
                return;
            }
            // The caller went away: the process goes too.
            container::kill_exec(pid);
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}

pub async fn attach(
    shim: &Shared,
    id: &str,
    stdin: bool,
    close_stdin: bool,
    mut r: BufReader<OwnedReadHalf>,
    mut w: OwnedWriteHalf,
) {
    let (out_tx, mut out_rx) = mpsc::channel(ATTACH_QUEUE);
    let setup = {
        let s = shim.borrow();
        match s.containers.get(id) {
            None => Err(Response::error(
                ErrorKind::NotFound,
                format!("container {id:?} not found in this pod's shim"),
            )),
            Some(c) if c.state.status != Status::Running => Err(Response::error(
                ErrorKind::FailedPrecondition,
                format!("container {id} is not running"),
            )),
            Some(c) => match (&c._stdin, stdin) {
                (None, true) => Err(Response::error(
                    ErrorKind::InvalidArgument,
                    format!("container {id} was not created with stdin or a tty"),
                )),
                (fd, _) => {
                    c.log.attach(out_tx);
                    Ok(fd.as_ref().and_then(|f| dup(f).ok()))
                }
            },
        }
    };
    let fd = match setup {
        Ok(fd) => fd,
        Err(resp) => {
            let _ = answer(&mut w, &resp).await;
            return;
        }
    };
    if answer(&mut w, &Response::Ok).await.is_err() {
        return;
    }
    // Only a pty takes window sizes. A second descriptor of a stdin pipe would keep the pipe open
    // after `stdin_once` closed it, and the container would never read its EOF.
    let resize_fd = fd
        .as_ref()
        .filter(|f| nix::unistd::isatty(f.as_raw_fd()).unwrap_or(false))
        .and_then(|f| dup(f).ok());
    let input = if stdin {
        fd.and_then(|f| FdWriter::new(f).ok())
    } else {
        None
    };
    let exited = shim.borrow().exited.clone();
    let running = |shim: &Shared| {
        shim.borrow()
            .containers
            .get(id)
            .map(|c| (c.state.status == Status::Running, c.state.exit_code))
    };
    let frame_of = |(stream, data): (&str, Vec<u8>)| {
        let kind = if stream == "stderr" {
            frames::STDERR
        } else {
            frames::STDOUT
        };
        frames::encode(kind, &data)
    };
    let output = async {
        loop {
            // Registered before the state is read, so an exit between the two still wakes us.
            let notified = exited.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if running(shim).is_none_or(|(run, _)| !run) {
                break;
            }
            tokio::select! {
                chunk = out_rx.recv() => match chunk {
                    Some(chunk) => {
                        if w.write_all(&frame_of(chunk)).await.is_err() {
                            return;
                        }
                    }
                    None => break,
                },
                _ = &mut notified => {}
            }
        }
        // The container exited: what it wrote last (its pipes may still hold output the log
        // copier has not read), for as long as it keeps coming and at most DRAIN; then its exit
        // code.
        let until = tokio::time::Instant::now() + DRAIN;
        while let Ok(Some(chunk)) = tokio::time::timeout_at(
            until.min(tokio::time::Instant::now() + LAST_OUTPUT),
            out_rx.recv(),
        )
        .await
        {
            let _ = w.write_all(&frame_of(chunk)).await;
        }
        let code = running(shim).map_or(-1, |(_, code)| code);
        let _ = w
            .write_all(&frames::encode(frames::EXIT, &code.to_be_bytes()))
            .await;
        let _ = w.shutdown().await;
    };
    let inbound = async {
        inbound(&mut r, input, resize_fd, |input| {
            *input = None;
            if close_stdin {
                if let Some(c) = shim.borrow_mut().containers.get_mut(id) {
                    c._stdin = None;
                }
            }
        })
        .await;
        // Detached: the container runs on.
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = output => {}
        _ = inbound => {}
    }
}
