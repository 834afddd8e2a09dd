//! The streaming HTTP server: one-time URLs for Exec, Attach and PortForward, upgraded to SPDY/3.1
//! or WebSocket when the client connects.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use crishim_proto::cri;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::backend::Backend;
use crate::remotecommand::{self, Opts};
use crate::{portforward, StreamingError};

/// The kubelet's cap on URLs handed out and not yet used.
const MAX_IN_FLIGHT: usize = 1000;
const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen; port 0 picks one. The URLs name the address actually bound.
    pub address: SocketAddr,
    /// How long a URL stays usable (one minute in the kubelet).
    pub token_ttl: Duration,
    /// Serve HTTPS with this certificate chain and key (PEM files).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Connections served at once, upgraded sessions included; over it, new ones get 503.
    pub max_connections: usize,
    /// A connection must finish its TLS handshake and its HTTP request (up to the upgrade) within
    /// this, or it is closed.
    pub handshake_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            token_ttl: Duration::from_secs(60),
            tls: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// `[streaming] max_connections` by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Long enough for a TLS handshake over a slow link, short enough that idle sockets go.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// A port-forward over WebSocket names its ports as channel pairs numbered by one byte.
const MAX_WS_PORTS: usize = 64;

enum Pending {
    Exec(cri::ExecRequest),
    Attach(cri::AttachRequest),
    PortForward(cri::PortForwardRequest),
}

struct Tokens {
    ttl: Duration,
    map: Mutex<HashMap<String, (Pending, Instant)>>,
}

impl Tokens {
    fn insert(&self, p: Pending) -> Result<String, StreamingError> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, (_, at)| now.duration_since(*at) < self.ttl);
        if map.len() >= MAX_IN_FLIGHT {
            return Err(StreamingError::TooManyInFlight);
        }
        let mut raw = [0u8; 12];
        crishim_sys::random::fill(&mut raw).map_err(StreamingError::Random)?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        map.insert(token.clone(), (p, now));
        Ok(token)
    }

    /// The request behind `token`, once: a used or expired token is gone.
    fn take(&self, token: &str) -> Option<Pending> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let (p, at) = map.remove(token)?;
        (at.elapsed() < self.ttl).then_some(p)
    }
}

/// A running streaming server.
pub struct Server {
    base_url: String,
    tokens: Arc<Tokens>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub async fn start(config: Config, backend: Arc<dyn Backend>) -> Result<Self, StreamingError> {
        let listener = TcpListener::bind(config.address)
            .await
            .map_err(|e| StreamingError::Bind(config.address, e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| StreamingError::Bind(config.address, e))?;
        let tls = match &config.tls {
            Some((cert, key)) => Some(crate::tls::acceptor(cert, key)?),
            None => None,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let tokens = Arc::new(Tokens {
            ttl: config.token_ttl,
            map: Mutex::new(HashMap::new()),
        });
        let state = Arc::new(State {
            tokens: tokens.clone(),
            backend,
            slots: Arc::new(tokio::sync::Semaphore::new(config.max_connections)),
            handshake_timeout: config.handshake_timeout,
        });
        let task = tokio::spawn(accept_loop(listener, tls, state));
        Ok(Server {
            base_url: format!("{scheme}://{addr}"),
            tokens,
            task,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn exec_url(&self, req: cri::ExecRequest) -> Result<String, StreamingError> {
        let t = self.tokens.insert(Pending::Exec(req))?;
        Ok(format!("{}/exec/{t}", self.base_url))
    }

    pub fn attach_url(&self, req: cri::AttachRequest) -> Result<String, StreamingError> {
        let t = self.tokens.insert(Pending::Attach(req))?;
        Ok(format!("{}/attach/{t}", self.base_url))
    }

    pub fn port_forward_url(&self, req: cri::PortForwardRequest) -> Result<String, StreamingError> {
        let t = self.tokens.insert(Pending::PortForward(req))?;
        Ok(format!("{}/portforward/{t}", self.base_url))
    }
}

struct State {
    tokens: Arc<Tokens>,
    backend: Arc<dyn Backend>,
    /// One permit per connection, held by its upgraded session for as long as that runs.
    slots: Arc<tokio::sync::Semaphore>,
    handshake_timeout: Duration,
}

/// A connection's permit, taken by the session it upgrades to.
type Slot = Arc<Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>;

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<State>,
) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors, typically: back off instead of spinning.
                tracing::debug!(error = %e, "accepting a streaming connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over the limit the connection is still answered, with 503, within the same deadline.
        let slot: Slot = Arc::new(Mutex::new(state.slots.clone().try_acquire_owned().ok()));
        let state = state.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let deadline = state.handshake_timeout;
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                let slot = slot.clone();
                async move { Ok::<_, std::convert::Infallible>(admit(req, state, slot)) }
            });
            // (keep-alive stays on: without it hyper answers the upgrade with `Connection: close`,
            // which WebSocket clients refuse. The deadline below ends idle connections.)
            let http = hyper::server::conn::http1::Builder::new();
            let serve = async {
                match tls {
                    Some(acceptor) => match acceptor.accept(tcp).await {
                        Ok(stream) => {
                            http.serve_connection(TokioIo::new(stream), service)
                                .with_upgrades()
                                .await
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "TLS handshake");
                            Ok(())
                        }
                    },
                    None => {
                        http.serve_connection(TokioIo::new(tcp), service)
                            .with_upgrades()
                            .await
                    }
                }
            };
            // Once the upgrade is answered the connection future ends; the session goes on in
            // its own task. So this deadline bounds the handshake and the requests before it.
            match tokio::time::timeout(deadline, serve).await {
                Ok(Err(e)) => tracing::debug!(error = %e, "streaming connection"),
                Err(_) => {
                    tracing::debug!("streaming connection closed: no request within {deadline:?}")
                }
                Ok(Ok(())) => {}
            }
        });
    }
}

