//! Unpacker tests against hand-built tar streams, including hostile ones.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::*;

/// Raw tar entry builder: writes header names verbatim, so `..` paths survive.
struct RawTar(Vec<u8>);

impl RawTar {
    fn new() -> Self {
        RawTar(Vec::new())
    }

    fn entry(
        mut self,
        name: &str,
        kind: tar::EntryType,
        link: &str,
        data: &[u8],
        mode: u32,
    ) -> Self {
        let mut h = tar::Header::new_ustar();
        {
            let raw = h.as_old_mut();
            raw.name[..name.len()].copy_from_slice(name.as_bytes());
            raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(1000);
        h.set_gid(1000);
        h.set_mtime(1_600_000_000);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    fn file(self, name: &str, data: &[u8]) -> Self {
        self.entry(name, tar::EntryType::Regular, "", data, 0o644)
    }

    fn dir(self, name: &str) -> Self {
        self.entry(name, tar::EntryType::Directory, "", b"", 0o755)
    }

    fn symlink(self, name: &str, target: &str) -> Self {
        self.entry(name, tar::EntryType::Symlink, target, b"", 0o777)
    }

    fn hardlink(self, name: &str, target: &str) -> Self {
        self.entry(name, tar::EntryType::Link, target, b"", 0o644)
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.extend(std::iter::repeat_n(0u8, 1024));
        self.0
    }
}

fn run(tar: &[u8]) -> (tempfile::TempDir, Result<Unpacked>) {
    let base = tempfile::tempdir().unwrap();
    let dest = base.path().join("layer");
    std::fs::create_dir(&dest).unwrap();
    let r = unpack(tar, &dest, "sha256:test");
    (base, r)
}

/// Everything a hostile layer might have written lives outside `layer/`; the base must hold nothing else.
fn assert_nothing_outside(base: &Path) {
    let names: Vec<_> = std::fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("layer")],
        "something was written outside the layer"
    );
}

fn err_text(r: Result<Unpacked>) -> String {
    let e = r.expect_err("hostile layer must be refused");
    assert_eq!(e.kind(), crate::ErrorKind::BadContent, "{e}");
    e.to_string()
}

#[test]
fn unpacks_files_dirs_links_and_metadata() {
    let tar = RawTar::new()
        .dir("etc/")
        .file("etc/hello", b"hi")
        .symlink("etc/abs", "/etc/hello")
        .hardlink("etc/hard", "etc/hello")
        .entry("bin/tool", tar::EntryType::Regular, "", b"#!", 0o4755)
        .finish();
    let (base, r) = run(&tar);
    let u = r.unwrap();
    assert_eq!(u.diff_id, Digest::of(&tar));
    let l = base.path().join("layer");
    assert_eq!(std::fs::read(l.join("etc/hello")).unwrap(), b"hi");
    assert_eq!(
        std::fs::read_link(l.join("etc/abs")).unwrap(),
        Path::new("/etc/hello")
    );
    let md = std::fs::metadata(l.join("etc/hello")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.nlink()), (1000, 1000, 2));
    assert_eq!(md.mtime(), 1_600_000_000);
    let tool = std::fs::metadata(l.join("bin/tool")).unwrap();
    assert_eq!(
        tool.permissions().mode() & 0o7777,
        0o4755,
        "setuid kept after chown"
    );
    assert_eq!(
        std::fs::metadata(l.join("etc")).unwrap().mtime(),
        1_600_000_000,
        "dir mtime set last"
    );
}

#[test]
fn whiteouts_become_overlay_whiteouts() {
    let tar = RawTar::new()
        .file("data/.wh.gone", b"")
        .file("data/dir/.wh..wh..opq", b"")
        .finish();
    let (base, r) = run(&tar);
    r.unwrap();
    let l = base.path().join("layer");
    let md = std::fs::symlink_metadata(l.join("data/gone")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), 0);
    assert!(!l.join("data/.wh.gone").exists());
    let mut buf = [0u8; 8];
    let p = std::ffi::CString::new(l.join("data/dir").as_os_str().as_encoded_bytes()).unwrap();
    let n = unsafe {
        libc::lgetxattr(
            p.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            buf.as_mut_ptr().cast(),
            8,
        )
    };
    assert_eq!(&buf[..n.max(0) as usize], b"y");
}

