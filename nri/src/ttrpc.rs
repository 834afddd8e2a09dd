//! ttrpc (`containerd/ttrpc`): messages of `[length: u32 BE][stream id: u32 BE][type: u8]
//! [flags: u8][payload]`, and the protobuf envelopes of requests and responses.

use bytes::{BufMut, Bytes, BytesMut};

use crate::buffer::Buffer;

/// A message's header.
pub const HEADER_LEN: usize = 10;
/// The largest payload ttrpc sends or accepts.
pub const MAX_MESSAGE: usize = 4 << 20;

/// What a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Response,
    /// A stream's data.
    Data,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Request => 1,
            Kind::Response => 2,
            Kind::Data => 3,
        }
    }

    fn from_byte(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Request),
            2 => Some(Kind::Response),
            3 => Some(Kind::Data),
            _ => None,
        }
    }
}

/// Flags of a message.
pub mod flags {
    /// The sender will send no more on this stream.
    pub const REMOTE_CLOSED: u8 = 0x1;
    /// The sender keeps the stream open (a streaming request).
    pub const REMOTE_OPEN: u8 = 0x2;
    /// A data message without data.
    pub const NO_DATA: u8 = 0x4;
}

/// One ttrpc message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub stream_id: u32,
    pub kind: Kind,
    pub flags: u8,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TtrpcError {
    #[error("ttrpc message of {len} bytes, over the limit of {MAX_MESSAGE}")]
    TooLarge { len: usize },
    #[error("ttrpc message of unknown type {0}")]
    UnknownKind(u8),
}

/// `m` as bytes; an error when its payload is over [`MAX_MESSAGE`].
pub fn encode(m: &Message, out: &mut BytesMut) -> Result<(), TtrpcError> {
    if m.payload.len() > MAX_MESSAGE {
        return Err(TtrpcError::TooLarge {
            len: m.payload.len(),
        });
    }
    out.reserve(HEADER_LEN + m.payload.len());
    out.put_u32(m.payload.len() as u32);
    out.put_u32(m.stream_id);
    out.put_u8(m.kind.byte());
    out.put_u8(m.flags);
    out.put_slice(&m.payload);
    Ok(())
}

/// Messages from the bytes of one logical connection, as they arrive. A length over
/// [`MAX_MESSAGE`] or an unknown type is refused from the header alone.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Buffer,
}

impl Decoder {
    pub fn extend(&mut self, data: &[u8]) {
        self.buf.extend(data);
    }

    /// The next whole message, `None` until one has arrived. An error ends the connection.
    pub fn next_message(&mut self) -> Result<Option<Message>, TtrpcError> {
        let Some(h) = self.buf.header::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len > MAX_MESSAGE {
            return Err(TtrpcError::TooLarge { len });
        }
        let stream_id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let kind = Kind::from_byte(h[8]).ok_or(TtrpcError::UnknownKind(h[8]))?;
        let flags = h[9];
        Ok(self.buf.take(HEADER_LEN, len).map(|payload| Message {
            stream_id,
            kind,
            flags,
            payload,
        }))
    }

    /// Bytes held that are not yet a whole message.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// `ttrpc.Request`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(string, tag = "1")]
    pub service: String,
    #[prost(string, tag = "2")]
    pub method: String,
    #[prost(bytes = "bytes", tag = "3")]
    pub payload: Bytes,
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
    #[prost(message, repeated, tag = "5")]
    pub metadata: Vec<KeyValue>,
}

/// `ttrpc.KeyValue`: request metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `ttrpc.Response`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(message, optional, tag = "1")]
    pub status: Option<Status>,
    #[prost(bytes = "bytes", tag = "2")]
    pub payload: Bytes,
}

/// `google.rpc.Status`: a gRPC code and message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

#[cfg(test)]
mod tests;
