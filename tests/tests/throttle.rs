//! The throttling proxy (`crishim_tests::throttle`) in front of a real docker-registry: it holds
//! the rate over several connections, turns ranged GETs into whole-blob 200s when told to ignore
//! `Range`, and stalls ranged replies after a set number of bytes, from the moment it is told to,
//! without closing the connection until it is dropped.

use std::io::Read as _;
use std::time::{Duration, Instant};

use crishim_tests::image::Pusher;
use crishim_tests::{Registry, RegistryOptions, Throttle, ThrottleOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const REPO: &str = "throttle/blob";

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut v)
        .unwrap();
    v
}

async fn get(
    client: &reqwest::Client,
    base: &str,
    digest: &str,
    range: Option<&str>,
) -> (u16, Vec<u8>) {
    let mut r = client.get(format!("{base}/v2/{REPO}/blobs/{digest}"));
    if let Some(range) = range {
        r = r.header("Range", range);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn the_rate_holds_for_one_connection_and_is_shared_by_several() {
    let reg = Registry::start(RegistryOptions::default()).await.unwrap();
    let data = random_bytes(20 << 20);
    let digest = reg.pusher().unwrap().push_blob(REPO, &data).await.unwrap();
    let proxy = Throttle::in_front_of(&reg, ThrottleOptions::new())
        .await
        .unwrap();
    let client = reg.http_client().unwrap();
    let base = proxy.url();

    // Unlimited first: the proxy alone is far quicker than the limits below.
    let t0 = Instant::now();
    assert_eq!(
        get(&client, &base, &digest, None).await,
        (200, data.clone())
    );
    let free = t0.elapsed();
    assert!(free < Duration::from_millis(1800), "unthrottled: {free:?}");

    proxy.set_rate(10 << 20);
    let t0 = Instant::now();
    assert_eq!(
        get(&client, &base, &digest, None).await,
        (200, data.clone())
    );
    let one = t0.elapsed();
    assert!(
        one >= Duration::from_millis(1800),
        "20 MiB at 10 MiB/s: {one:?}"
    );

    // Two connections at once share 20 MiB/s: 40 MiB take as long as 20 did alone.
    proxy.set_rate(20 << 20);
    let t0 = Instant::now();
    let (a, b) = tokio::join!(
        get(&client, &base, &digest, None),
        get(&client, &base, &digest, None)
    );
    let two = t0.elapsed();
    assert_eq!((a.0, b.0), (200, 200));
    assert!(
        a.1 == data && b.1 == data,
        "the bodies differ from the blob"
    );
    assert!(
        two >= Duration::from_millis(1800),
        "2 x 20 MiB at 20 MiB/s: {two:?}"
    );

    assert_eq!(proxy.body_bytes(), 4 * data.len() as u64);
    assert_eq!((proxy.requests(), proxy.ranged_requests()), (4, 0));
}

#[tokio::test]
async fn ignoring_range_turns_a_ranged_get_into_the_whole_blob() {
    let reg = Registry::start(RegistryOptions::default()).await.unwrap();
    let proxy = Throttle::in_front_of(&reg, ThrottleOptions::new().rate(100 << 20))
        .await
        .unwrap();
    let client = reg.http_client().unwrap();
    // Pushed through the proxy: request bodies and the upload's Location go through it too.
    let data = random_bytes(1 << 20);
    let digest = Pusher::new(client.clone(), &proxy.url(), None)
        .push_blob(REPO, &data)
        .await
        .unwrap();
    assert_eq!(
        reg.pusher().unwrap().get_blob(REPO, &digest).await.unwrap(),
        data
    );

    let (status, body) = get(&client, &proxy.url(), &digest, Some("bytes=100-199")).await;
    assert_eq!((status, body.as_slice()), (206, &data[100..200]));

    proxy.set_ignore_range(true);
    let (status, body) = get(&client, &proxy.url(), &digest, Some("bytes=100-199")).await;
    assert_eq!(status, 200);
    assert!(body == data, "got {} bytes, not the whole blob", body.len());
    assert_eq!(proxy.ranged_requests(), 2);

    // Set from the start, through the options.
    let strict = Throttle::in_front_of(&reg, ThrottleOptions::new().ignore_range())
        .await
        .unwrap();
    let (status, body) = get(&client, &strict.url(), &digest, Some("bytes=0-0")).await;
    assert_eq!((status, body.len()), (200, data.len()));
}

/// Send a GET on `sock`; return the status and the Content-Length of the reply's head.
async fn raw_get(sock: &mut TcpStream, host: &str, path: &str, range: &str) -> (u16, usize) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nRange: {range}\r\n\r\n");
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(
            sock.read(&mut b).await.unwrap(),
            1,
            "closed inside the head"
        );
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .expect("Content-Length");
    (status, len)
}

/// Read until `quiet` passes without a byte; returns what came, and whether the peer closed.
async fn read_until_quiet(sock: &mut TcpStream, quiet: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match tokio::time::timeout(quiet, sock.read(&mut buf)).await {
            Err(_) => return (got, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn a_stall_switched_on_stops_ranged_replies_after_n_bytes_and_holds_the_connection() {
    const N: usize = 4096;
    let reg = Registry::start(RegistryOptions::default()).await.unwrap();
    let data = random_bytes(1 << 20);
    let digest = reg.pusher().unwrap().push_blob(REPO, &data).await.unwrap();
    let proxy = Throttle::in_front_of(&reg, ThrottleOptions::new().rate(100 << 20))
        .await
        .unwrap();
    let path = format!("/v2/{REPO}/blobs/{digest}");
    let mut sock = TcpStream::connect(proxy.addr()).await.unwrap();

    // Before the switch a ranged reply comes whole (a TOC, say).
    let (status, len) = raw_get(&mut sock, &proxy.host(), &path, "bytes=0-65535").await;
    assert_eq!((status, len), (206, 65536));
    let mut body = vec![0u8; len];
    sock.read_exact(&mut body).await.unwrap();
    assert_eq!(body, data[..65536]);

    // Then, on the same connection, a chunk fetch stalls after N bytes and stays open.
    proxy.set_stall_ranged_after(Some(N as u64));
    let (status, len) = raw_get(&mut sock, &proxy.host(), &path, "bytes=65536-131071").await;
    assert_eq!((status, len), (206, 65536));
    let (got, closed) = read_until_quiet(&mut sock, Duration::from_secs(2)).await;
    assert_eq!(got.len(), N, "bytes before the stall");
    assert_eq!(got, data[65536..65536 + N]);
    assert!(!closed, "the stalled connection was closed");
    assert_eq!(proxy.stalled_replies(), 1);

    // Replies to requests without Range are not stalled.
    let client = reg.http_client().unwrap();
    let (status, body) = get(&client, &proxy.url(), &digest, None).await;
    assert!(status == 200 && body == data, "a plain GET: {status}");

    // Dropping the proxy closes the stalled connection.
    drop(proxy);
    let (rest, closed) = read_until_quiet(&mut sock, Duration::from_secs(5)).await;
    assert!(
        rest.is_empty() && closed,
        "after the drop: {} bytes, closed {closed}",
        rest.len()
    );
}
