//! Record files shared by the daemon and the shim: written whole or not at all, so a crash or a
//! torn write never leaves a half-written record for the other side to read.

use std::io::Write;
use std::path::Path;

static TMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Write `data` to a temporary file beside `path`, flush it to disk and rename it into place, then
/// `fsync` the directory so the rename itself survives a crash. Each write has its own temporary
/// name, so concurrent writers of one record never collide: the last rename wins, whole. The file
/// is created with mode 0600: records carry containers' environments.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let n = TMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{n}.tmp", std::process::id()));
    let tmp = path.with_file_name(name);
    {
        let mut f = crate::hostfs::create_private_file(&tmp)?;
        f.write_all(data)?;
        f.sync_data()?;
    }
    rename_synced(&tmp, path)
}

/// Rename `from` to `to`, then `fsync` the directories involved, so that after a crash the record
/// is found under one name or the other, never lost.
pub fn rename_synced(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::rename(from, to)?;
    let (src, dst) = (parent(from), parent(to));
    crate::hostfs::sync_dir(dst)?;
    if src != dst {
        crate::hostfs::sync_dir(src)?;
    }
    Ok(())
}

fn parent(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Now, in Unix nanoseconds: the CRI's timestamps.
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn concurrent_writers_of_one_record_do_not_collide() {
        let dir = std::env::temp_dir().join(format!("crishim-record-c-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.json");
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        super::write_atomic(&p, format!("writer {i}").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(String::from_utf8(std::fs::read(&p).unwrap())
            .unwrap()
            .starts_with("writer "));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn replaces_whole_files() {
        let dir = std::env::temp_dir().join(format!("crishim-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.json");
        super::write_atomic(&p, b"one").unwrap();
        super::write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().mode() & 0o777,
            0o600,
            "records are root's alone"
        );
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary file is left"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
