//! libcgroups (youki 0.7) opens a D-Bus connection to systemd for each cgroup manager of the
//! systemd driver and never closes it (its socket is held in a `ManuallyDrop`). In a shim that
//! lives as long as its pod, every update, kill and delete would leak one authenticated root
//! connection, until the shim runs out of descriptors or dbus-daemon refuses root more of them.
//! The shim is single-threaded, so what a synchronous call leaves open is the call's own.

use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::socket::{getpeername, UnixAddr};

/// Where libcgroups connects: the system bus (or `DBUS_SYSTEM_BUS_ADDRESS`), else systemd's own.
fn bus_paths() -> Vec<PathBuf> {
    let mut paths = vec![
        PathBuf::from("/run/dbus/system_bus_socket"),
        PathBuf::from("/var/run/dbus/system_bus_socket"),
        PathBuf::from("/run/systemd/private"),
    ];
    if let Ok(addr) = std::env::var("DBUS_SYSTEM_BUS_ADDRESS") {
        paths.extend(
            addr.split(';')
                .filter_map(|a| a.strip_prefix("unix:path="))
                .map(|p| PathBuf::from(p.split(',').next().unwrap_or(p))),
        );
    }
    paths
}

/// The descriptors open now, without the one used to list them (its number is free again after).
fn open_fds() -> BTreeSet<RawFd> {
    let Ok(mut dir) = nix::dir::Dir::open(
        "/proc/self/fd",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) else {
        return BTreeSet::new();
    };
    let own = dir.as_raw_fd();
    dir.iter()
        .flatten()
        .filter_map(|e| e.file_name().to_str().ok()?.parse().ok())
        .filter(|fd| *fd != own)
        .collect()
}

/// The path of the unix socket `fd` is connected to, if any.
fn peer_path(fd: RawFd) -> Option<PathBuf> {
    let addr: UnixAddr = getpeername(fd).ok()?;
    addr.path().map(Path::to_path_buf)
}

/// Run `f` (a libcontainer or libcgroups call), then close the connections to systemd's bus that
/// it opened and left behind.
pub fn closing_leaked_connections<T>(f: impl FnOnce() -> T) -> T {
    let before = open_fds();
    let result = f();
    let new: Vec<RawFd> = open_fds().difference(&before).copied().collect();
    if !new.is_empty() {
        let buses = bus_paths();
        for fd in new {
            if peer_path(fd).is_some_and(|p| buses.contains(&p)) {
                // No one owns it: libcgroups forgot it (see the module's comment).
                let _ = nix::unistd::close(fd);
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use std::os::fd::IntoRawFd;
    use std::os::unix::net::{UnixListener, UnixStream};

    use super::*;

    #[test]
    fn only_connections_to_the_bus_are_closed() {
        let dir = tempfile::tempdir().unwrap();
        let bus = dir.path().join("bus");
        let other = dir.path().join("other");
        let _bus_listener = UnixListener::bind(&bus).unwrap();
        let _other_listener = UnixListener::bind(&other).unwrap();
        std::env::set_var(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}", bus.display()),
        );
        // The socket an fd names (other tests' threads may reuse a closed fd's number at once).
        let socket = |fd: i32| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
        let mut leaked_socket = None;
        let (leaked, kept) = closing_leaked_connections(|| {
            // Forgotten, as libcgroups does.
            let leaked = UnixStream::connect(&bus).unwrap().into_raw_fd();
            leaked_socket = socket(leaked);
            let kept = UnixStream::connect(&other).unwrap().into_raw_fd();
            (leaked, kept)
        });
        let is_open = |fd| nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_ok();
        assert!(leaked_socket.is_some());
        assert_ne!(
            socket(leaked),
            leaked_socket,
            "the bus connection was left open"
        );
        assert!(is_open(kept), "another socket was closed");
        let _ = nix::unistd::close(kept);
    }
}
