//! Disk waits inside async code.

/// Runs `f`, which waits on the disk (an `fdatasync`), without holding up the tasks of a
/// multi-threaded runtime: tokio hands this worker's other tasks to another thread first. The
/// twin of `crishim_images::blocking::off_the_workers` (tested there), kept here so the state
/// crate does not depend on the image store.
pub(crate) fn off_the_workers<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}
