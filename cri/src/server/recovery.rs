//! Start-up after a restart or a crash: the records are the truth; what a crash interrupted is
//! finished or rolled back, live pods are followed again, and leftovers nothing refers to go.

use std::collections::HashSet;
use std::path::PathBuf;

use crishim_state::records::PodState;
use tracing::info;

use super::runtime_service::Inner;

impl Inner {
    /// Start-up: finish or roll back what a crash interrupted, resume watching live pods, and
    /// clean up leftovers nothing refers to.
    pub async fn recover(&self) {
        let pods = self.store.pods_where(|_| true);
        for pod in pods {
            match pod.state {
                PodState::Creating => {
                    info!(pod = %pod.id, "rolling back a RunPodSandbox interrupted by a restart");
                    let _ = self.remove_pod(&pod).await;
                }
                PodState::Ready if self.shim_alive(&pod.id).await => self.watch_pod(&pod.id),
                PodState::Ready => self.shim_gone(&pod.id).await,
                PodState::NotReady => self.teardown_pod(&pod.id).await,
            }
        }
        let half_created = self.store.containers_where(|c| c.last.is_none());
        for c in half_created {
            info!(container = %c.id, "rolling back a CreateContainer interrupted by a restart");
            let _ = self.remove_container(&c).await;
        }
        self.remove_strays().await;
    }

    /// Directories (and their mounts) of pods and containers that have no record. Those whose
    /// record was quarantined are kept.
    async fn remove_strays(&self) {
        let (pods, containers) = self.store.ids();
        let stray = |dir: PathBuf, known: &HashSet<String>| -> Vec<String> {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !known.contains(n) && !self.store.is_quarantined(n))
                .collect()
        };
        for id in stray(self.config.state_dir.join("containers"), &containers) {
            info!(container = %id, "removing leftovers of an unrecorded container");
            self.undo_create("", &id).await;
        }
        for id in stray(self.config.state_dir.join("pods"), &pods) {
            info!(pod = %id, "removing leftovers of an unrecorded pod");
            self.teardown_pod(&id).await;
            let _ = std::fs::remove_dir_all(self.pod_state_dir(&id));
        }
        for id in stray(self.config.root_dir.join("pods"), &pods) {
            let _ = std::fs::remove_dir_all(self.legacy_pod_files_dir(&id));
        }
        for id in stray(
            self.config.state_dir.join(crate::host_files::POD_FILES),
            &pods,
        ) {
            let _ = self.pod_files.remove_dir(&self.state_pod_files_dir(&id));
        }
    }
}