fn xattr_of(path: &Path, name: &std::ffi::CStr) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = [0u8; 256];
    let n = unsafe { libc::lgetxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 256) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

/// A layer's `trusted.overlay.*` (a redirect out of the layer, an opaque marker set by xattr)
/// and other non-allowed attributes are counted and not applied; `user.*` is.
#[test]
fn overlay_and_other_trusted_xattrs_from_a_layer_are_dropped() {
    let mut pax = pax_record("SCHILY.xattr.trusted.overlay.redirect", "/etc");
    pax.extend(pax_record("SCHILY.xattr.trusted.overlay.opaque", "y"));
    pax.extend(pax_record("SCHILY.xattr.trusted.x", "1"));
    pax.extend(pax_record("SCHILY.xattr.user.kept", "v"));
    let (base, r) = run(&with_extension(tar::EntryType::XHeader, &pax, "f"));
    let unpacked = r.unwrap();
    assert_eq!(unpacked.dropped_xattrs, 3);
    let f = base.path().join("layer/f");
    assert!(f.exists());
    assert_eq!(xattr_of(&f, c"trusted.overlay.redirect"), None);
    assert_eq!(xattr_of(&f, c"trusted.overlay.opaque"), None);
    assert_eq!(xattr_of(&f, c"trusted.x"), None);
    // Where the file system takes user xattrs (tmpfs before 6.6 does not).
    let user_ok = {
        let probe = base.path().join("probe");
        std::fs::write(&probe, "").unwrap();
        let p = std::ffi::CString::new(probe.as_os_str().as_encoded_bytes()).unwrap();
        unsafe { libc::lsetxattr(p.as_ptr(), c"user.p".as_ptr(), b"1".as_ptr().cast(), 1, 0) == 0 }
    };
    if user_ok {
        assert_eq!(xattr_of(&f, c"user.kept").as_deref(), Some(&b"v"[..]));
    }
    assert!(layer_xattr_allowed(b"security.capability"));
    assert!(!layer_xattr_allowed(b"security.selinux"));
    assert!(!layer_xattr_allowed(b"trusted.overlay.metacopy"));
}

#[test]
fn dotdot_paths_are_refused() {
    for name in ["../escape", "a/../../escape", "/../escape"] {
        let (base, r) = run(&RawTar::new().file(name, b"x").finish());
        let msg = err_text(r);
        assert!(msg.contains("..") && msg.contains("escapes"), "{msg}");
        assert_nothing_outside(base.path());
    }
}

#[test]
fn writes_through_absolute_symlinks_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    let tar = RawTar::new()
        .symlink("evil", outside.path().to_str().unwrap())
        .file("evil/pwned", b"x")
        .finish();
    let (base, r) = run(&tar);
    assert!(err_text(r).contains("escapes"));
    assert!(!outside.path().join("pwned").exists());
    assert_nothing_outside(base.path());
    // A relative symlink climbing out is refused the same way.
    let tar = RawTar::new()
        .symlink("up", "../..")
        .file("up/pwned", b"x")
        .finish();
    let (base, r) = run(&tar);
    assert!(err_text(r).contains("escapes"));
    assert_nothing_outside(base.path());
}

#[test]
fn hardlinks_out_of_the_layer_are_refused() {
    let before = std::fs::metadata("/etc/passwd").unwrap();
    for target in ["/etc/passwd", "../../../../etc/passwd", "etc/passwd"] {
        let (base, r) = run(&RawTar::new().hardlink("pw", target).finish());
        assert!(err_text(r).contains("hardlink"));
        assert_nothing_outside(base.path());
    }
    // Through a symlink inside the layer that points out.
    let (base, r) = run(&RawTar::new()
        .symlink("etc", "/etc")
        .hardlink("pw", "etc/passwd")
        .finish());
    assert!(err_text(r).contains("escapes"));
    assert_nothing_outside(base.path());
    assert_eq!(
        std::fs::metadata("/etc/passwd").unwrap().nlink(),
        before.nlink()
    );
}

