//! A CRI client connection over the daemon's unix socket, for `crishim run` and the tests.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// A tonic channel to the CRI server on `socket`; each call fails after `timeout`.
pub async fn connect_unix(
    socket: &Path,
    timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    // The URI is required by tonic and ignored by the connector.
    Endpoint::from_static("http://[::]:50051")
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}
