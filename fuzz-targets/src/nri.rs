//! NRI plugins' bytes: the connection multiplexer and ttrpc inside it, and the replies a plugin
//! answers `CreateContainer` with, merged and applied to a spec.

use crishim_nri::{api, merge::Merge, mux, oci, ttrpc};
use prost::Message as _;

/// Bytes from a plugin's socket, in arbitrary pieces: mux frames, the ttrpc messages of each
/// logical connection, and the requests and responses they carry.
pub fn nri_wire(data: &[u8]) {
    let mut frames = mux::Decoder::default();
    let mut conns: [ttrpc::Decoder; 2] = Default::default();
    // The first byte picks how the stream is cut, as reads of a socket would cut it.
    let (step, rest) = match data.split_first() {
        Some((s, rest)) => (usize::from(*s).max(1), rest),
        None => return,
    };
    for piece in rest.chunks(step) {
        frames.extend(piece);
        loop {
            match frames.next_frame() {
                Ok(Some(f)) => {
                    assert!(f.payload.len() <= mux::MAX_PAYLOAD);
                    let Some(conn) = conns.get_mut((f.conn as usize).wrapping_sub(1)) else {
                        continue;
                    };
                    conn.extend(&f.payload);
                    while let Ok(Some(m)) = conn.next_message() {
                        assert!(m.payload.len() <= ttrpc::MAX_MESSAGE);
                        let _ = ttrpc::Request::decode(m.payload.clone());
                        let _ = ttrpc::Response::decode(m.payload);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        // Nothing holds more than one frame's worth of bytes.
        assert!(frames.pending() <= mux::HEADER_LEN + mux::MAX_PAYLOAD + step);
    }
}

/// Replies of plugins to one `CreateContainer`: the first byte splits the input between two
/// plugins' replies, which are merged in order and applied to a spec. Nothing may panic, and
/// what merges stays within the bounds.
pub fn nri_reply(data: &[u8]) {
    let Some((cut, rest)) = data.split_first() else {
        return;
    };
    let cut = (usize::from(*cut) * rest.len() / 255).min(rest.len());
    let (a, b) = rest.split_at(cut);
    let container = api::Container {
        id: "fuzzed".into(),
        ..Default::default()
    };
    let mut merge = Merge::new(&container);
    for (plugin, bytes) in [("10-a", a), ("20-b", b)] {
        if let Ok(reply) = api::CreateContainerResponse::decode(bytes) {
            let _ = merge.reply(plugin, reply);
        }
    }
    let merged = merge.finish();
    assert!(crishim_nri::limits::check_adjustment("merged", &merged.adjust).is_ok());
    let mut spec = oci_spec::runtime::Spec::default();
    let _ = oci::apply(&mut spec, &merged.adjust);
}
