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
