//! One exchange with the upstream (the gateway's "handler"): send the request, read the
//! response head, then capture the body per core's [`capture_plan`]: held whole and answered
//! by the flow ([`CapturePlan::Buffer`]), or streamed to the client as it arrives while it is
//! recorded within core's limit ([`CapturePlan::Tee`], [`BodyCapture`]), or streamed without
//! recording ([`CapturePlan::PassThrough`]). Memory stays bounded: at most the record limit plus
//! a few frames in the channel to the client.
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use idempo_core::machine::{BodyCapture, CapturePlan, CaptureStep, HandlerResponse, capture_plan};
use idempo_core::policy::{Config, ResponseOrigin};
use tokio::sync::{mpsc, oneshot};

use crate::body::{BoxBody, BoxError, boxed_error, connection_nominated, is_hop_by_hop};

/// Frames buffered between the upstream and a slow client.
const CHANNEL_FRAMES: usize = 4;

/// The HTTP client the gateway forwards with (pooled connections).
pub type Client =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, BoxBody>;

/// Why the upstream did not give a whole response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// The connection could not be opened: the request was never sent.
    Connect,
    /// The upstream did not answer (head or next body chunk) within the timeout.
    Timeout,
    /// The connection failed after the request was sent (reset, closed mid-response).
    Broken,
}

impl UpstreamFailure {
    /// False only when the upstream certainly never saw the request.
    #[must_use]
    pub fn maybe_side_effect(self) -> bool {
        !matches!(self, Self::Connect)
    }

    /// A stable name for logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Broken => "broken",
        }
    }
}

/// How the exchange ended.
#[derive(Debug)]
pub enum ExchangeEnd {
    /// A whole response: fed to the flow as `HandlerFinished`. `streamed` is true when its head
    /// and body already went to the client.
    Finished {
        /// What the flow records.
        response: HandlerResponse,
        /// The client already has it.
        streamed: bool,
        /// The end of a streamed body, which the driver releases once the flow has settled the
        /// record: the client never has the whole response before its record is written, so an
        /// immediate retry replays (or runs again, for a status that is not stored).
        hold: Option<BodyEnd>,
    },
    /// No whole response: fed to the flow as `HandlerFailed`. `streamed` as above (the client
    /// then saw its connection fail mid-body).
    Failed {
        /// Why.
        failure: UpstreamFailure,
        /// The client already got the head.
        streamed: bool,
    },
}

/// The end of a streamed body, held back until the record is written: the last frame and the
/// channel whose closing ends the client's body.
#[derive(Debug)]
pub struct BodyEnd {
    sender: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    last: Option<Frame<Bytes>>,
}

impl BodyEnd {
    /// Sends the last frame and ends the body.
    pub async fn release(self) {
        if let Some(frame) = self.last {
            let _ = self.sender.send(Ok(frame)).await;
        }
    }
}

/// Runs the exchange. When the plan streams, the response head goes to `head` as soon as it is
/// known (the body follows through a channel); otherwise `head` is left for the caller.
pub async fn exchange(
    client: &Client,
    request: Request<BoxBody>,
    config: &Config,
    timeout: Duration,
    head: &mut Option<oneshot::Sender<Response<BoxBody>>>,
) -> ExchangeEnd {
    let response = match tokio::time::timeout(timeout, client.request(request)).await {
        Err(_) => return failed(UpstreamFailure::Timeout, false),
        Ok(Err(e)) if e.is_connect() => return failed(UpstreamFailure::Connect, false),
        Ok(Err(_)) => return failed(UpstreamFailure::Broken, false),
        Ok(Ok(r)) => r,
    };
    let (parts, body) = response.into_parts();
    let status = parts.status.as_u16();
    let nominated = connection_nominated(&parts.headers);
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .filter(|(n, _)| !is_hop_by_hop(n.as_str()) && !nominated.iter().any(|t| t == n.as_str()))
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let streaming = !parts.headers.contains_key(hyper::header::CONTENT_LENGTH);
    let plan = capture_plan(config, status, ResponseOrigin::Handler, &headers, streaming);
    match plan {
        CapturePlan::Buffer { limit } => buffer(body, status, headers, limit, timeout).await,
        CapturePlan::Tee { limit } => {
            tee(body, parts, status, headers, Some(limit), timeout, head).await
        }
        CapturePlan::PassThrough => tee(body, parts, status, headers, None, timeout, head).await,
    }
}

