//! Whether the interceptor can load in an image. The dynamic loader skips an `/etc/ld.so.preload`
//! entry it cannot load with no more than a warning, and the limits would silently be gone; a
//! replace-mode forwarder would fail every `dlopen("libcuda.so.1")`. So before injecting it,
//! the image's glibc is checked to define every `GLIBC_x.y` version the interceptor needs, and
//! `libgcc_s.so.1` (which Rust's standard library links) to be there. An image without a glibc
//! (static or musl programs) cannot load the CUDA driver anyway and is let through.

use std::io::Read as _;
use std::path::Path;

use super::GpuError;

#[cfg(target_arch = "aarch64")]
const LIB_DIRS: &[&str] = &[
    "lib/aarch64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib64",
    "lib",
    "usr/lib",
];
#[cfg(not(target_arch = "aarch64"))]
const LIB_DIRS: &[&str] = &[
    "lib/x86_64-linux-gnu",
    "usr/lib/x86_64-linux-gnu",
    "lib64",
    "usr/lib64",
    "lib",
    "usr/lib",
];

/// The newest `GLIBC_2.N` named in `bytes` (a library's version strings are plain text in its
/// dynamic string table).
pub fn newest_glibc(bytes: &[u8]) -> Option<u32> {
    const TAG: &[u8] = b"GLIBC_2.";
    let mut newest = None;
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(TAG.len()).position(|w| w == TAG) {
        let start = at + i + TAG.len();
        let digits = bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if let Ok(minor) = std::str::from_utf8(&bytes[start..start + digits])
            .unwrap_or("")
            .parse::<u32>()
        {
            newest = newest.max(Some(minor));
        }
        at = start;
    }
    newest
}

/// Read a library of the image (resolved inside the root filesystem) from the first library
/// directory that has it.
fn image_library(rootfs: &Path, name: &str) -> Result<Option<Vec<u8>>, GpuError> {
    let root = match std::fs::File::open(rootfs) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(GpuError::io(format!("opening {}", rootfs.display()), e)),
    };
    for dir in LIB_DIRS {
        let rel = format!("{dir}/{name}");
        match crate::spec::user::openat2_in_root(&root, &rel) {
            Ok(mut f) => {
                let mut bytes = Vec::new();
                f.read_to_end(&mut bytes)
                    .map_err(|e| GpuError::io(format!("reading /{rel} of the image"), e))?;
                return Ok(Some(bytes));
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::EISDIR)
                ) => {}
            Err(e) => return Err(GpuError::io(format!("opening /{rel} of the image"), e)),
        }
    }
    Ok(None)
}

/// Refuse an image whose glibc cannot load `interceptor`.
pub fn check_image(rootfs: &Path, interceptor: &Path) -> Result<(), GpuError> {
    let Some(libc) = image_library(rootfs, "libc.so.6")? else {
        return Ok(());
    };
    let needs = std::fs::read(interceptor)
        .map_err(|e| GpuError::io(format!("reading {}", interceptor.display()), e))
        .map(|b| newest_glibc(&b))?;
    let has = newest_glibc(&libc);
    if let (Some(needs), Some(has)) = (needs, has) {
        if has < needs {
            return Err(GpuError::Unavailable(format!(
                "GPU limits need the interceptor, which needs glibc 2.{needs} or newer, but the image has glibc 2.{has}: it would not load and the limits would not be enforced (build crishim on a system with the image's glibc or older)"
            )));
        }
    }
    if image_library(rootfs, "libgcc_s.so.1")?.is_none() {
        return Err(GpuError::Unavailable(
            "GPU limits need the interceptor, which needs libgcc_s.so.1, and the image has none: it would not load and the limits would not be enforced".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_the_string_table() {
        assert_eq!(
            newest_glibc(b"\0GLIBC_2.2.5\0GLIBC_2.34\0GLIBC_2.17\0"),
            Some(34)
        );
        assert_eq!(newest_glibc(b"nothing here"), None);
    }

    #[test]
    fn an_image_with_an_old_glibc_or_no_libgcc_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join(LIB_DIRS[0]);
        std::fs::create_dir_all(&lib).unwrap();
        let interceptor = dir.path().join("i.so");
        std::fs::write(&interceptor, b"\0GLIBC_2.2.5\0GLIBC_2.34\0").unwrap();
        // No glibc at all: nothing to protect.
        check_image(dir.path(), &interceptor).unwrap();
        std::fs::write(lib.join("libc.so.6"), b"\0GLIBC_2.2.5\0GLIBC_2.31\0").unwrap();
        let e = check_image(dir.path(), &interceptor)
            .unwrap_err()
            .to_string();
        assert!(e.contains("glibc 2.34") && e.contains("glibc 2.31"), "{e}");
        std::fs::write(lib.join("libc.so.6"), b"\0GLIBC_2.34\0GLIBC_2.36\0").unwrap();
        let e = check_image(dir.path(), &interceptor)
            .unwrap_err()
            .to_string();
        assert!(e.contains("libgcc_s.so.1"), "{e}");
        std::fs::write(lib.join("libgcc_s.so.1"), b"").unwrap();
        check_image(dir.path(), &interceptor).unwrap();
    }
}
