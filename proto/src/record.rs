//! Record files shared by the daemon and the shim: written whole or not at all, so a crash or a
//! torn write never leaves a half-written record for the other side to read.

use std::io::Write;
use std::path::Path;

/// Write `data` to a temporary file beside `path`, flush it to disk and rename it into place.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_data()?;
    }
    std::fs::rename(&tmp, path)
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
    fn replaces_whole_files() {
        let dir = std::env::temp_dir().join(format!("crishim-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.json");
        super::write_atomic(&p, b"one").unwrap();
        super::write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!p.with_extension("tmp").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
