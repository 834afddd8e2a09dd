//! Whether the interceptor can load in an image. The dynamic loader skips an `/etc/ld.so.preload`
//! entry it cannot load with no more than a warning, and the limits would silently be gone; a
//! replace-mode forwarder would fail every `dlopen("libcuda.so.1")`. So before injecting it,
//! the image's glibc is checked to define every `GLIBC_x.y` version the interceptor needs, and
//! `libgcc_s.so.1` (which Rust's standard library links) to be there. An image without a glibc
//! (static or musl programs) cannot load the CUDA driver anyway and is let through.

use std::path::Path;

use super::error::GpuError;

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

/// The most of an image's library read: glibc's `libc.so.6` is about 2 MiB, `libgcc_s.so.1`
/// well under 1 MiB. The image chooses what is there, so anything larger is refused.
pub const MAX_IMAGE_LIBRARY_BYTES: u64 = 32 << 20;

/// Read a library of the image (resolved inside the root filesystem) from the first library
/// directory that has it, through the bounded reader: a device, a FIFO or an oversized file
/// there is refused with `FailedPrecondition`, never read.
fn image_library(rootfs: &Path, name: &str) -> Result<Option<Vec<u8>>, GpuError> {
    use crishim_sys::confined::{self, Limits, ReadError};
    let root = match std::fs::File::open(rootfs) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(GpuError::io(format!("opening {}", rootfs.display()), e)),
    };
    for dir in LIB_DIRS {
        let rel = format!("{dir}/{name}");
        match confined::read_at(&root, &rel, Limits::in_root(MAX_IMAGE_LIBRARY_BYTES)) {
            Ok(bytes) => return Ok(Some(bytes)),
            Err(e) if e.is_missing() => {}
            // A directory where the library would be: look in the next directory.
            Err(ReadError::NotRegular {
                kind: "directory", ..
            }) => {}
            Err(e) if e.is_refusal() => {
                return Err(GpuError::Unavailable(format!(
                    "GPU limits need the interceptor, and checking that the image can load it failed: the image's {e}"
                )))
            }
            Err(e) => return Err(GpuError::Internal(format!("the image's {e}"))),
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

    #[test]
    fn a_device_or_fifo_or_huge_file_as_the_images_libc_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join(LIB_DIRS[0]);
        std::fs::create_dir_all(&lib).unwrap();
        let interceptor = dir.path().join("i.so");
        std::fs::write(&interceptor, b"\0GLIBC_2.34\0").unwrap();
        let libc_path = lib.join("libc.so.6");
        // /dev/zero (1:5) where the image's libc should be: read whole, it never ends.
        if nix::unistd::Uid::effective().is_root() {
            nix::sys::stat::mknod(
                &libc_path,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o644),
                nix::sys::stat::makedev(1, 5),
            )
            .unwrap();
            let e = check_image(dir.path(), &interceptor).unwrap_err();
            assert!(matches!(e, GpuError::Unavailable(_)), "{e}");
            assert!(e.to_string().contains("character device"), "{e}");
            std::fs::remove_file(&libc_path).unwrap();
        }
        nix::unistd::mkfifo(&libc_path, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let e = check_image(dir.path(), &interceptor).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        std::fs::remove_file(&libc_path).unwrap();
        let f = std::fs::File::create(&libc_path).unwrap();
        f.set_len(MAX_IMAGE_LIBRARY_BYTES + 1).unwrap();
        let e = check_image(dir.path(), &interceptor).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        // A symlink out of the image names the image's own file, which is not there.
        std::fs::remove_file(&libc_path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &libc_path).unwrap();
        check_image(dir.path(), &interceptor).unwrap();
    }
}
