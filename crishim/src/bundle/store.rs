//! Bundle containers' state: one directory each, `<state_dir>/bundles/<id>/`, holding the record
//! written here (`bundle.json`), and the shim's socket, pid file, libcontainer state and, by
//! default, the log. The directory's existence is the id's reservation: it is made with a plain
//! `mkdir`, so two concurrent creates of one id cannot both win.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::BundleError;

pub const RECORD: &str = "bundle.json";

/// What `crishim bundle state` reports beyond what the shim knows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BundleRecord {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    pub oci_version: String,
    /// Unix nanoseconds.
    pub created: i64,
    /// The CRI log of a detached container; none for `bundle run`, which writes to its caller.
    pub log: Option<PathBuf>,
}

pub struct Store {
    root: PathBuf,
}

/// A reserved state directory, removed when dropped unless [`Reservation::keep`] is called.
pub struct Reservation {
    dir: Option<PathBuf>,
}

impl Reservation {
    pub fn dir(&self) -> &Path {
        self.dir.as_deref().expect("not yet kept")
    }

    pub fn keep(mut self) {
        self.dir = None;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Ids name directories: only characters that cannot climb out of one.
pub fn validate_id(id: &str) -> Result<(), BundleError> {
    let ok = id.len() <= 1024
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(BundleError::InvalidId(id.to_string()))
    }
}

impl Store {
    /// Bundles under `<state_dir>/bundles`.
    pub fn new(state_dir: &Path) -> Store {
        Store {
            root: state_dir.join("bundles"),
        }
    }

    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Claim `id`'s directory and write its record there.
    pub fn reserve(&self, record: &BundleRecord) -> Result<Reservation, BundleError> {
        validate_id(&record.id)?;
        crishim_sys::hostfs::create_private_dir(&self.root)
            .map_err(|e| BundleError::io("creating", &self.root, e))?;
        let dir = self.dir(&record.id);
        // Created, not reused: an existing directory means the id is taken.
        match std::fs::DirBuilder::new()
            .mode(crishim_sys::hostfs::DIR_MODE)
            .create(&dir)
            .and_then(|()| crishim_sys::hostfs::create_private_dir(&dir))
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(BundleError::AlreadyExists {
                    id: record.id.clone(),
                    dir,
                })
            }
            Err(e) => return Err(BundleError::io("creating", dir, e)),
        }
        let reservation = Reservation {
            dir: Some(dir.clone()),
        };
        let json = serde_json::to_vec_pretty(record).expect("a record serializes");
        let path = dir.join(RECORD);
        crishim_sys::record::write_atomic(&path, &json)
            .map_err(|e| BundleError::io("writing", path, e))?;
        Ok(reservation)
    }

    /// The directory and record of an existing container.
    pub fn load(&self, id: &str) -> Result<(PathBuf, BundleRecord), BundleError> {
        validate_id(id)?;
        let dir = self.dir(id);
        let path = dir.join(RECORD);
        let raw = match std::fs::read(&path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => {
                return Err(BundleError::NotFound(id.to_string()))
            }
            Err(e) => return Err(BundleError::io("reading", path, e)),
        };
        let record = serde_json::from_slice(&raw)
            .map_err(|e| BundleError::io("reading", path, std::io::Error::other(e.to_string())))?;
        Ok((dir, record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> BundleRecord {
        BundleRecord {
            id: id.into(),
            bundle: "/b".into(),
            rootfs: "/b/rootfs".into(),
            oci_version: "1.0.2".into(),
            created: 1,
            log: None,
        }
    }

    #[test]
    fn ids_cannot_name_other_directories() {
        for bad in ["", ".", "..", "../x", "a/b", "-x", ".x", "a b", "a\0"] {
            assert!(validate_id(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "web-1", "x.y_z", "0abc"] {
            validate_id(good).unwrap();
        }
    }

    #[test]
    fn an_id_is_reserved_once_and_released_unless_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let r = store.reserve(&record("a")).unwrap();
        let e = store.reserve(&record("a")).err().unwrap().to_string();
        assert!(e.contains("container a already exists"), "{e}");
        assert_eq!(store.load("a").unwrap().1.bundle, Path::new("/b"));
        drop(r);
        assert!(!store.dir("a").exists());
        let e = store.load("a").unwrap_err().to_string();
        assert_eq!(e, "container a does not exist");
        store.reserve(&record("a")).unwrap().keep();
        assert!(store.dir("a").join(RECORD).exists());
    }
}