/// Serve the request if its connection got a slot; 503 if not.
fn admit(req: Request<Incoming>, state: Arc<State>, slot: Slot) -> Response<Full<Bytes>> {
    let permit = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    match permit {
        Some(permit) => handle(req, state, permit),
        None => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many streaming sessions at once; try again later",
        ),
    }
}

fn plain(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{msg}\n"))));
    *r.status_mut() = status;
    r
}

/// Every value of a header, comma lists split.
fn header_values(h: &HeaderMap, name: &str) -> Vec<String> {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The first protocol the client offers that we speak; the default when it offers none.
fn negotiate(offered: &[String], ours: &[&str], default: &str) -> Option<String> {
    if offered.is_empty() {
        return Some(default.to_string());
    }
    offered.iter().find(|o| ours.contains(&o.as_str())).cloned()
}

/// Parse a WebSocket port-forward's `?ports=80,8080` (or `port=`): the ports it asks for.
fn ws_ports(query: &str) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (_, v) in query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "ports" || *k == "port")
    {
        for p in v.split(',') {
            match p.parse::<u16>() {
                Ok(port) if port > 0 => ports.push(port),
                _ => return Err(format!("{p:?} in the query is not a port number")),
            }
            if ports.len() > MAX_WS_PORTS {
                return Err(format!("more than {MAX_WS_PORTS} ports in the query"));
            }
        }
    }
    Ok(ports)
}

/// The ports a WebSocket port-forward serves: those of its query, each of which must be one the
/// `PortForward` request named (when it named any, as the SPDY path enforces too); the
/// request's own when the query names none.
fn ws_forward_ports(query: &str, requested: &[i32]) -> Result<Vec<u16>, String> {
    let asked = ws_ports(query)?;
    if asked.is_empty() {
        return Ok(requested
            .iter()
            .filter_map(|p| u16::try_from(*p).ok())
            .take(MAX_WS_PORTS)
            .collect());
    }
    if !requested.is_empty() {
        if let Some(p) = asked.iter().find(|p| !requested.contains(&i32::from(**p))) {
            return Err(format!(
                "port {p} is not one of the ports {requested:?} the PortForward request named"
            ));
        }
    }
    Ok(asked)
}

fn handle(
    req: Request<Incoming>,
    state: Arc<State>,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_matches('/').to_string();
    let Some((kind, token)) = path.split_once('/') else {
        return plain(StatusCode::NOT_FOUND, "not found");
    };
    let Some(pending) = state.tokens.take(token) else {
        return plain(
            StatusCode::NOT_FOUND,
            "unknown or expired token: ask the runtime for a new URL",
        );
    };
    if !matches!(
        (kind, &pending),
        ("exec", Pending::Exec(_))
            | ("attach", Pending::Attach(_))
            | ("portforward", Pending::PortForward(_))
    ) {
        return plain(StatusCode::NOT_FOUND, "the token is not for this endpoint");
    }
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let is_pf = matches!(pending, Pending::PortForward(_));
    let ws = upgrade == "websocket";
    let (offered, ours, default): (Vec<String>, &[&str], &str) = if ws {
        let ours = if is_pf {
            portforward::WS_PROTOCOLS
        } else {
            remotecommand::WS_PROTOCOLS
        };
        (
            header_values(req.headers(), "sec-websocket-protocol"),
            ours,
            "channel.k8s.io",
        )
    } else if upgrade.starts_with("spdy/3") {
        let (ours, default): (&[&str], &str) = if is_pf {
            (&[portforward::SPDY_PROTOCOL], portforward::SPDY_PROTOCOL)
        } else {
            (remotecommand::SPDY_PROTOCOLS, "channel.k8s.io")
        };
        (
            header_values(req.headers(), "x-stream-protocol-version"),
            ours,
            default,
        )
    } else {
        return plain(
            StatusCode::BAD_REQUEST,
            "this endpoint needs an Upgrade to SPDY/3.1 or websocket",
        );
    };
    let Some(protocol) = negotiate(&offered, ours, default) else {
        return plain(
            StatusCode::FORBIDDEN,
            &format!("none of the offered protocols {offered:?} is supported; supported: {ours:?}"),
        );
    };
    let query = req.uri().query().unwrap_or_default().to_string();
    let ws_ports = match &pending {
        Pending::PortForward(r) if ws => match ws_forward_ports(&query, &r.port) {
            Ok(p) => p,
            Err(msg) => return plain(StatusCode::FORBIDDEN, &msg),
        },
        _ => Vec::new(),
    };
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
    if ws {
        let key = req
            .headers()
            .get("sec-websocket-key")
            .map(|k| k.as_bytes().to_vec())
            .unwrap_or_default();
        if key.is_empty() {
            return plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
        }
        use sha1::Digest;
        let mut sha = sha1::Sha1::new();
        sha.update(&key);
        sha.update(WS_GUID.as_bytes());
        let accept = base64::engine::general_purpose::STANDARD.encode(sha.finalize());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert("sec-websocket-accept", accept.parse().unwrap());
        if !offered.is_empty() {
            h.insert("sec-websocket-protocol", protocol.parse().unwrap());
        }
    } else {
        h.insert(header::UPGRADE, "SPDY/3.1".parse().unwrap());
        h.insert("x-stream-protocol-version", protocol.parse().unwrap());
    }
    tokio::spawn(async move {
        // The session holds its connection's slot until it ends.
        let _permit = permit;
        let upgraded = match hyper::upgrade::on(req).await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                tracing::debug!(error = %e, "upgrading a streaming connection");
                return;
            }
        };
        serve(
            upgraded,
            ws,
            protocol,
            pending,
            ws_ports,
            state.backend.clone(),
        )
        .await;
    });
    resp
}

