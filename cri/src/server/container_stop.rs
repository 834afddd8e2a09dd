//! `StopContainer`: the image's stop signal (SIGTERM by default), the grace period, then SIGKILL to
//! every process of the container. Stopping an exited container succeeds.

use std::time::Duration;

use super::errors::Error;
use crishim_proto::cri::{StopContainerRequest, StopContainerResponse};
use crishim_proto::shim::{Request, Status as ShimStatus};
use crishim_state::records::ContainerRecord;
use tracing::info;

use super::runtime_service::{Inner, RuntimeService};
use crate::bounds::request_secs;

impl RuntimeService {
    pub(super) async fn do_stop_container(
        &self,
        req: StopContainerRequest,
    ) -> Result<StopContainerResponse, Error> {
        let inner = &self.inner;
        let c = inner.store.container(&req.container_id)?;
        let _guard = inner.store.lock(&c.id).await;
        inner.stop_container(&c, request_secs(req.timeout)).await?;
        Ok(StopContainerResponse {})
    }
}

impl Inner {
    pub(super) async fn stop_container(
        &self,
        c: &ContainerRecord,
        grace: Duration,
    ) -> Result<(), Error> {
        if self.refresh(c).await.status == ShimStatus::Exited {
            return Ok(());
        }
        if !grace.is_zero() {
            self.shim_ok(
                &c.pod_id,
                Request::Kill {
                    id: c.id.clone(),
                    signal: c.stop_signal,
                    all: false,
                },
            )
            .await?;
            if self.wait_exit(c, grace).await {
                info!(container = %c.id, "container stopped");
                return Ok(());
            }
        }
        self.shim_ok(
            &c.pod_id,
            Request::Kill {
                id: c.id.clone(),
                signal: libc::SIGKILL,
                all: true,
            },
        )
        .await?;
        if !self.wait_exit(c, Duration::from_secs(10)).await {
            return Err(Error::deadline_exceeded(format!(
                "container {} did not exit after SIGKILL",
                c.id
            )));
        }
        info!(container = %c.id, "container killed");
        Ok(())
    }

    /// Poll until the container has exited; false on timeout.
    async fn wait_exit(&self, c: &ContainerRecord, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut delay = Duration::from_millis(5);
        loop {
            let current = self.store.container(&c.id).unwrap_or_else(|_| c.clone());
            if self.refresh(&current).await.status == ShimStatus::Exited {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(delay.min(deadline - tokio::time::Instant::now())).await;
            delay = (delay * 2).min(Duration::from_millis(100));
        }
    }
}