#[test]
fn truncated_streams_are_refused() {
    let full = RawTar::new().file("big", &vec![7u8; 10_000]).finish();
    let (_b, r) = run(&full[..3000]);
    assert!(err_text(r).contains("truncated"));
    // Gzip cut short too.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&full).unwrap();
    let gz = gz.finish().unwrap();
    let (_b, r) = run(&gz[..gz.len() / 2]);
    assert!(err_text(r).contains("truncated"));
}

#[test]
fn compressed_streams_are_detected() {
    let tar = RawTar::new().file("z", b"zstd").finish();
    let z = zstd::encode_all(&tar[..], 3).unwrap();
    let (base, r) = run(&z);
    assert_eq!(
        r.unwrap().diff_id,
        Digest::of(&tar),
        "diff_id is of the uncompressed stream"
    );
    assert_eq!(std::fs::read(base.path().join("layer/z")).unwrap(), b"zstd");
}

#[test]
fn later_entries_replace_earlier_ones() {
    let tar = RawTar::new()
        .file("f", b"one")
        .symlink("f", "target")
        .dir("d/")
        .file("d", b"file-now")
        .finish();
    let (base, r) = run(&tar);
    // "d" is an empty dir replaced by a file.
    r.unwrap();
    let l = base.path().join("layer");
    assert_eq!(
        std::fs::read_link(l.join("f")).unwrap(),
        Path::new("target")
    );
    assert_eq!(std::fs::read(l.join("d")).unwrap(), b"file-now");
}

