use prost::Message as _;

use super::*;

#[test]
fn a_request_round_trips_through_the_framing_byte_by_byte() {
    let req = Request {
        service: "nri.pkg.api.v1alpha1.Plugin".into(),
        method: "Configure".into(),
        payload: Bytes::from_static(b"\x0a\x03cfg"),
        timeout_nano: 2_000_000_000,
        metadata: vec![KeyValue {
            key: "k".into(),
            value: "v".into(),
        }],
    };
    let m = Message {
        stream_id: 1,
        kind: Kind::Request,
        flags: 0,
        payload: req.encode_to_vec().into(),
    };
    let mut out = BytesMut::new();
    encode(&m, &mut out).unwrap();
    assert_eq!(&out[4..10], &[0, 0, 0, 1, 1, 0]);
    let mut d = Decoder::default();
    let mut got = None;
    for b in out.iter() {
        d.extend(&[*b]);
        if let Some(m) = d.next_message().unwrap() {
            got = Some(m);
        }
    }
    let got = got.expect("a message");
    assert_eq!(got, m);
    assert_eq!(Request::decode(got.payload).unwrap(), req);
}

#[test]
fn a_response_carries_its_status() {
    let r = Response {
        status: Some(Status {
            code: 5,
            message: "no such container".into(),
            details: vec![],
        }),
        payload: Bytes::new(),
    };
    let back = Response::decode(r.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back.status.unwrap().code, 5);
}

/// A plugin's 4 GiB length, or a type ttrpc does not have, is refused from the header alone.
#[test]
fn oversized_or_unknown_messages_are_refused_from_their_header() {
    let mut d = Decoder::default();
    d.extend(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 1, 0]);
    assert_eq!(
        d.next_message(),
        Err(TtrpcError::TooLarge {
            len: u32::MAX as usize
        })
    );
    let mut d = Decoder::default();
    d.extend(&[0, 0, 0, 0, 0, 0, 0, 1, 9, 0]);
    assert_eq!(d.next_message(), Err(TtrpcError::UnknownKind(9)));
    let too_big = Message {
        stream_id: 1,
        kind: Kind::Data,
        flags: flags::NO_DATA,
        payload: vec![0; MAX_MESSAGE + 1].into(),
    };
    assert!(encode(&too_big, &mut BytesMut::new()).is_err());
}
