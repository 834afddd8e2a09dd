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
mod tests;
