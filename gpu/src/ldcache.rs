//! `ld.so.cache`, as glibc's `ldconfig` writes it: the soname → path index the driver's
//! libraries are found by. Both the current format (`glibc-ld.so.cache1.1`) and the old one
//! with the current one appended are read; entries for other architectures (32-bit compat
//! libraries) are skipped.

use std::io;

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// `struct cache_file_new`: magic + version (20), nlibs, len_strings, flags + 3 pad,
/// extension_offset, 3 unused words.
const NEW_HEADER: usize = 48;
/// `struct file_entry_new`: flags, key, value, osversion, hwcap.
const NEW_ENTRY: usize = 24;

/// `FLAG_ELF_LIBC6` plus this architecture's `FLAG_*_LIB64`.
#[cfg(target_arch = "x86_64")]
const NATIVE_FLAGS: i32 = 0x0303;
#[cfg(target_arch = "aarch64")]
const NATIVE_FLAGS: i32 = 0x0a03;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const NATIVE_FLAGS: i32 = 0x0003;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The soname (`libcuda.so.1`).
    pub name: String,
    /// Its path, absolute within the root the cache describes.
    pub path: String,
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("ld.so.cache: {msg}"))
}

fn u32_at(b: &[u8], off: usize) -> io::Result<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_ne_bytes(s.try_into().expect("4 bytes")))
        .ok_or_else(|| invalid("truncated"))
}

/// The native-architecture entries of a cache file's bytes.
pub fn parse(bytes: &[u8]) -> io::Result<Vec<Entry>> {
    let mut start = 0;
    if bytes.starts_with(OLD_MAGIC) {
        // struct cache_file: magic[11] (+1 pad), nlibs, then 12-byte entries; the new format
        // follows, 8-aligned.
        let nlibs = u32_at(bytes, 12)? as usize;
        start = (16usize.saturating_add(nlibs.saturating_mul(12)) + 7) & !7;
    }
    let new = bytes
        .get(start..)
        .filter(|b| b.starts_with(NEW_MAGIC))
        .ok_or_else(|| invalid("no glibc-ld.so.cache1.1 section"))?;
    let nlibs = u32_at(new, 20)? as usize;
    if nlibs.saturating_mul(NEW_ENTRY).saturating_add(NEW_HEADER) > new.len() {
        return Err(invalid("more entries than the file holds"));
    }
    let mut out = Vec::with_capacity(nlibs);
    // String offsets are relative to the new-format header.
    let string = |off: u32| -> io::Result<String> {
        let tail = new
            .get(off as usize..)
            .ok_or_else(|| invalid("string out of range"))?;
        let len = tail
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| invalid("unterminated string"))?;
        Ok(String::from_utf8_lossy(&tail[..len]).into_owned())
    };
    for i in 0..nlibs {
        let at = NEW_HEADER + i * NEW_ENTRY;
        let flags = u32_at(new, at)? as i32;
        if flags != NATIVE_FLAGS {
            continue;
        }
        out.push(Entry {
            name: string(u32_at(new, at + 4)?)?,
            path: string(u32_at(new, at + 8)?)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache as ldconfig writes it, for a root holding two libraries.
    #[test]
    fn ldconfig_output_parses() {
        let Ok(ldconfig) = which("ldconfig") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        // Any real shared object will do: copy libm under two names with their sonames.
        let Some(libm) = [
            "/lib/x86_64-linux-gnu/libm.so.6",
            "/usr/lib/x86_64-linux-gnu/libm.so.6",
        ]
        .iter()
        .find(|p| std::path::Path::new(p).exists()) else {
            return;
        };
        std::fs::copy(libm, lib.join("libm.so.6")).unwrap();
        std::fs::write(
            dir.path().join("etc/ld.so.conf"),
            "/usr/lib/x86_64-linux-gnu\n",
        )
        .unwrap();
        // With -r, ldconfig takes the cache path inside the root.
        let cache = dir.path().join("etc/ld.so.cache");
        let st = std::process::Command::new(ldconfig)
            .arg("-C")
            .arg("/etc/ld.so.cache")
            .arg("-r")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success());
        let entries = parse(&std::fs::read(&cache).unwrap()).unwrap();
        assert!(
            entries.contains(&Entry {
                name: "libm.so.6".into(),
                path: "/usr/lib/x86_64-linux-gnu/libm.so.6".into()
            }),
            "{entries:?}"
        );
    }

    #[test]
    fn the_hosts_own_cache_parses() {
        if let Ok(b) = std::fs::read("/etc/ld.so.cache") {
            let entries = parse(&b).unwrap();
            assert!(entries.iter().any(|e| e.name == "libc.so.6"), "{entries:?}");
        }
    }

    #[test]
    fn garbage_is_refused() {
        assert!(parse(b"nope").is_err());
        let mut b = NEW_MAGIC.to_vec();
        b.extend_from_slice(&[0xff; 8]);
        assert!(parse(&b).is_err());
    }

    fn which(name: &str) -> Result<std::path::PathBuf, ()> {
        ["/sbin", "/usr/sbin", "/bin", "/usr/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(name))
            .find(|p| p.exists())
            .ok_or(())
    }
}
