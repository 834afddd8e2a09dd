//! `/proc/self/mountinfo`, the fields crishim reads: each mount's point, file system type and
//! super options. Lines that do not parse are skipped.
//!
//! [`read_points_outside`] reads them without their options through `listmount(2)` and
//! `statmount(2)` (Linux 6.8) where the kernel has them, leaving out, unread, the mounts below
//! given mounts (every pod's, below the state directory, for each create's view): the kernel
//! formats every mount of the file for each read, and a node's overlay mounts carry long options
//! (three absolute paths, escaped character by character).

use std::path::PathBuf;

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Absolute, with the kernel's `\ooo` escapes decoded.
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// The super block's options (`rw,cpu,cpuacct` for a cgroup v1 hierarchy).
    pub super_options: String,
    /// In a peer group (`shared:N`): mounts made below it reach the group's peers and slaves.
    pub shared: bool,
}

/// The mounts of `mountinfo`'s text, in its order.
pub fn parse(mountinfo: &str) -> Vec<Mount> {
    mountinfo.lines().filter_map(parse_line).collect()
}

/// This process's mounts; none where the file cannot be read.
pub fn read() -> Vec<Mount> {
    read_parsed().unwrap_or_default()
}

fn read_parsed() -> std::io::Result<Vec<Mount>> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse(&t))
}

/// This process's mounts but those strictly below each of `roots` that is a mount's root, and
/// how many were left out unread, as [`read_points_outside`] reads them; where it cannot, every
/// mount, from mountinfo (none left out).
pub fn read_outside(roots: &[PathBuf]) -> std::io::Result<(Vec<Mount>, usize)> {
    match read_points_outside(roots) {
        Some(read) => Ok(read),
        None => read_parsed().map(|mounts| (mounts, 0)),
    }
}

/// This process's mounts except those strictly below each of `roots` that is a mount's root (the
/// daemon's state directory, holding every pod's mounts), with an empty `super_options`, and how
/// many were left out: their points are never formatted. In mountinfo's order. `None` where no
/// root is a mount's, the kernel lacks the calls (before 6.8) or a call fails. (The kernel keeps a
/// namespace's mounts ordered by their unique ids and lists both in that order.)
pub fn read_points_outside(roots: &[PathBuf]) -> Option<(Vec<Mount>, usize)> {
    let below: Vec<u64> = roots.iter().filter_map(|r| statmount::root_id(r)).collect();
    if below.is_empty() {
        return None;
    }
    let mut skip = std::collections::HashSet::new();
    for id in below {
        skip.extend(statmount::ids(id)?);
    }
    let ids: Vec<u64> = statmount::ids(statmount::LSMT_ROOT)?
        .into_iter()
        .filter(|id| !skip.contains(id))
        .collect();
    Some((statmount::read_ids(&ids)?, skip.len()))
}

/// Whether `path` is the root of a mount (not following a final link), by statx's attribute
/// (Linux 5.8), not a scan of mountinfo, which grows with every pod; `None` where the kernel does
/// not say or `path` cannot be read.
pub fn is_mount_root(path: &std::path::Path) -> Option<bool> {
    mount_root_in(&statx_of(path, 0)?)
}

/// Whether `path` is a mount point of this process's mount namespace: [`is_mount_root`], not a
/// scan of `/proc/self/mountinfo`, which grows with every pod. Kernels before 5.8 lack the
/// attribute and get the scan.
pub fn is_mountpoint(path: &std::path::Path) -> bool {
    match is_mount_root(path) {
        Some(root) => root,
        None => path.symlink_metadata().is_ok() && read().iter().any(|m| m.mount_point == path),
    }
}

fn mount_root_in(stx: &libc::statx) -> Option<bool> {
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (stx.stx_attributes_mask & root != 0).then_some(stx.stx_attributes & root != 0)
}

/// `path`'s statx, not following a final link, asking for `mask`.
fn statx_of(path: &std::path::Path, mask: u32) -> Option<libc::statx> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a zeroed statx is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx with a valid path into a struct we own.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            mask,
            &mut stx,
        )
    };
    (r == 0).then_some(stx)
}