fn failed(failure: UpstreamFailure, streamed: bool) -> ExchangeEnd {
    ExchangeEnd::Failed { failure, streamed }
}

async fn next_frame(
    body: &mut Incoming,
    timeout: Duration,
) -> Result<Option<Frame<Bytes>>, UpstreamFailure> {
    match tokio::time::timeout(timeout, body.frame()).await {
        Err(_) => Err(UpstreamFailure::Timeout),
        Ok(None) => Ok(None),
        Ok(Some(Ok(f))) => Ok(Some(f)),
        Ok(Some(Err(_))) => Err(UpstreamFailure::Broken),
    }
}

async fn buffer(
    mut body: Incoming,
    status: u16,
    headers: Vec<(String, String)>,
    limit: usize,
    timeout: Duration,
) -> ExchangeEnd {
    let mut capture = BodyCapture::new(limit);
    let mut recorded = Vec::new();
    loop {
        match next_frame(&mut body, timeout).await {
            Err(f) => return failed(f, false),
            Ok(None) => break,
            Ok(Some(frame)) => {
                if let Ok(data) = frame.into_data() {
                    match capture.accept(data.len()) {
                        CaptureStep::Record => recorded.extend_from_slice(&data),
                        // A Buffer plan is chosen for a declared length within the limit, which
                        // hyper enforces; past it nothing more is held.
                        CaptureStep::Discard => recorded = Vec::new(),
                        CaptureStep::Skip => {}
                    }
                }
            }
        }
    }
    let mut response = HandlerResponse::new(status, headers, recorded);
    response.body_truncated = capture.truncated();
    ExchangeEnd::Finished {
        response,
        streamed: false,
        hold: None,
    }
}

async fn tee(
    mut body: Incoming,
    parts: hyper::http::response::Parts,
    status: u16,
    headers: Vec<(String, String)>,
    limit: Option<usize>,
    timeout: Duration,
    head: &mut Option<oneshot::Sender<Response<BoxBody>>>,
) -> ExchangeEnd {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(CHANNEL_FRAMES);
    let stream = tokio_stream_of(rx);
    let mut out = Response::from_parts(parts, BoxBody::new(StreamBody::new(stream)));
    strip_hop_by_hop(out.headers_mut());
    let mut client_gone = match head.take() {
        Some(h) => h.send(out).is_err(),
        None => true,
    };
    let mut capture = limit.map(BodyCapture::new);
    let mut recorded = Vec::new();
    // One frame of look-ahead: the last one is sent only after the record is written.
    let mut pending: Option<Frame<Bytes>> = None;
    loop {
        let frame = match next_frame(&mut body, timeout).await {
            Err(f) => {
                if !client_gone {
                    let _ = tx
                        .send(Err(boxed_error("the upstream response failed")))
                        .await;
                }
                return failed(f, true);
            }
            Ok(None) => break,
            Ok(Some(frame)) => frame,
        };
        if let (Some(capture), Some(data)) = (capture.as_mut(), frame.data_ref()) {
            match capture.accept(data.len()) {
                CaptureStep::Record => recorded.extend_from_slice(data),
                CaptureStep::Discard => recorded = Vec::new(),
                CaptureStep::Skip => {}
            }
        }
        // A client that went away does not stop the exchange: the upstream's answer is still
        // recorded for the retry.
        if let Some(previous) = pending.replace(frame) {
            if !client_gone && tx.send(Ok(previous)).await.is_err() {
                client_gone = true;
            }
        }
    }
    let mut response = HandlerResponse::new(status, headers, recorded);
    response.body_truncated = capture.is_some_and(|c| c.truncated());
    ExchangeEnd::Finished {
        response,
        streamed: true,
        hold: (!client_gone).then_some(BodyEnd {
            sender: tx,
            last: pending,
        }),
    }
}

/// The receiving half of the channel as a `Stream`.
fn tokio_stream_of(
    rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, BoxError>> + Send + Sync + 'static {
    ChannelStream(rx)
}

struct ChannelStream(mpsc::Receiver<Result<Frame<Bytes>, BoxError>>);

impl futures_core::Stream for ChannelStream {
    type Item = Result<Frame<Bytes>, BoxError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// Removes the hop-by-hop fields of a message the gateway forwards.
pub fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    let nominated = connection_nominated(headers);
    let names: Vec<_> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n.as_str()) || nominated.iter().any(|t| t == n.as_str()))
        .cloned()
        .collect();
    for n in names {
        headers.remove(n);
    }
}
