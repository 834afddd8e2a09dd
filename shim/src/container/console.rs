//! The console socket over which the runtime sends a new pty's master.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crishim_proto::shim::paths;

use crate::oci_runtime::console_address;

/// A console socket, bound in the shim's directory, over which the runtime sends a new pty's
/// master. Its file goes when it is dropped.
pub(super) struct Console {
    listener: std::os::unix::net::UnixListener,
    pub(super) path: PathBuf,
    /// An address short enough for a socket, whatever the directory's path (see
    /// [`console_address`]); valid while `_dir` is open.
    pub(super) address: PathBuf,
    _dir: OwnedFd,
}

impl Console {
    pub(super) fn bind(dir: &Path, name: &str) -> std::io::Result<Self> {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        // Bound through our directory's descriptor, as the full path may be too long for a
        // socket address.
        let (dir_fd, short) = paths::short_socket_path(dir, name)?;
        let listener = std::os::unix::net::UnixListener::bind(short)?;
        Ok(Console {
            listener,
            path,
            address: console_address(&dir_fd, name),
            _dir: dir_fd,
        })
    }

    pub(super) fn receive(&self) -> Result<OwnedFd, String> {
        receive_pty(&self.listener)
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Receive the pty master that the container's init sends over the console socket.
fn receive_pty(listener: &std::os::unix::net::UnixListener) -> Result<OwnedFd, String> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(format!("accepting the console connection: {e}")),
        }
    };
    conn.set_nonblocking(false).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut name = [0u8; 64];
    let mut iov = [std::io::IoSliceMut::new(&mut name)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| format!("receiving the pty: {e}"))?;
    for cmsg in msg.cmsgs().map_err(|e| e.to_string())? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel installed this descriptor for us.
                return Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            }
        }
    }
    Err("the console message carried no descriptor".into())
}