/// A header of `kind` claiming `size` bytes of body, as GNU tar writes `././@LongLink`.
fn extension_header(kind: tar::EntryType, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// A PAX record `"<len> key=value\n"`.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}").len() + body.len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

/// One extension header with `body`, then an entry `name`.
fn with_extension(kind: tar::EntryType, body: &[u8], name: &str) -> Vec<u8> {
    let mut tar = extension_header(kind, body.len() as u64);
    tar.extend_from_slice(body);
    tar.extend(std::iter::repeat_n(0u8, (512 - body.len() % 512) % 512));
    tar.extend(RawTar::new().file(name, b"x").finish());
    tar
}

/// Counts what the unpacker pulled from it, so a test can tell a header was refused unread.
struct Counted<R> {
    inner: R,
    read: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

#[test]
fn a_long_name_over_the_cap_is_refused_before_its_body_is_read() {
    for kind in [
        tar::EntryType::GNULongName,
        tar::EntryType::GNULongLink,
        tar::EntryType::XHeader,
        tar::EntryType::XGlobalHeader,
    ] {
        // A header claiming 2 GiB, followed by an endless body.
        let stream = io::Cursor::new(extension_header(kind, 2 << 30)).chain(io::repeat(b'a'));
        let read = std::rc::Rc::new(std::cell::Cell::new(0));
        let base = tempfile::tempdir().unwrap();
        let dest = base.path().join("layer");
        std::fs::create_dir(&dest).unwrap();
        let r = unpack(
            Counted {
                inner: stream,
                read: read.clone(),
            },
            &dest,
            "sha256:test",
        );
        let e = err_text(r);
        assert!(
            e.contains("2147483648 bytes is over the 1048576 byte cap"),
            "{e}"
        );
        assert!(e.contains("sha256:test"), "names the layer: {e}");
        assert!(read.get() <= 1 << 20, "read {} bytes of it", read.get());
    }
}

#[test]
fn long_names_and_pax_paths_within_the_cap_are_used() {
    let long = format!("{}/file", "d".repeat(200));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, &long, &b"hi"[..]).unwrap();
    let (base, r) = run(&b.into_inner().unwrap());
    r.unwrap();
    assert_eq!(
        std::fs::read(base.path().join("layer").join(&long)).unwrap(),
        b"hi"
    );

    let mut pax = pax_record("path", "from-pax");
    pax.extend(pax_record("uid", "4242"));
    let (base, r) = run(&with_extension(
        tar::EntryType::XHeader,
        &pax,
        "from-header",
    ));
    r.unwrap();
    let md = std::fs::metadata(base.path().join("layer/from-pax")).unwrap();
    assert_eq!(md.uid(), 4242, "PAX uid applies");
    assert!(!base.path().join("layer/from-header").exists());
}

#[test]
fn pax_bombs_and_ambiguous_pax_records_are_refused() {
    // Many records, together just over the cap.
    let mut many = Vec::new();
    while many.len() as u64 <= MAX_EXTENSION_HEADER {
        many.extend(pax_record("SCHILY.xattr.user.x", "y"));
    }
    let e = err_text(run(&with_extension(tar::EntryType::XHeader, &many, "f")).1);
    assert!(e.contains("PAX header of") && e.contains("cap"), "{e}");

    let mut twice = with_extension(tar::EntryType::XHeader, &pax_record("path", "a"), "f");
    let second = with_extension(tar::EntryType::XHeader, &pax_record("path", "b"), "g");
    twice.truncate(1024); // the first PAX header and its body, no entry
    twice.extend(second);
    let e = err_text(run(&twice).1);
    assert!(e.contains("two PAX headers"), "{e}");

    let e = err_text(
        run(&with_extension(
            tar::EntryType::XHeader,
            &pax_record("size", "999"),
            "f",
        ))
        .1,
    );
    assert!(e.contains("PAX size"), "{e}");

    let e = err_text(
        run(&with_extension(
            tar::EntryType::XHeader,
            &pax_record("uid", "4294967296"),
            "f",
        ))
        .1,
    );
    assert!(
        e.contains("out of range"),
        "uid 2^32 must not wrap to root: {e}"
    );

    let e = err_text(run(&extension_header(tar::EntryType::GNULongName, 10)).1);
    assert!(!e.is_empty());
}

#[test]
fn a_huge_hostile_name_is_shown_cut_in_the_error() {
    let name = format!("{}/../x", "n".repeat(900_000));
    let (_base, r) = run(&with_extension(
        tar::EntryType::GNULongName,
        name.as_bytes(),
        "f",
    ));
    let e = err_text(r);
    assert!(e.contains("escapes the layer"), "{e}");
    assert!(e.len() < 512, "error of {} bytes", e.len());
}

fn run_with(tar: &[u8], limits: crate::ImagesConfig) -> (tempfile::TempDir, Result<Unpacked>) {
    let base = tempfile::tempdir().unwrap();
    let dest = base.path().join("layer");
    std::fs::create_dir(&dest).unwrap();
    let r = unpack_with(tar, &dest, "sha256:test", &Budget::new(&limits));
    (base, r)
}

#[test]
fn unpacked_bytes_and_entries_are_limited() {
    let limits = crate::ImagesConfig {
        max_unpacked_bytes: 64 << 10,
        max_layer_entries: 100,
        min_free_percent: 0,
        ..crate::ImagesConfig::default()
    };
    let big = RawTar::new().file("zeros", &vec![0u8; 128 << 10]).finish();
    let e = run_with(&big, limits.clone()).1.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::ResourceExhausted, "{e}");
    assert!(e.to_string().contains("max_unpacked_bytes = 65536"), "{e}");

    let mut many = RawTar::new();
    for i in 0..101 {
        many = many.file(&format!("f{i}"), b"");
    }
    let e = run_with(&many.finish(), limits.clone()).1.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::ResourceExhausted, "{e}");
    assert!(e.to_string().contains("max_layer_entries = 100"), "{e}");

    // Junk after the end of the archive still counts: it is hashed and read.
    let mut junk = RawTar::new().file("a", b"").finish();
    junk.extend(vec![7u8; 128 << 10]);
    let e = run_with(&junk, limits).1.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::ResourceExhausted, "{e}");
}

#[test]
fn unpacking_stops_when_the_filesystem_gets_too_full() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        base.path(),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=16m"),
    )
    .unwrap();
    let dest = base.path().join("layer");
    std::fs::create_dir(&dest).unwrap();
    let tar = RawTar::new().file("zeros", &vec![0u8; 12 << 20]).finish();
    let limits = crate::ImagesConfig {
        min_free_percent: 50,
        ..Default::default()
    };
    let r = unpack_with(&tar[..], &dest, "sha256:test", &Budget::new(&limits));
    let _ = nix::mount::umount2(base.path(), nix::mount::MntFlags::MNT_DETACH);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::ResourceExhausted, "{e}");
    assert!(e.to_string().contains("min_free_percent = 50"), "{e}");
}
