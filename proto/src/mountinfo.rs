//! `/proc/self/mountinfo`, the fields crishim reads: each mount's point, file system type and
//! super options. Lines that do not parse are skipped.

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
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse(&t))
        .unwrap_or_default()
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

    #[test]
    fn this_process_has_a_root_and_proc() {
        let m = read();
        assert!(m.iter().any(|m| m.mount_point == std::path::Path::new("/")));
        assert!(m.iter().any(|m| m.fs_type == "proc"));
    }
}
