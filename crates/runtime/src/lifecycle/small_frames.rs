//! Small gRPC messages leave in the same write as their trailers. The HTTP/2 writer copies a DATA
//! payload shorter than 256 bytes into its write buffer, but holds a longer one aside and must
//! flush before it can queue another frame, so a 257–1 000-byte unary response (a typical
//! KServe answer) always ended one `writev` and its trailers began the next: 1.77 writes per
//! request where HTTP/1.1 needs one. Cutting such a message into DATA frames under that size
//! lets the writer buffer the whole response, trailers included, with other streams' frames.
//! DATA frame boundaries carry no meaning in gRPC, so the peer reads the same message.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tower::util::MapResponseLayer;

/// The largest DATA frame the HTTP/2 writer still copies into its buffer (it holds back
/// payloads of 256 bytes or more).
const COPIED_FRAME_LIMIT: usize = 255;
/// Messages up to this size are cut; longer ones gain nothing from it (their payload dwarfs one
/// extra write) and stay whole, so nothing is copied.
const CUT_MESSAGE_LIMIT: usize = 1024;

/// A response body whose DATA frames of up to [`CUT_MESSAGE_LIMIT`] bytes are re-framed into
/// pieces of at most [`COPIED_FRAME_LIMIT`] bytes; everything else passes through.
pub struct SmallFrames<B> {
    inner: B,
    rest: Bytes,
}

impl<B> SmallFrames<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            rest: Bytes::new(),
        }
    }
}

impl<B> Body for SmallFrames<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if !self.rest.is_empty() {
            let piece = cut_piece(&mut self.rest);
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        let frame = match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            other => return Poll::Ready(other),
        };
        match frame.into_data() {
            Ok(data) if data.len() > COPIED_FRAME_LIMIT && data.len() <= CUT_MESSAGE_LIMIT => {
                self.rest = data;
                let piece = cut_piece(&mut self.rest);
                Poll::Ready(Some(Ok(Frame::data(piece))))
            }
            Ok(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Err(frame) => Poll::Ready(Some(Ok(frame))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        hint.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// A gRPC response whose small messages are re-framed.
type Reframed = http::Response<SmallFrames<tonic::body::Body>>;

/// The layer the lifecycle's gRPC servers wrap their routes in.
pub fn layer() -> MapResponseLayer<fn(http::Response<tonic::body::Body>) -> Reframed> {
    MapResponseLayer::new(reframe)
}

fn reframe(response: http::Response<tonic::body::Body>) -> Reframed {
    response.map(SmallFrames::new)
}

/// Takes the next piece off `rest` (no copy: both share the buffer).
fn cut_piece(rest: &mut Bytes) -> Bytes {
    rest.split_to(rest.len().min(COPIED_FRAME_LIMIT))
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    type Frames = Vec<Result<Frame<Bytes>, std::convert::Infallible>>;

    async fn frames_of(input: Frames) -> (Vec<usize>, Vec<u8>, bool) {
        let body = SmallFrames::new(StreamBody::new(futures::stream::iter(input)));
        let mut body = std::pin::pin!(body);
        let (mut sizes, mut bytes, mut trailers) = (Vec::new(), Vec::new(), false);
        while let Some(frame) = body.frame().await {
            match frame.unwrap().into_data() {
                Ok(data) => {
                    sizes.push(data.len());
                    bytes.extend_from_slice(&data);
                }
                Err(frame) => trailers = frame.is_trailers(),
            }
        }
        (sizes, bytes, trailers)
    }

    fn message(len: usize) -> Bytes {
        (0..len).map(|i| i as u8).collect::<Vec<u8>>().into()
    }

    #[tokio::test]
    async fn a_small_message_is_cut_under_the_copy_limit_and_keeps_its_bytes_and_trailers() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let (sizes, bytes, has_trailers) = frames_of(vec![
            Ok(Frame::data(message(600))),
            Ok(Frame::trailers(trailers)),
        ])
        .await;
        assert_eq!(sizes, vec![255, 255, 90]);
        assert_eq!(bytes, message(600).to_vec());
        assert!(has_trailers);
    }

    #[tokio::test]
    async fn messages_under_the_copy_limit_or_over_the_cut_limit_pass_whole() {
        let (sizes, bytes, _) = frames_of(vec![
            Ok(Frame::data(message(255))),
            Ok(Frame::data(message(4000))),
            Ok(Frame::data(message(1024))),
        ])
        .await;
        assert_eq!(sizes, vec![255, 4000, 255, 255, 255, 255, 4]);
        let mut expected = message(255).to_vec();
        expected.extend_from_slice(&message(4000));
        expected.extend_from_slice(&message(1024));
        assert_eq!(bytes, expected);
    }
}
