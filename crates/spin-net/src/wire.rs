//! Framing: a 4-byte big-endian length, then the postcard body, with a maximum frame size checked before a body is
//! read (the announced size is kept for the error), and typed send/receive helpers shared by the server and the
//! devices.

use crate::error::{NetError, Result};
use crate::proto::{Message, decode, encode};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, Encoder, Framed};

/// A byte stream a connection runs on (plain TCP; a TLS stream has the same shape).
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// A framed connection.
pub type Conn = Framed<Box<dyn Stream>, FrameCodec>;

/// A frame whose length prefix exceeds the limit (carried inside an `io::Error` out of the codec).
#[derive(Debug)]
pub struct FrameTooLarge {
    /// The announced body size.
    pub size: usize,
    /// The limit.
    pub limit: usize,
}

impl std::fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes exceed the limit of {}", self.size, self.limit)
    }
}

impl std::error::Error for FrameTooLarge {}

/// The protocol's length-delimited frames (hand-written rather than tokio-util's `LengthDelimitedCodec` so that an
/// oversized prefix is reported with the size the peer announced, e.g. 4,294,967,295 for `ff ff ff ff`).
#[derive(Debug, Clone)]
pub struct FrameCodec {
    max: usize,
    /// The body length of the frame being read, once its prefix is consumed.
    body: Option<usize>,
}

impl FrameCodec {
    /// A codec refusing bodies above `max_frame_bytes`.
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameCodec {
            max: max_frame_bytes,
            body: None,
        }
    }
}

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> std::io::Result<Option<BytesMut>> {
        let n = match self.body {
            Some(n) => n,
            None => {
                let Some(head) = src.first_chunk::<4>() else {
                    return Ok(None);
                };
                let n = u32::from_be_bytes(*head) as usize;
                if n > self.max {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        FrameTooLarge {
                            size: n,
                            limit: self.max,
                        },
                    ));
                }
                src.advance(4);
                self.body = Some(n);
                n
            }
        };
        if src.len() < n {
            src.reserve(n - src.len());
            return Ok(None);
        }
        self.body = None;
        Ok(Some(src.split_to(n)))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> std::io::Result<Option<BytesMut>> {
        match self.decode(src)? {
            Some(f) => Ok(Some(f)),
            None if src.is_empty() && self.body.is_none() => Ok(None),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the stream ended inside a frame",
            )),
        }
    }
}

impl Encoder<Bytes> for FrameCodec {
    type Error = std::io::Error;

    fn encode(&mut self, body: Bytes, dst: &mut BytesMut) -> std::io::Result<()> {
        if body.len() > self.max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                FrameTooLarge {
                    size: body.len(),
                    limit: self.max,
                },
            ));
        }
        dst.reserve(4 + body.len());
        dst.put_u32(body.len() as u32);
        dst.extend_from_slice(&body);
        Ok(())
    }
}

/// Wraps a TCP stream in the protocol's codec with a limit of `max_frame_bytes` per frame body.
pub fn framed(stream: TcpStream, max_frame_bytes: usize) -> Conn {
    // Small messages dominate: send them at once rather than waiting to coalesce.
    let _ = stream.set_nodelay(true);
    framed_stream(Box::new(stream), max_frame_bytes)
}

/// Wraps any byte stream (TCP, TLS) in the protocol's codec.
pub fn framed_stream(stream: Box<dyn Stream>, max_frame_bytes: usize) -> Conn {
    Framed::new(stream, FrameCodec::new(max_frame_bytes))
}

/// One frame (prefix and body) as bytes, for a refusal written straight to a socket.
pub fn frame_bytes(body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + body.len());
    f.extend_from_slice(&(body.len() as u32).to_be_bytes());
    f.extend_from_slice(body);
    f
}

/// Encodes and sends one message; returns the body size in bytes.
pub async fn send<T: Serialize>(conn: &mut Conn, msg: &T) -> Result<usize> {
    let body = encode(msg)?;
    let n = body.len();
    conn.send(Bytes::from(body)).await?;
    Ok(n)
}

/// Receives one frame body; `Ok(None)` when the peer closed cleanly.
pub async fn recv_frame(conn: &mut Conn, max_frame_bytes: usize) -> Result<Option<Bytes>> {
    match conn.next().await {
        None => Ok(None),
        Some(Ok(b)) => Ok(Some(b.freeze())),
        Some(Err(e)) => Err(frame_error(e, max_frame_bytes)),
    }
}

/// Receives and decodes one message; a clean close is [`NetError::Closed`].
pub async fn recv<T: DeserializeOwned + Message>(
    conn: &mut Conn,
    max_frame_bytes: usize,
) -> Result<(T, usize)> {
    let body = recv_frame(conn, max_frame_bytes).await?.ok_or(NetError::Closed)?;
    Ok((decode(&body)?, body.len()))
}

/// Maps the codec's errors: an oversized prefix becomes [`NetError::TooLarge`] with the announced size, a cut-off
/// stream [`NetError::Decode`] ("truncated").
pub fn frame_error(e: std::io::Error, _max_frame_bytes: usize) -> NetError {
    if let Some(t) = e.get_ref().and_then(|r| r.downcast_ref::<FrameTooLarge>()) {
        return NetError::TooLarge {
            size: t.size,
            limit: t.limit,
        };
    }
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        NetError::Decode("the stream ended inside a frame (truncated)".into())
    } else {
        NetError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codec_reads_split_frames_and_reports_the_announced_oversize() {
        let mut c = FrameCodec::new(8);
        let mut src = BytesMut::from(&[0u8, 0, 0, 3, 1][..]);
        assert!(c.decode(&mut src).unwrap().is_none());
        src.extend_from_slice(&[2, 3, 0, 0]);
        assert_eq!(&c.decode(&mut src).unwrap().unwrap()[..], &[1, 2, 3]);
        assert!(c.decode(&mut src).unwrap().is_none());
        // Two bytes of a prefix and then the end: truncated, not a clean close.
        let e = c.decode_eof(&mut src).unwrap_err();
        assert!(frame_error(e, 8).to_string().contains("truncated"));
        let mut c = FrameCodec::new(8);
        let mut src = BytesMut::from(&[0xffu8, 0xff, 0xff, 0xff][..]);
        let e = frame_error(c.decode(&mut src).unwrap_err(), 8);
        assert_eq!(e.to_string(), "frame: 4294967295 bytes exceed the limit of 8");
        // A header read, the body never comes.
        let mut c = FrameCodec::new(8);
        let mut src = BytesMut::from(&[0u8, 0, 0, 2][..]);
        assert!(c.decode(&mut src).unwrap().is_none());
        assert!(c.decode_eof(&mut src).is_err());
        let mut out = BytesMut::new();
        FrameCodec::new(8)
            .encode(Bytes::from_static(&[7, 7]), &mut out)
            .unwrap();
        assert_eq!(&out[..], &frame_bytes(&[7, 7])[..]);
    }
}
