//! Network set-up shared by the daemon (which makes a pod's network namespace) and the shim
//! (whose infra process makes one when the daemon did not).

/// `ip link set lo up` in the calling thread's network namespace, with two ioctls.
/// Async-signal-safe (socket, ioctl, close only): the infra's clone child calls it.
pub fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq we own; the descriptor is closed here.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut r = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if r == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            r = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if r == 0 {
            Ok(())
        } else {
            Err(err)
        }
    }
}
