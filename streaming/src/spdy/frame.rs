//! SPDY/3 frames: 8-byte headers, control frames (version 3) and data frames.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::SpdyError;

pub const VERSION: u16 = 3;
pub const FLAG_FIN: u8 = 0x01;

/// Largest data frame payload accepted. Go's spdystream writes what `io.Copy` hands it, 32 KiB.
pub const MAX_DATA_PAYLOAD: usize = 1 << 20;
/// Largest control frame payload accepted: header blocks of a handful of headers, pings.
pub const MAX_CONTROL_PAYLOAD: usize = 256 << 10;

pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const SETTINGS: u16 = 4;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;
pub const HEADERS: u16 = 8;
pub const WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes used here.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_REFUSED_STREAM: u32 = 3;
pub const RST_CANCEL: u32 = 5;

#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    Control {
        kind: u16,
        flags: u8,
        payload: Bytes,
    },
}

/// Read one frame; `Ok(None)` at a clean end of the connection.
pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, SpdyError> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let flags = head[4];
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let control = head[0] & 0x80 != 0;
    let max = if control {
        MAX_CONTROL_PAYLOAD
    } else {
        MAX_DATA_PAYLOAD
    };
    if len > max {
        return Err(SpdyError::Protocol(format!(
            "frame of {len} bytes (at most {max})"
        )));
    }
    // Memory grows with the bytes that arrive, not with the length the peer claims.
    let mut payload = Vec::with_capacity(len.min(64 * 1024));
    r.take(len as u64).read_to_end(&mut payload).await?;
    if payload.len() != len {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    let payload = Bytes::from(payload);
    if control {
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(SpdyError::Protocol(format!("SPDY version {version}")));
        }
        Ok(Some(Frame::Control {
            kind: u16::from_be_bytes([head[2], head[3]]),
            flags,
            payload,
        }))
    } else {
        Ok(Some(Frame::Data {
            stream: u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff,
            fin: flags & FLAG_FIN != 0,
            data: payload,
        }))
    }
}

pub fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

pub fn data(stream: u32, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(if fin { FLAG_FIN } else { 0 });
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// The 31-bit stream id at the start of a control frame's payload.
pub fn stream_id(payload: &[u8]) -> Result<u32, SpdyError> {
    payload
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff)
        .ok_or_else(|| SpdyError::Protocol("control frame too short".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip() {
        let mut wire = control(PING, 0, &7u32.to_be_bytes());
        wire.extend(data(5, true, b"hello"));
        let mut r = &wire[..];
        assert_eq!(
            read(&mut r).await.unwrap(),
            Some(Frame::Control {
                kind: PING,
                flags: 0,
                payload: Bytes::from_static(&[0, 0, 0, 7])
            })
        );
        assert_eq!(
            read(&mut r).await.unwrap(),
            Some(Frame::Data {
                stream: 5,
                fin: true,
                data: Bytes::from_static(b"hello")
            })
        );
        assert_eq!(read(&mut r).await.unwrap(), None);
    }

    #[tokio::test]
    async fn oversized_frames_are_refused_before_their_payload() {
        // Only the 8-byte header is sent: the length alone must refuse the frame.
        let mut wire = data(1, false, &[]);
        wire[5..8].copy_from_slice(&((MAX_DATA_PAYLOAD + 1) as u32).to_be_bytes()[1..]);
        assert!(read(&mut &wire[..]).await.is_err());
        let mut wire = control(SYN_STREAM, 0, &[]);
        wire[5..8].copy_from_slice(&((MAX_CONTROL_PAYLOAD + 1) as u32).to_be_bytes()[1..]);
        assert!(read(&mut &wire[..]).await.is_err());
        // A frame cut short is an error, not a silent truncation.
        let mut wire = data(1, false, b"abcdef");
        wire.truncate(10);
        assert!(read(&mut &wire[..]).await.is_err());
    }

    #[tokio::test]
    async fn a_wrong_version_is_refused() {
        let mut wire = control(PING, 0, &[0; 4]);
        wire[1] = 2;
        assert!(read(&mut &wire[..]).await.is_err());
    }
}
