use super::*;

/// Echoes the payload; `hang` never answers; `fail` answers NotFound; others are Unimplemented.
struct Echo;

impl Handler for Echo {
    fn handle(&self, service: String, method: String, payload: Bytes) -> HandlerFuture {
        Box::pin(async move {
            match method.as_str() {
                "echo" => Ok(payload),
                "hang" => std::future::pending().await,
                "fail" => Err(Status::new(code::NOT_FOUND, "no such thing")),
                _ => Err(Status::new(
                    code::UNIMPLEMENTED,
                    format!("{service}/{method} not implemented"),
                )),
            }
        })
    }
}

fn pair() -> (Endpoint, Endpoint) {
    let (a, b) = UnixStream::pair().unwrap();
    (
        Endpoint::start(a, Role::Runtime, Arc::new(Echo)),
        Endpoint::start(b, Role::Plugin, Arc::new(Echo)),
    )
}

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn calls_go_both_ways_and_replies_match_their_calls() {
    let (runtime, plugin) = pair();
    let (a, b) = tokio::join!(
        runtime.call("svc", "echo", b"to plugin".to_vec(), T),
        plugin.call("svc", "echo", b"to runtime".to_vec(), T),
    );
    assert_eq!(&a.unwrap()[..], b"to plugin");
    assert_eq!(&b.unwrap()[..], b"to runtime");
    // Many at once, each gets its own reply.
    let calls = (0..50u32).map(|i| {
        let r = runtime.clone();
        async move { r.call("svc", "echo", i.to_be_bytes().to_vec(), T).await }
    });
    let replies = futures_join_all(calls).await;
    for (i, r) in replies.into_iter().enumerate() {
        assert_eq!(&r.unwrap()[..], &(i as u32).to_be_bytes());
    }
}

async fn futures_join_all<F: Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut out = Vec::new();
    let handles: Vec<_> = fs.map(Box::pin).collect();
    for h in handles {
        out.push(h.await);
    }
    out
}

#[tokio::test]
async fn statuses_come_back_as_errors() {
    let (runtime, _plugin) = pair();
    let e = runtime.call("svc", "fail", vec![], T).await.unwrap_err();
    assert_eq!(
        e,
        CallError::Status {
            code: code::NOT_FOUND,
            message: "no such thing".into()
        }
    );
    assert!(!e.is_fatal());
    let e = runtime.call("svc", "other", vec![], T).await.unwrap_err();
    assert!(e.is_unimplemented());
}

#[tokio::test]
async fn a_peer_that_never_answers_costs_the_timeout_only() {
    let (runtime, _plugin) = pair();
    let start = std::time::Instant::now();
    let e = runtime
        .call("svc", "hang", vec![], Duration::from_millis(100))
        .await
        .unwrap_err();
    assert_eq!(e, CallError::Timeout(Duration::from_millis(100)));
    assert!(e.is_fatal());
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(
        runtime.pending().is_empty(),
        "the timed-out call is forgotten"
    );
}

#[tokio::test]
async fn a_peer_that_goes_away_fails_pending_calls_at_once() {
    let (a, b) = UnixStream::pair().unwrap();
    let runtime = Endpoint::start(a, Role::Runtime, Arc::new(Echo));
    let call = tokio::spawn({
        let r = runtime.clone();
        async move { r.call("svc", "echo", vec![], Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(b);
    let e = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("not the call's timeout")
        .unwrap()
        .unwrap_err();
    assert_eq!(e, CallError::Closed);
    runtime.closed().await;
    assert!(runtime.close_reason().is_some());
    assert_eq!(
        runtime.call("svc", "echo", vec![], T).await.unwrap_err(),
        CallError::Closed
    );
}

/// Raw bytes from a hostile peer close the connection with a reason, and nothing else.
async fn closes_on(bytes: &[u8]) -> String {
    let (a, mut b) = UnixStream::pair().unwrap();
    let runtime = Endpoint::start(a, Role::Runtime, Arc::new(Echo));
    b.write_all(bytes).await.unwrap();
    tokio::time::timeout(T, runtime.closed())
        .await
        .expect("closed");
    runtime.close_reason().unwrap()
}

#[tokio::test]
async fn oversized_reserved_or_nonsense_frames_close_the_connection() {
    // A mux frame claiming 4 GiB: refused from its header.
    let mut b = vec![0, 0, 0, 1];
    b.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(closes_on(&b).await.contains("over the limit"));
    // Connection 0 is reserved.
    assert!(closes_on(&[0, 0, 0, 0, 0, 0, 0, 1, 9])
        .await
        .contains("reserved"));
    // A ttrpc message of an unknown type on the serving connection.
    let mut inner = vec![0, 0, 0, 0, 0, 0, 0, 1, 9, 0];
    let mut b = vec![0, 0, 0, 2];
    b.extend_from_slice(&(inner.len() as u32).to_be_bytes());
    b.append(&mut inner);
    assert!(closes_on(&b).await.contains("unknown type"));
    // A request whose envelope is not protobuf.
    let payload = [0xff, 0xff, 0xff];
    let mut inner = Vec::new();
    inner.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    inner.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
    inner.extend_from_slice(&payload);
    let mut b = vec![0, 0, 0, 2];
    b.extend_from_slice(&(inner.len() as u32).to_be_bytes());
    b.extend_from_slice(&inner);
    assert!(closes_on(&b).await.contains("bad request"));
}

#[tokio::test]
async fn frames_for_unopened_connections_are_dropped() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let runtime = Endpoint::start(a, Role::Runtime, Arc::new(Echo));
    b.write_all(&[0, 0, 0, 7, 0, 0, 0, 3, 1, 2, 3])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!runtime.is_closed());
}

#[tokio::test]
async fn requests_beyond_the_cap_are_refused_not_queued() {
    let (runtime, plugin) = pair();
    // The runtime side's handler hangs on each: the cap fills, the next is refused at once.
    let hung: Vec<_> = (0..MAX_CONCURRENT_SERVED)
        .map(|_| {
            let p = plugin.clone();
            tokio::spawn(
                async move { p.call("svc", "hang", vec![], Duration::from_secs(30)).await },
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let e = plugin.call("svc", "echo", vec![], T).await.unwrap_err();
    assert!(matches!(e, CallError::Status { code, .. } if code == code::RESOURCE_EXHAUSTED));
    runtime.close("test over");
    for h in hung {
        h.abort();
    }
}
