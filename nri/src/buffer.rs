//! Bytes read from a connection that are not yet a whole frame or message.

use bytes::{Buf, Bytes, BytesMut};

#[derive(Debug, Default)]
pub(crate) struct Buffer(BytesMut);

impl Buffer {
    pub(crate) fn extend(&mut self, data: &[u8]) {
        self.0.extend_from_slice(data);
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The first `N` bytes, once they have arrived.
    pub(crate) fn header<const N: usize>(&self) -> Option<[u8; N]> {
        self.0.get(..N).map(|h| h.try_into().expect("N bytes"))
    }

    /// The `len` bytes after a header of `header` bytes, taken with the header once all have
    /// arrived.
    pub(crate) fn take(&mut self, header: usize, len: usize) -> Option<Bytes> {
        if self.0.len() < header + len {
            return None;
        }
        self.0.advance(header);
        Some(self.0.split_to(len).freeze())
    }
}