/// `listmount(2)` and `statmount(2)`, on the architectures whose system call numbers are known
/// here (the generic table's: x86_64 and aarch64).
mod statmount {
    use super::Mount;

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    const SYS_STATMOUNT: libc::c_long = 457;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    const SYS_LISTMOUNT: libc::c_long = 458;
    /// `listmount`'s `mnt_id` for every mount reachable from this process's root.
    pub(super) const LSMT_ROOT: u64 = u64::MAX;
    /// `statx`'s mask bit for the unique (never reused) mount id `listmount` and `statmount` use.
    const STATX_MNT_ID_UNIQUE: u32 = 0x4000;
    const STATMOUNT_MNT_BASIC: u64 = 0x2;
    const STATMOUNT_MNT_POINT: u64 = 0x10;
    const STATMOUNT_FS_TYPE: u64 = 0x20;
    /// A FUSE mount's subtype (Linux 6.13), which mountinfo writes as `fuse.<subtype>`; asked
    /// for, not required.
    const STATMOUNT_FS_SUBTYPE: u64 = 0x100;
    const MASK: u64 = STATMOUNT_MNT_BASIC | STATMOUNT_MNT_POINT | STATMOUNT_FS_TYPE;
    /// Mounts read at most; a namespace with more is read from mountinfo.
    const MAX_MOUNTS: usize = 1 << 16;
    /// `struct statmount` without its strings, and its fields' offsets.
    const HEAD: usize = 512;
    const OFF_SIZE: usize = 0;
    const OFF_MASK: usize = 8;
    const OFF_FS_TYPE: usize = 36;
    const OFF_PROPAGATION: usize = 72;
    const OFF_MNT_POINT: usize = 108;
    const OFF_FS_SUBTYPE: usize = 120;
    /// A mount point is at most `PATH_MAX` bytes, a type name far less.
    const BUF: usize = HEAD + 4096 + 512;

    /// `struct mnt_id_req`, its first version (24 bytes; later kernels take it too).
    #[repr(C)]
    struct MntIdReq {
        size: u32,
        spare: u32,
        mnt_id: u64,
        param: u64,
    }

    /// The mounts with these unique ids, or `None` where a call fails: the caller falls back to
    /// mountinfo, so nothing is ever left out silently.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub(super) fn read_ids(ids: &[u64]) -> Option<Vec<Mount>> {
        let mut mounts = Vec::with_capacity(ids.len());
        let mut buf = vec![0u64; BUF / 8];
        for &id in ids {
            let req = MntIdReq {
                size: std::mem::size_of::<MntIdReq>() as u32,
                spare: 0,
                mnt_id: id,
                param: MASK | STATMOUNT_FS_SUBTYPE,
            };
            // SAFETY: statmount(req, buf, bufsize, flags) writes at most `BUF` bytes to `buf`.
            let r = unsafe {
                libc::syscall(
                    SYS_STATMOUNT,
                    &req,
                    buf.as_mut_ptr(),
                    BUF,
                    0 as libc::c_uint,
                )
            };
            if r != 0 {
                return None;
            }
            // SAFETY: `buf` is `BUF` bytes of initialised u64s, viewed as bytes.
            let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), BUF) };
            mounts.push(parse(bytes)?);
        }
        Some(mounts)
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub(super) fn read_ids(_: &[u64]) -> Option<Vec<Mount>> {
        None
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub(super) fn ids(_: u64) -> Option<Vec<u64>> {
        None
    }

    /// The unique mount id of `path` where it is a mount's root, not following a final link.
    pub(super) fn root_id(path: &std::path::Path) -> Option<u64> {
        let stx = super::statx_of(path, STATX_MNT_ID_UNIQUE)?;
        let is_root = super::mount_root_in(&stx) == Some(true);
        (is_root && stx.stx_mask & STATX_MNT_ID_UNIQUE != 0).then_some(stx.stx_mnt_id)
    }

    /// The unique ids of the mounts below `mnt_id` ([`LSMT_ROOT`]: every mount reachable from
    /// this process's root), in the kernel's order.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub(super) fn ids(mnt_id: u64) -> Option<Vec<u64>> {
        const BATCH: usize = 512;
        let mut ids = Vec::new();
        let mut chunk = [0u64; BATCH];
        loop {
            let req = MntIdReq {
                size: std::mem::size_of::<MntIdReq>() as u32,
                spare: 0,
                mnt_id,
                param: ids.last().copied().unwrap_or(0),
            };
            // SAFETY: listmount(req, ids, nr, flags) writes at most `BATCH` ids to `chunk`.
            let n = unsafe {
                libc::syscall(
                    SYS_LISTMOUNT,
                    &req,
                    chunk.as_mut_ptr(),
                    BATCH,
                    0 as libc::c_uint,
                )
            };
            let n = usize::try_from(n).ok().filter(|&n| n <= BATCH)?;
            ids.extend_from_slice(&chunk[..n]);
            if ids.len() > MAX_MOUNTS {
                return None;
            }
            if n < BATCH {
                return (mnt_id != LSMT_ROOT || !ids.is_empty()).then_some(ids);
            }
        }
    }

    /// One `struct statmount` as the kernel filled it: `None` where it lacks a field asked for or
    /// a string lies outside what it says it wrote.
    pub fn parse(buf: &[u8]) -> Option<Mount> {
        let u32_at = |off: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(buf.get(off..off + 4)?.try_into().ok()?))
        };
        let u64_at = |off: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(buf.get(off..off + 8)?.try_into().ok()?))
        };
        let size = (u32_at(OFF_SIZE)? as usize).min(buf.len());
        if u64_at(OFF_MASK)? & MASK != MASK || size <= HEAD {
            return None;
        }
        let strings = &buf[HEAD..size];
        let string = |off: usize| -> Option<&[u8]> {
            let s = strings.get(u32_at(off)? as usize..)?;
            Some(&s[..s.iter().position(|&b| b == 0)?])
        };
        use std::os::unix::ffi::OsStrExt;
        let mount_point = std::path::Path::new(std::ffi::OsStr::from_bytes(string(OFF_MNT_POINT)?));
        let mut fs_type = std::str::from_utf8(string(OFF_FS_TYPE)?).ok()?.to_string();
        if u64_at(OFF_MASK)? & STATMOUNT_FS_SUBTYPE != 0 {
            match string(OFF_FS_SUBTYPE).map(std::str::from_utf8) {
                Some(Ok("")) => {}
                Some(Ok(sub)) => fs_type = format!("{fs_type}.{sub}"),
                _ => return None,
            }
        }
        let shared = u64_at(OFF_PROPAGATION)? & libc::MS_SHARED != 0;
        mount_point.is_absolute().then(|| Mount {
            mount_point: mount_point.to_path_buf(),
            fs_type,
            super_options: String::new(),
            shared,
        })
    }
}

