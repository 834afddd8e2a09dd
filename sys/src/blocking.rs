//! Waits inside async code: a disk wait off the runtime's workers, and a child's output read
//! to a cap. Behind the `tokio` feature, which the single-purpose binaries leave off.

/// Runs `f`, which waits on the disk (an `fdatasync`, a database commit), without holding up
/// the tasks of a multi-threaded runtime: tokio hands this worker's other tasks to another
/// thread first, as Go does for a goroutine in a system call. On a slow disk a write would
/// otherwise stall the worker, and with the lock it holds every worker that writes behind it,
/// and so every RPC.
pub fn off_the_workers<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The first `max` bytes of `r` (a child's stdout or stderr), then the rest drained to its end:
/// a runaway child neither blocks on a full pipe nor makes the daemon buffer what it writes.
pub async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    mut r: R,
    max: u64,
) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut kept = Vec::new();
    (&mut r).take(max).read_to_end(&mut kept).await?;
    tokio::io::copy(&mut r, &mut tokio::io::sink()).await?;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write waiting on the disk leaves the runtime's other tasks running: here the wait lasts
    /// until another task, on a runtime of one worker, has run. Blocking that worker would
    /// deadlock it until the timeout.
    #[test]
    fn a_write_waiting_on_the_disk_leaves_the_other_tasks_running() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let ran = rt.block_on(async {
            let (tx, rx) = std::sync::mpsc::channel();
            let (started, waiting) = tokio::sync::oneshot::channel();
            let waiter = tokio::spawn(async move {
                let _ = started.send(());
                off_the_workers(|| rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok())
            });
            // Spawned once the waiter holds the worker: it can only run beside it.
            waiting.await.unwrap();
            tokio::spawn(async move { tx.send(()) });
            waiter.await.unwrap()
        });
        assert!(ran, "the other task never ran while the write waited");
        // Outside a multi-threaded runtime it simply runs.
        assert_eq!(off_the_workers(|| 7), 7);
    }
}
