//! Per-key async locks: two pulls that need the same layer fetch it once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Per-key async locks, so two pulls needing the same layer fetch it once.
#[derive(Default)]
pub(crate) struct KeyedLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl KeyedLocks {
    pub(crate) async fn lock(&self, key: &str) -> KeyedGuard<'_> {
        let m = self
            .0
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .clone();
        let guard = m.clone().lock_owned().await;
        KeyedGuard {
            locks: self,
            key: key.to_string(),
            _guard: Some(guard),
            _m: m,
        }
    }
}

pub(crate) struct KeyedGuard<'a> {
    locks: &'a KeyedLocks,
    key: String,
    _guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    _m: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for KeyedGuard<'_> {
    fn drop(&mut self) {
        self._guard.take();
        let mut map = self.locks.0.lock().unwrap();
        // Only the map and this guard hold it: nobody else waits, so forget the key.
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 2)
        {
            map.remove(&self.key);
        }
    }
}