/// A `struct statmount` buffer's parser, for the fuzz target.
pub fn parse_statmount(buf: &[u8]) -> Option<Mount> {
    statmount::parse(buf)
}

fn parse_line(line: &str) -> Option<Mount> {
    let (pre, post) = line.split_once(" - ")?;
    let mut fields = pre.split(' ');
    let mount_point = unescape(fields.nth(4)?);
    // Past the mount options, the optional fields.
    let shared = fields.skip(1).any(|f| f.starts_with("shared:"));
    let mut post = post.split(' ');
    let fs_type = post.next()?.to_string();
    let super_options = post.nth(1).unwrap_or_default().to_string();
    mount_point.is_absolute().then_some(Mount {
        mount_point,
        fs_type,
        super_options,
        shared,
    })
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_told_from_plain_directories() {
        assert!(is_mountpoint(std::path::Path::new("/proc")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mountpoint(dir.path()));
        assert!(!is_mountpoint(&dir.path().join("missing")));
    }

    #[test]
    fn fields_are_read_and_escapes_decoded() {
        let m = parse(
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             49 22 0:49 / /mnt/with\\040space rw master:3 - tmpfs tmpfs rw\n\
             50 22 0:50 / /run rw,nosuid shared:7 master:1 - tmpfs tmpfs rw\n",
        );
        assert_eq!(
            m[0],
            Mount {
                mount_point: PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                fs_type: "cgroup".into(),
                super_options: "rw,cpu,cpuacct".into(),
                shared: false,
            }
        );
        assert_eq!(m[1].mount_point, PathBuf::from("/mnt/with space"));
        assert!(!m[1].shared, "a slave only");
        assert!(m[2].shared);
        assert_eq!(m[2].fs_type, "tmpfs");
    }

    #[test]
    fn junk_is_skipped_and_bad_escapes_kept_as_they_are() {
        assert!(parse("junk\n1 2 3 4 relative rw - tmpfs t rw\n- -\n").is_empty());
        assert_eq!(unescape("/a\\040b\\134c"), PathBuf::from("/a b\\c"));
        assert_eq!(unescape("/end\\04"), PathBuf::from("/end\\04"));
        assert_eq!(unescape("/x\\777"), PathBuf::from("/x\\777"));
    }

    /// Whether this kernel has `listmount` and `statmount` (6.8 on), which this machine's has.
    fn has_statmount() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 8)
    }

    /// The same mounts in the same order as mountinfo's, options aside, through statmount on a
    /// kernel that has it.
    #[test]
    fn statmount_reads_what_mountinfo_says() {
        if !has_statmount() {
            return;
        }
        let mut text = read();
        for m in &mut text {
            m.super_options.clear();
        }
        let ids = statmount::ids(statmount::LSMT_ROOT).expect("listmount");
        assert_eq!(statmount::read_ids(&ids), Some(text));
    }

    /// In a forked child with a mount namespace of its own: the mounts below a state directory
    /// (a mount) are left out and counted, the rest read as mountinfo says, on a kernel with
    /// statmount (6.8 on), which this machine's is; a directory that is not a mount's root is
    /// refused.
    #[test]
    fn the_mounts_below_a_state_directory_are_left_out_unread() {
        // SAFETY: plain libc call.
        if unsafe { libc::geteuid() } != 0 || !has_statmount() {
            return;
        }
        let seen = crate::testing::in_child_mount_ns(|| {
            let top = tempfile::tempdir().ok()?;
            let state = top.path().join("state");
            let tmpfs_at = |p: &std::path::Path| -> Option<()> {
                std::fs::create_dir_all(p).ok()?;
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
                // SAFETY: mount with valid strings.
                let r = unsafe {
                    libc::mount(
                        c"tmpfs".as_ptr(),
                        c.as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        std::ptr::null(),
                    )
                };
                (r == 0).then_some(())
            };
            tmpfs_at(&state)?;
            for p in ["pods/a/shm", "pods/b/shm", "pods/b/shm/deeper"] {
                tmpfs_at(&state.join(p))?;
            }
            tmpfs_at(&top.path().join("outside"))?;
            let mut want = read();
            want.retain(|m| m.mount_point == state || !m.mount_point.starts_with(&state));
            for m in &mut want {
                m.super_options.clear();
            }
            let (got, skipped) = read_points_outside(std::slice::from_ref(&state))?;
            let plain = read_points_outside(&[top.path().join("outside/none")]);
            Some(vec![got == want, skipped == 3, plain.is_none()])
        });
        assert_eq!(
            seen,
            Some(vec![true; 3]),
            "(the rest as mountinfo says, 3 left out, no mount root refused)"
        );
    }

    /// A crafted buffer: strings past the size the kernel wrote, offsets past the end, a missing
    /// field or no NUL are refused, not read.
    #[test]
    fn statmount_buffers_are_read_within_their_size() {
        let mut b = vec![0u8; 600];
        let put32 =
            |b: &mut Vec<u8>, off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        let put64 =
            |b: &mut Vec<u8>, off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        b[512..525].copy_from_slice(b"/a b\nc\0tmpfs\0".as_ref());
        put32(&mut b, 0, 525);
        put64(&mut b, 8, 0x32);
        put32(&mut b, 108, 0);
        put32(&mut b, 36, 7);
        put64(&mut b, 72, libc::MS_SHARED);
        let m = parse_statmount(&b).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/a b\nc"));
        assert_eq!((m.fs_type.as_str(), m.shared), ("tmpfs", true));
        let mut short = b.clone();
        put32(&mut short, 0, 520);
        assert_eq!(parse_statmount(&short), None, "the type lies past the size");
        let mut far = b.clone();
        put32(&mut far, 36, u32::MAX);
        assert_eq!(parse_statmount(&far), None);
        let mut unmasked = b.clone();
        put64(&mut unmasked, 8, 0x12);
        assert_eq!(parse_statmount(&unmasked), None, "no type was written");
        let mut relative = b.clone();
        relative[512] = b'a';
        assert_eq!(parse_statmount(&relative), None);
        assert_eq!(parse_statmount(&b[..100]), None);
        let mut huge = b.clone();
        put32(&mut huge, 0, u32::MAX);
        huge[524] = b'x';
        huge.truncate(525);
        assert_eq!(parse_statmount(&huge), None, "no NUL before the end");
    }

    #[test]
    fn this_process_has_a_root_and_proc() {
        let m = read();
        assert!(m.iter().any(|m| m.mount_point == std::path::Path::new("/")));
        assert!(m.iter().any(|m| m.fs_type == "proc"));
    }
}
