//! The CRI's gRPC codec: prost's, except that a request that does not decode is
//! `InvalidArgument` (a label that is not UTF-8, say), not the `Internal` that tonic's codec
//! answers: the fault is the caller's, and the message says what it was.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstCodec;

#[derive(Debug, Clone)]
pub struct CriCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for CriCodec<T, U> {
    fn default() -> Self {
        CriCodec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for CriCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = CriDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CriDecoder {
            inner: ProstCodec::<T, U>::raw_decoder(BufferSettings::default()),
        }
    }
}

pub struct CriDecoder<U> {
    inner: tonic_prost::ProstDecoder<U>,
}

impl<U: prost::Message + Default> Decoder for CriDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(|s| {
            Status::invalid_argument(format!(
                "the message is not a valid {}: {}",
                std::any::type_name::<U>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("message"),
                s.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}
