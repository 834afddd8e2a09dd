//! The client side of the streaming protocols: what `kubectl exec` and `crictl exec` do, for tests
//! and tools.

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::backend::TermSize;
use crate::spdy::{self, Connection, Role};
use crate::status::exit_code_of;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad URL {0:?}")]
    Url(String),
    #[error("connecting: {0}")]
    Io(#[from] std::io::Error),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("the server refused the upgrade: {0} {1}")]
    Refused(StatusCode, String),
    #[error(transparent)]
    Spdy(#[from] spdy::SpdyError),
    #[error("websocket: {0}")]
    Ws(#[from] tokio_tungstenite::tungstenite::Error),
}

fn host_and_path(url: &str) -> Result<(String, String), ClientError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ClientError::Url(url.to_string()))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    Ok((host.to_string(), format!("/{path}")))
}

/// Upgrade `url` to SPDY/3.1 offering `protocols`; the connection and the protocol chosen.
pub async fn spdy_connect(
    url: &str,
    protocols: &[&str],
) -> Result<(Connection, String), ClientError> {
    let (io, chosen) = spdy_upgrade(url, protocols).await?;
    Ok((Connection::new(io, Role::Client), chosen))
}

/// The raw upgraded connection of [`spdy_connect`], for peers that write their own frames.
pub async fn spdy_upgrade(
    url: &str,
    protocols: &[&str],
) -> Result<(TokioIo<hyper::upgrade::Upgraded>, String), ClientError> {
    let (host, path) = host_and_path(url)?;
    let tcp = TcpStream::connect(&host).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn.with_upgrades());
    let mut req = Request::post(path)
        .header(header::HOST, &host)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1");
    for p in protocols {
        req = req.header("X-Stream-Protocol-Version", *p);
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| ClientError::Url(e.to_string()))?;
    let resp = sender.send_request(req).await?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status();
        use http_body_util::BodyExt;
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
            .unwrap_or_default();
        return Err(ClientError::Refused(status, body));
    }
    let chosen = resp
        .headers()
        .get("x-stream-protocol-version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let upgraded = hyper::upgrade::on(resp).await?;
    Ok((TokioIo::new(upgraded), chosen))
}

/// What an exec or attach returned.
#[derive(Debug, Default)]
pub struct Finished {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The error stream's content (a Status JSON with protocol v4).
    pub status: Vec<u8>,
    /// The exit code the status carries.
    pub exit_code: Option<i32>,
}

/// What to send.
#[derive(Default)]
pub struct Input {
    pub stdin: Option<Vec<u8>>,
    pub tty: bool,
    pub stderr: bool,
    /// Sent once the streams are up.
    pub resize: Option<TermSize>,
}

/// Run a remote command (exec or attach) over SPDY with protocol v4, as client-go does.
pub async fn spdy_remotecommand(url: &str, input: Input) -> Result<Finished, ClientError> {
    let (conn, _) = spdy_connect(url, &["v4.channel.k8s.io"]).await?;
    let open = |kind: &str| vec![("streamType".to_string(), kind.to_string())];
    let mut error = conn.open(open("error")).await?;
    error.tx.close().await?;
    let stdin = match input.stdin.is_some() {
        true => Some(conn.open(open("stdin")).await?),
        false => None,
    };
    let mut stdout = conn.open(open("stdout")).await?;
    stdout.tx.close().await?;
    let mut stderr = match input.stderr && !input.tty {
        true => {
            let s = conn.open(open("stderr")).await?;
            s.tx.close().await?;
            Some(s)
        }
        false => None,
    };
    if input.tty {
        let resize = conn.open(open("resize")).await?;
        if let Some(size) = input.resize {
            let msg = format!(r#"{{"Width":{},"Height":{}}}"#, size.width, size.height);
            resize.tx.write(msg.as_bytes()).await?;
        }
    }
    let send = async {
        if let (Some(s), Some(data)) = (&stdin, &input.stdin) {
            s.tx.write(data).await?;
            s.tx.close().await?;
        }
        Ok::<_, ClientError>(())
    };
    let (sent, out, err, status) = tokio::join!(
        send,
        collect(&mut stdout.rx),
        async {
            match &mut stderr {
                Some(s) => collect(&mut s.rx).await,
                None => Vec::new(),
            }
        },
        collect(&mut error.rx)
    );
    sent?;
    let exit_code = exit_code_of(&status);
    Ok(Finished {
        stdout: out,
        stderr: err,
        status,
        exit_code,
    })
}

/// Connect to `url` as a WebSocket client offering `protocols`; the stream and the protocol.
pub async fn ws_connect(
    url: &str,
    protocols: &[&str],
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<TcpStream>,
        Option<String>,
    ),
    ClientError,
> {
    let (host, _) = host_and_path(url)?;
    let tcp = TcpStream::connect(&host).await?;
    let ws_url = url.replacen("http://", "ws://", 1);
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = ws_url.into_client_request()?;
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        protocols
            .join(", ")
            .parse()
            .map_err(|_| ClientError::Url(url.to_string()))?,
    );
    let (ws, resp) = tokio_tungstenite::client_async(req, tcp).await?;
    let chosen = resp
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok((ws, chosen))
}

async fn collect(rx: &mut tokio::sync::mpsc::Receiver<Bytes>) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(b) = rx.recv().await {
        out.extend_from_slice(&b);
    }
    out
}
