//! Tests of the client and its shared request path, and the fixtures the other modules' tests use:
//! a loopback HTTP server and a repository on it.

use super::*;
use crate::registry::config::{HostConfig, MirrorConfig, TlsConfig};

#[test]
fn endpoints_list_mirrors_then_upstream() {
    let mut cfg = RegistryConfig::default();
    cfg.mirrors.insert(
        "docker.io".into(),
        MirrorConfig {
            endpoint: vec![
                "http://127.0.0.1:5000".into(),
                "https://m.example.com".into(),
            ],
        },
    );
    cfg.configs.insert(
        "r.example.com".into(),
        HostConfig {
            tls: Some(TlsConfig {
                insecure_skip_verify: true,
            }),
            ..Default::default()
        },
    );
    let c = RegistryClient::new(cfg).unwrap();
    let urls: Vec<String> = c
        .endpoints("docker.io", false)
        .iter()
        .map(|e| e.base.to_string())
        .collect();
    assert_eq!(
        urls,
        [
            "http://127.0.0.1:5000/",
            "https://m.example.com/",
            "https://registry-1.docker.io/"
        ]
    );
    let eps = c.endpoints("r.example.com", false);
    assert_eq!(eps.len(), 2, "insecure hosts fall back to http");
    assert!(eps[0].insecure_tls);
    let urls: Vec<String> = c
        .endpoints("127.0.0.1:5001", false)
        .iter()
        .map(|e| e.base.to_string())
        .collect();
    assert_eq!(urls, ["https://127.0.0.1:5001/", "http://127.0.0.1:5001/"]);
}

/// A one-request-per-connection HTTP server on loopback; `answer` gets each request's head.
pub(super) async fn serve(answer: impl Fn(&str, u16) -> Vec<u8> + Send + Sync + 'static) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let reply = answer(&String::from_utf8_lossy(&head), port);
                let _ = sock.write_all(&reply).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    port
}

pub(super) fn repo(
    client: &RegistryClient,
    port: u16,
    creds: Option<Credentials>,
) -> Repository<'_> {
    Repository {
        client,
        endpoint: Endpoint::at(
            Url::parse(&format!("http://127.0.0.1:{port}")).unwrap(),
            false,
            true,
        ),
        repository: "r".into(),
        creds,
    }
}

#[tokio::test]
async fn a_hosts_toml_host_gets_its_headers_and_api_path() {
    let seen = std::sync::Arc::new(Mutex::new(String::new()));
    let log = seen.clone();
    let port = serve(move |head, _| {
        log.lock().unwrap().push_str(head);
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec()
    })
    .await;
    let certs = tempfile::tempdir().unwrap();
    std::fs::create_dir(certs.path().join("docker.io")).unwrap();
    std::fs::write(
        certs.path().join("docker.io/hosts.toml"),
        format!(
            "server = \"http://127.0.0.1:{port}/custom\"\noverride_path = true\n\
             [header]\nx-crishim-test = [\"a\", \"b\"]\n"
        ),
    )
    .unwrap();
    let cfg = RegistryConfig {
        config_path: Some(certs.path().to_path_buf()),
        ..Default::default()
    };
    let client = RegistryClient::new(cfg).unwrap();
    let reference = Reference::parse("busybox").unwrap();
    assert!(client.resolve(&reference, None).await.is_err());
    let head = seen.lock().unwrap().to_lowercase();
    assert!(
        head.starts_with("get /custom/library/busybox/manifests/latest "),
        "{head}"
    );
    assert!(head.contains("x-crishim-test: a"), "{head}");
    assert!(head.contains("x-crishim-test: b"), "{head}");
}

fn chunked(total: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let chunk = vec![b'{'; 64 << 10];
    let mut sent = 0;
    while sent < total {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(&chunk);
        out.extend_from_slice(b"\r\n");
        sent += chunk.len();
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[tokio::test]
async fn replies_are_capped_by_the_bytes_read_not_by_their_headers() {
    let over = MAX_MANIFEST as usize + (1 << 20);
    for head in [
        // Chunked, no length at all.
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        // A Content-Length that lies small next to a chunked body (chunked wins).
        "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        let reply = [head.as_bytes(), &chunked(over)].concat();
        let port = serve(move |_, _| reply.clone()).await;
        let client = RegistryClient::new(RegistryConfig::default()).unwrap();
        let e = repo(&client, port, None)
            .manifest("v1")
            .await
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains(&format!("larger than {MAX_MANIFEST} bytes")),
            "{head:?}: {e}"
        );
    }
    // Delimited by the connection's end.
    let port = serve(move |_, _| {
        let mut r = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec();
        r.extend(vec![b'x'; over]);
        r
    })
    .await;
    let client = RegistryClient::new(RegistryConfig::default()).unwrap();
    let e = repo(&client, port, None)
        .manifest("v1")
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("larger than"), "{e}");
}

#[tokio::test]
async fn error_bodies_are_read_only_as_far_as_they_are_shown() {
    let port = serve(|_, _| {
        [
            &b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            &chunked(64 << 20),
        ]
        .concat()
    })
    .await;
    let client = RegistryClient::new(RegistryConfig::default()).unwrap();
    let e = repo(&client, port, None)
        .manifest("v1")
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), crate::ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().len() < 1024, "{} bytes", e.to_string().len());
}
