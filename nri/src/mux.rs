//! NRI's connection multiplexer: frames of `[conn id: u32 BE][length: u32 BE][payload]`.

use bytes::{BufMut, Bytes, BytesMut};

use crate::buffer::Buffer;

/// Connection id 0 is reserved.
pub const RESERVED_CONN: u32 = 0;
/// The plugin's services (the runtime calls them).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// The runtime's services (the plugin calls them).
pub const RUNTIME_SERVICE_CONN: u32 = 2;

/// A frame's header: the connection id, then the payload length.
pub const HEADER_LEN: usize = 8;
/// The largest payload one frame carries: one whole ttrpc message. Larger writes are split.
pub const MAX_PAYLOAD: usize = crate::ttrpc::HEADER_LEN + crate::ttrpc::MAX_MESSAGE;

/// One frame of one logical connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub conn: u32,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MuxError {
    #[error("NRI mux frame of {len} bytes, over the limit of {MAX_PAYLOAD}")]
    TooLarge { len: usize },
    #[error("NRI mux frame on reserved connection 0")]
    ReservedConn,
}

/// `payload` for connection `conn`, as frames of at most [`MAX_PAYLOAD`] bytes each (none for
/// an empty payload, as NRI's own mux).
pub fn encode(conn: u32, payload: &[u8], out: &mut BytesMut) {
    for chunk in payload.chunks(MAX_PAYLOAD) {
        out.reserve(HEADER_LEN + chunk.len());
        out.put_u32(conn);
        out.put_u32(chunk.len() as u32);
        out.put_slice(chunk);
    }
}

/// Frames from a byte stream, as bytes arrive. It refuses a frame that is too large from its
/// header alone, so a plugin cannot make it buffer more than one frame.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Buffer,
}

impl Decoder {
    /// Bytes read from the connection.
    pub fn extend(&mut self, data: &[u8]) {
        self.buf.extend(data);
    }

    /// The next whole frame, `None` until one has arrived. An error ends the connection.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, MuxError> {
        let Some(h) = self.buf.header::<HEADER_LEN>() else {
            return Ok(None);
        };
        let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(MuxError::TooLarge { len });
        }
        if conn == RESERVED_CONN {
            return Err(MuxError::ReservedConn);
        }
        Ok(self
            .buf
            .take(HEADER_LEN, len)
            .map(|payload| Frame { conn, payload }))
    }

    /// Bytes held that are not yet a whole frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests;
