//! The daemon ⇄ shim protocol: a JSON line (a request to the shim, its answer, the infra spec
//! it starts with), a starting shim's ready report or a pid file left on disk, then the frames
//! of a streaming connection.

use crishim_proto::shim::{frames, parse_ready, pid_file, InfraSpec, Request, Response};

use crate::input::split_at_byte;

pub fn shim_protocol(data: &[u8]) {
    let (line, mut rest) = split_at_byte(data, b'\n');
    let _ = serde_json::from_slice::<Request>(line);
    let _ = serde_json::from_slice::<Response>(line);
    let _ = serde_json::from_slice::<InfraSpec>(line);
    let _ = parse_ready(line);
    if let Ok(text) = std::str::from_utf8(line) {
        if let Some(r) = pid_file::parse(text) {
            assert!(r.pid > 0, "a pid file never names pid {}", r.pid);
        }
    }
    while let Some((head, after)) = rest.split_first_chunk::<{ frames::HEADER }>() {
        let (_kind, len) = frames::decode_header(*head);
        if len > frames::MAX_PAYLOAD {
            return;
        }
        rest = &after[len.min(after.len())..];
    }
}
