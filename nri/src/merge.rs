// TEMPORARY placeholder until the real merge lands.
use crate::api;
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("plugins {first:?} and {second:?} both adjust {what}")]
    Conflict {
        what: String,
        first: String,
        second: String,
    },
    #[error("plugin {plugin}: {reason}")]
    Invalid { plugin: String, reason: String },
}
pub struct Merge {
    m: Merged,
}
#[derive(Default, Debug, Clone)]
pub struct Merged {
    pub adjust: api::ContainerAdjustment,
    pub updates: Vec<api::ContainerUpdate>,
    pub evictions: Vec<api::ContainerEviction>,
    pub owners: api::OwningPlugins,
}
impl Merge {
    pub fn new(_c: &api::Container) -> Self {
        Merge {
            m: Merged::default(),
        }
    }
    pub fn adjust(&mut self, _p: &str, a: api::ContainerAdjustment) -> Result<(), MergeError> {
        self.m.adjust = a;
        Ok(())
    }
    pub fn update(&mut self, _p: &str, u: Vec<api::ContainerUpdate>) -> Result<(), MergeError> {
        self.m.updates.extend(u);
        Ok(())
    }
    pub fn evict(&mut self, _p: &str, e: Vec<api::ContainerEviction>) {
        self.m.evictions.extend(e)
    }
    pub fn finish(self) -> Merged {
        self.m
    }
}