async fn serve<IO>(
    io: IO,
    ws: bool,
    protocol: String,
    pending: Pending,
    ws_ports: Vec<u16>,
    backend: Arc<dyn Backend>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (run, opts): (remotecommand::Run, Opts) = match pending {
        Pending::Exec(r) => {
            let opts = Opts::new(r.stdin, r.stdout, r.stderr, r.tty);
            (Box::new(move |io| backend.exec(r, io)), opts)
        }
        Pending::Attach(r) => {
            let opts = Opts::new(r.stdin, r.stdout, r.stderr, r.tty);
            (Box::new(move |io| backend.attach(r, io)), opts)
        }
        Pending::PortForward(r) => {
            return if ws {
                // WebSocket clients name their ports in the query, checked in `handle`.
                let stream = ws_server(io).await;
                portforward::serve_ws(stream, protocol, r.pod_sandbox_id, ws_ports, backend).await
            } else {
                let ports: Vec<u16> = r
                    .port
                    .iter()
                    .filter_map(|p| u16::try_from(*p).ok())
                    .collect();
                portforward::serve_spdy(io, r.pod_sandbox_id, ports, backend).await
            };
        }
    };
    if ws {
        let stream = ws_server(io).await;
        remotecommand::serve_ws(stream, protocol, opts, run).await
    } else {
        remotecommand::serve_spdy(io, &protocol, opts, run).await
    }
}

/// The server side of an upgraded WebSocket connection.
async fn ws_server<IO>(io: IO) -> tokio_tungstenite::WebSocketStream<IO>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::protocol::Role;
    tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Server, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_one_time_and_expire() {
        let t = Tokens {
            ttl: Duration::from_millis(50),
            map: Mutex::new(HashMap::new()),
        };
        let a = t.insert(Pending::Exec(Default::default())).unwrap();
        assert!(t.take(&a).is_some());
        assert!(t.take(&a).is_none(), "a token works once");
        let b = t.insert(Pending::Exec(Default::default())).unwrap();
        std::thread::sleep(Duration::from_millis(60));
        assert!(t.take(&b).is_none(), "an expired token is refused");
    }

    #[test]
    fn websocket_ports_must_be_among_the_requests() {
        assert_eq!(ws_forward_ports("ports=80", &[80, 81]), Ok(vec![80]));
        assert_eq!(ws_forward_ports("", &[80, 81]), Ok(vec![80, 81]));
        assert_eq!(ws_forward_ports("port=22", &[]), Ok(vec![22]));
        let e = ws_forward_ports("ports=80,22", &[80]).unwrap_err();
        assert!(e.contains("port 22"), "{e}");
        assert!(ws_forward_ports("ports=x", &[]).is_err());
        assert!(ws_forward_ports("ports=0", &[]).is_err());
        let many = (1..=200)
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(",");
        assert!(ws_forward_ports(&format!("ports={many}"), &[]).is_err());
    }

    #[test]
    fn protocols_are_negotiated_in_the_clients_order() {
        let offered = vec!["v5.channel.k8s.io".to_string(), "v4.channel.k8s.io".into()];
        assert_eq!(
            negotiate(&offered, remotecommand::SPDY_PROTOCOLS, "channel.k8s.io").as_deref(),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(
            negotiate(&[], remotecommand::SPDY_PROTOCOLS, "channel.k8s.io").as_deref(),
            Some("channel.k8s.io")
        );
        assert_eq!(
            negotiate(&["v9".into()], remotecommand::SPDY_PROTOCOLS, "x"),
            None
        );
    }
}
