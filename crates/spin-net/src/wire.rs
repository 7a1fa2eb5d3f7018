//! Framing: tokio-util's length-delimited codec (4-byte big-endian length, then the postcard body) with a maximum
//! frame size, and typed send/receive helpers shared by the server and the devices.

use crate::error::{NetError, Result};
use crate::proto::{decode, encode};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// A framed TCP connection.
pub type Conn = Framed<TcpStream, LengthDelimitedCodec>;

/// Wraps a stream in the protocol's codec with a limit of `max_frame_bytes` per frame body.
pub fn framed(stream: TcpStream, max_frame_bytes: usize) -> Conn {
    // Small messages dominate: send them at once rather than waiting to coalesce.
    let _ = stream.set_nodelay(true);
    let codec = LengthDelimitedCodec::builder()
        .length_field_length(4)
        .max_frame_length(max_frame_bytes)
        .new_codec();
    Framed::new(stream, codec)
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
pub async fn recv<T: DeserializeOwned>(conn: &mut Conn, max_frame_bytes: usize) -> Result<(T, usize)> {
    let body = recv_frame(conn, max_frame_bytes).await?.ok_or(NetError::Closed)?;
    Ok((decode(&body)?, body.len()))
}

/// Maps the codec's errors: its "frame size too big" becomes [`NetError::TooLarge`], a cut-off stream
/// [`NetError::Decode`].
pub fn frame_error(e: std::io::Error, max_frame_bytes: usize) -> NetError {
    let text = e.to_string();
    if text.contains("frame size too big") {
        NetError::TooLarge {
            size: max_frame_bytes + 1,
            limit: max_frame_bytes,
        }
    } else if e.kind() == std::io::ErrorKind::UnexpectedEof || text.contains("bytes remaining on stream") {
        NetError::Decode("the stream ended inside a frame (truncated)".into())
    } else {
        NetError::Io(e)
    }
}
