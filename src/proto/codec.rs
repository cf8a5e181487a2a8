//! The protobuf codec of the generated service: prost's, except that a message that does not
//! decode is the sender's mistake (`INVALID_ARGUMENT`), not an internal error.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// `tonic_prost::ProstCodec` with decode failures answered as `INVALID_ARGUMENT`.
///
/// tonic's prost codec answers an undecodable request `INTERNAL`, which would tell a caller
/// that sent garbage that the server is broken. prost's error names the field path where
/// decoding failed (`AppendRequest.nodes: NodeInput.kind: …`), so it goes into the message.
/// The generated client uses this codec too, where an undecodable response (only ever from a
/// broken server) reads the same way.
#[derive(Debug, Clone)]
pub struct ProtoCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProtoDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder(self.0.decoder())
    }
}

/// prost's decoder with its errors mapped by [`ProtoCodec`].
#[derive(Debug, Clone)]
pub struct ProtoDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for ProtoDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            if status.code() == Code::Internal {
                Status::invalid_argument(status.message())
            } else {
                status
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
