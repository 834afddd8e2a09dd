//! Image and container-reference records in redb. Each change is one write transaction, so a crash
//! leaves either the old state or the new one.

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::Result;
use crishim_sys::blocking::off_the_workers;

/// image id (`sha256:<config digest>`) -> JSON [`ImageRecord`]
const IMAGES: TableDefinition<&str, &[u8]> = TableDefinition::new("images");
/// repo tag or repo digest -> image id
const NAMES: TableDefinition<&str, &str> = TableDefinition::new("names");
/// container id -> JSON [`ContainerRef`]
const CONTAINERS: TableDefinition<&str, &[u8]> = TableDefinition::new("containers");

/// A pulled image, as the CRI reports it and as garbage collection needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The config digest.
    pub id: Digest,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    /// Bytes of manifest, config and compressed layers.
    pub size: u64,
    /// The platform manifest, and the index it was chosen from.
    pub manifest: Digest,
    pub index: Option<Digest>,
    pub config: Digest,
    /// Compressed layer blobs and the chain IDs of their snapshots, bottom layer first.
    pub layers: Vec<Digest>,
    pub chain_ids: Vec<Digest>,
    /// The image config's `User`, as written there.
    pub user: String,
}

impl ImageRecord {
    /// Every blob this image keeps alive.
    pub fn blobs(&self) -> impl Iterator<Item = &Digest> {
        [&self.manifest, &self.config]
            .into_iter()
            .chain(self.index.iter())
            .chain(self.layers.iter())
    }

    fn names(&self) -> impl Iterator<Item = &String> {
        self.repo_tags.iter().chain(self.repo_digests.iter())
    }
}

/// A container's root filesystem holds its image's snapshots alive, even after the image is removed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerRef {
    pub image: Digest,
    pub chain_ids: Vec<Digest>,
    pub readonly: bool,
    /// The layers its root filesystem reads through their lazy mounts: those mounts stay while
    /// it does.
    #[serde(default)]
    pub lazy_chains: Vec<Digest>,
}

pub struct Meta {
    db: Database,
}

/// Commits `txn`, whose `fsync`s must not stall the async runtime.
fn commit(txn: redb::WriteTransaction) -> Result<()> {
    Ok(off_the_workers(|| txn.commit())?)
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T> {
    Ok(serde_json::from_slice(bytes)?)
}

impl Meta {
    pub fn open(path: &Path) -> Result<Self> {
        let db = Database::create(path)?;
        let txn = db.begin_write()?;
        txn.open_table(IMAGES)?;
        txn.open_table(NAMES)?;
        txn.open_table(CONTAINERS)?;
        commit(txn)?;
        Ok(Meta { db })
    }

    pub fn image(&self, id: &str) -> Result<Option<ImageRecord>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(IMAGES)?;
        let value = table.get(id)?;
        value.map(|v| decode(v.value())).transpose()
    }

    pub fn image_by_name(&self, name: &str) -> Result<Option<ImageRecord>> {
        let id = {
            let txn = self.db.begin_read()?;
            let names = txn.open_table(NAMES)?;
            let id = names.get(name)?.map(|v| v.value().to_string());
            id
        };
        match id {
            Some(id) => self.image(&id),
            None => Ok(None),
        }
    }

    pub fn images(&self) -> Result<Vec<ImageRecord>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(IMAGES)?;
        let mut out = Vec::new();
        for item in table.iter()? {
            let (_, v) = item?;
            out.push(decode(v.value())?);
        }
        Ok(out)
    }

    /// Register a pulled image. Its names move to it from any image that held them before; an image
    /// that already exists gains the new names.
    pub fn commit_image(&self, mut record: ImageRecord) -> Result<ImageRecord> {
        let txn = self.db.begin_write()?;
        {
            let mut images = txn.open_table(IMAGES)?;
            let mut names = txn.open_table(NAMES)?;
            let id = record.id.to_string();
            let previous: Option<ImageRecord> = images
                .get(id.as_str())?
                .map(|v| decode(v.value()))
                .transpose()?;
            if let Some(prev) = previous {
                for t in prev.repo_tags {
                    if !record.repo_tags.contains(&t) {
                        record.repo_tags.push(t);
                    }
                }
                for d in prev.repo_digests {
                    if !record.repo_digests.contains(&d) {
                        record.repo_digests.push(d);
                    }
                }
            }
            let new_names: Vec<String> = record.names().cloned().collect();
            for name in &new_names {
                let holder = names.get(name.as_str())?.map(|v| v.value().to_string());
                if let Some(other) = holder.filter(|o| *o != id) {
                    let other_rec: Option<ImageRecord> = images
                        .get(other.as_str())?
                        .map(|v| decode(v.value()))
                        .transpose()?;
                    if let Some(mut o) = other_rec {
                        o.repo_tags.retain(|t| t != name);
                        o.repo_digests.retain(|d| d != name);
                        images.insert(other.as_str(), serde_json::to_vec(&o)?.as_slice())?;
                    }
                }
                names.insert(name.as_str(), id.as_str())?;
            }
            images.insert(id.as_str(), serde_json::to_vec(&record)?.as_slice())?;
        }
        commit(txn)?;
        Ok(record)
    }

    /// Delete an image and all its names. Returns whether it existed.
    pub fn remove_image(&self, id: &str) -> Result<bool> {
        let txn = self.db.begin_write()?;
        let existed = {
            let mut images = txn.open_table(IMAGES)?;
            let mut names = txn.open_table(NAMES)?;
            let rec: Option<ImageRecord> =
                images.remove(id)?.map(|v| decode(v.value())).transpose()?;
            if let Some(rec) = &rec {
                for name in rec.names() {
                    names.remove(name.as_str())?;
                }
            }
            rec.is_some()
        };
        commit(txn)?;
        Ok(existed)
    }

    /// Record a container's rootfs; fails if the id is taken.
    pub fn add_container(&self, id: &str, r: &ContainerRef) -> Result<bool> {
        let txn = self.db.begin_write()?;
        let inserted = {
            let mut t = txn.open_table(CONTAINERS)?;
            if t.get(id)?.is_some() {
                false
            } else {
                t.insert(id, serde_json::to_vec(r)?.as_slice())?;
                true
            }
        };
        commit(txn)?;
        Ok(inserted)
    }

    pub fn remove_container(&self, id: &str) -> Result<()> {
        let txn = self.db.begin_write()?;
        txn.open_table(CONTAINERS)?.remove(id)?;
        commit(txn)?;
        Ok(())
    }

    pub fn container(&self, id: &str) -> Result<Option<ContainerRef>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(CONTAINERS)?;
        let value = table.get(id)?;
        value.map(|v| decode(v.value())).transpose()
    }

    pub fn containers(&self) -> Result<Vec<(String, ContainerRef)>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(CONTAINERS)?;
        let mut out = Vec::new();
        for item in table.iter()? {
            let (k, v) = item?;
            out.push((k.value().to_string(), decode(v.value())?));
        }
        Ok(out)
    }
}
