//! NRI's wire: the connection multiplexer and ttrpc inside it, as a hostile plugin sends them.

use crishim_nri::{mux, ttrpc};
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
