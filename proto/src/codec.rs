//! The protobuf codec of every RPC: tonic's prost codec with smaller per-stream buffers.
//!
//! tonic allocates its encode and decode buffers eagerly, 8 KiB each per stream, and grows them
//! in steps of that size. A coordinator holds one long-lived session stream per node, whose
//! reports are a few hundred bytes per job; the default buffers were 16 KiB of the ~34 KiB the
//! coordinator spent per connected node (heaptrack of the `cluster_load` bench). Buffers start at
//! 1 KiB here and grow by 1 KiB as a larger message needs; a buffer keeps what it grew to, so a
//! node with many jobs pays the growth once per stream.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Initial size and growth step of a stream's encode and decode buffers.
const BUFFER_SIZE: usize = 1024;
/// tonic's default: encoded data beyond this is flushed to the transport before continuing.
const YIELD_THRESHOLD: usize = 32 * 1024;

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}

/// [`ProstCodec`] with [`BUFFER_SIZE`] buffers; the generated clients and servers use it.
#[derive(Debug, Clone)]
pub struct CompactCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for CompactCodec<T, U> {
    fn default() -> Self {
        CompactCodec {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for CompactCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(buffer_settings())
    }
}
