//! The zstd codec of blobs and node bodies: when to compress, and decoding with this thread's
//! context.

use super::{Error, Result};

/// Blobs shorter than this stay raw: compression would not pay for its frame.
const COMPRESS_MIN_BYTES: usize = 128;
const CODEC_RAW: i64 = 0;
pub(in crate::store) const CODEC_ZSTD: i64 = 1;
/// zstd's default level: measured on agent transcripts it keeps most of the gain of higher
/// levels at a fraction of their time.
const ZSTD_LEVEL: i32 = 3;

/// The stored form of a blob: zstd when that saves at least an eighth, raw otherwise.
pub(in crate::store) fn compress(data: &[u8]) -> (i64, std::borrow::Cow<'_, [u8]>) {
    thread_local! {
        // A zstd context costs more to set up than a small blob costs to compress.
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            std::cell::RefCell::new(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok());
    }
    if data.len() >= COMPRESS_MIN_BYTES {
        let packed =
            COMPRESSOR.with(|c| c.borrow_mut().as_mut().and_then(|c| c.compress(data).ok()));
        if let Some(packed) = packed
            && packed.len() < data.len() - data.len() / 8
        {
            return (CODEC_ZSTD, std::borrow::Cow::Owned(packed));
        }
    }
    (CODEC_RAW, std::borrow::Cow::Borrowed(data))
}

/// A stored blob's bytes, decoded when compressed (`size` is the raw size).
pub(in crate::store) fn unpack(codec: i64, data: Vec<u8>, size: usize) -> Result<Vec<u8>> {
    match codec {
        CODEC_RAW => Ok(data),
        CODEC_ZSTD => decompress(&data, size)
            .map_err(|e| Error::Corrupt(format!("a zstd blob does not decode: {e}"))),
        other => Err(Error::Corrupt(format!("unknown blob codec {other}"))),
    }
}

/// Decodes one zstd frame of `size` raw bytes with this thread's decoder.
fn decompress(packed: &[u8], size: usize) -> std::io::Result<Vec<u8>> {
    thread_local! {
        // A zstd context costs more to set up than a small body or blob costs to decode.
        static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            std::cell::RefCell::new(zstd::bulk::Decompressor::new().ok());
    }
    DECOMPRESSOR
        .with(|d| d.borrow_mut().as_mut().map(|d| d.decompress(packed, size)))
        .unwrap_or_else(|| zstd::bulk::decompress(packed, size))
}

/// The largest node body a stored frame may claim: far over any request the server takes, so
/// only a damaged frame is refused.
const MAX_BODY_BYTES: u64 = 1 << 30;

/// A node body stored compressed (`body_z`).
pub(super) fn unpack_body(packed: &[u8]) -> Result<String> {
    let corrupt = |e: &dyn std::fmt::Display| {
        Error::Corrupt(format!("a compressed node body does not decode: {e}"))
    };
    // Bodies are written whole by `compress`, so their frames record their size.
    let size = match zstd::zstd_safe::get_frame_content_size(packed) {
        Ok(Some(size)) if size <= MAX_BODY_BYTES => {
            usize::try_from(size).map_err(|e| corrupt(&e))?
        }
        Ok(_) | Err(_) => return Err(corrupt(&"its frame has no valid size")),
    };
    let bytes = decompress(packed, size).map_err(|e| corrupt(&e))?;
    String::from_utf8(bytes)
        .map_err(|_| Error::Corrupt("a compressed node body is not UTF-8".into()))
}
