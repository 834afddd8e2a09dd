use super::*;

#[test]
fn frames_round_trip_and_arrive_byte_by_byte() {
    let mut out = BytesMut::new();
    encode(PLUGIN_SERVICE_CONN, b"hello", &mut out);
    // As NRI's own mux, an empty write sends no frame.
    encode(RUNTIME_SERVICE_CONN, b"", &mut out);
    assert_eq!(out.len(), HEADER_LEN + 5);
    encode(RUNTIME_SERVICE_CONN, b"ok", &mut out);
    assert_eq!(&out[..8], &[0, 0, 0, 1, 0, 0, 0, 5]);
    let mut d = Decoder::default();
    let mut frames = Vec::new();
    for b in out.iter() {
        d.extend(&[*b]);
        while let Some(f) = d.next_frame().unwrap() {
            frames.push(f);
        }
    }
    assert_eq!(
        frames,
        [
            Frame {
                conn: PLUGIN_SERVICE_CONN,
                payload: Bytes::from_static(b"hello")
            },
            Frame {
                conn: RUNTIME_SERVICE_CONN,
                payload: Bytes::from_static(b"ok")
            }
        ]
    );
    assert_eq!(d.pending(), 0);
}

#[test]
fn a_payload_over_one_frame_is_split() {
    let big = vec![7u8; MAX_PAYLOAD + 3];
    let mut out = BytesMut::new();
    encode(RUNTIME_SERVICE_CONN, &big, &mut out);
    let mut d = Decoder::default();
    d.extend(&out);
    let first = d.next_frame().unwrap().unwrap();
    let second = d.next_frame().unwrap().unwrap();
    assert_eq!(
        (first.payload.len(), second.payload.len()),
        (MAX_PAYLOAD, 3)
    );
}

/// A plugin that announces 4 GiB is refused from the header alone: nothing is buffered for it.
#[test]
fn an_oversized_or_reserved_frame_is_refused_from_its_header() {
    let mut d = Decoder::default();
    d.extend(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]);
    assert_eq!(
        d.next_frame(),
        Err(MuxError::TooLarge {
            len: u32::MAX as usize
        })
    );
    let mut d = Decoder::default();
    d.extend(&[0, 0, 0, 0, 0, 0, 0, 1, 9]);
    assert_eq!(d.next_frame(), Err(MuxError::ReservedConn));
}
