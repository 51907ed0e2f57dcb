//! Test harness: the built `idempo-gateway` binary as a child process, a small upstream hyper
//! server in the test, and a hyper client. Everything goes through real sockets on 127.0.0.1.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    unreachable_pub
)]

pub mod relay;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// A running gateway process.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// Starts the binary on `config` (a TOML text; `listen` should be `127.0.0.1:0`).
    pub fn start(dir: &Path, config: &str) -> Self {
        let file = dir.join("gateway.toml");
        std::fs::write(&file, config).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_idempo-gateway"))
            .args(["serve", "--config"])
            .arg(&file)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v["msg"] == "listening" {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(v["addr"].as_str().unwrap().to_owned());
                        }
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("gateway did not start: {:?}", logs.lock().unwrap()));
        Self {
            child,
            addr: addr.parse().unwrap(),
            logs,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Peak resident memory of the process, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status within `within`.
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A fresh directory for one test.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idempo-gw-it-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What the upstream saw.
#[derive(Default, Debug)]
pub struct Seen {
    /// Calls per path.
    pub calls: HashMap<String, u64>,
    /// The downstream key header of each call, in order.
    pub keys: Vec<Option<String>>,
    /// The effects done, keyed by downstream key (the upstream deduplicates on it).
    pub effects: HashMap<String, u64>,
}

pub type SeenRef = Arc<Mutex<Seen>>;

/// The small upstream: `/payments` (201 JSON), `/slow?ms=N` (answers after N ms the first
/// time it sees a downstream key), `/big?mb=N`
/// (streams N MiB, or `kb=N` KiB, chunked, after `ms=N`), `/fail` (500).
pub async fn upstream() -> (SocketAddr, SeenRef) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: SeenRef = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                break;
            };
            let s = s.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| serve_upstream(s.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn query(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

type UpBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

async fn serve_upstream(
    seen: SeenRef,
    req: Request<Incoming>,
) -> Result<Response<UpBody>, std::io::Error> {
    let path = req.uri().path().to_owned();
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let first_effect = {
        let mut s = seen.lock().unwrap();
        *s.calls.entry(path.clone()).or_default() += 1;
        s.keys.push(key.clone());
        let e = s
            .effects
            .entry(key.clone().unwrap_or_default())
            .or_default();
        *e += 1;
        *e == 1
    };
    let ms = query(&req, "ms");
    let mb = query(&req, "mb");
    let kb = query(&req, "kb");
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let full = |status: u16, text: String| {
        let mut r = Response::new(
            Full::new(Bytes::from(text))
                .map_err(|never| match never {})
                .boxed(),
        );
        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
        r.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        r
    };
    match path.as_str() {
        "/slow" => {
            // Slow only the first time a downstream key is seen (a deduplicated re-run is quick).
            if first_effect {
                tokio::time::sleep(Duration::from_millis(ms.unwrap_or(1000))).await;
            }
            Ok(full(
                201,
                format!("{{\"slow\":true,\"first\":{first_effect}}}"),
            ))
        }
        "/big" => {
            let total = kb.map_or(mb.unwrap_or(50) << 20, |kb| kb << 10);
            let chunk = Bytes::from(vec![b'x'; (64 << 10).min(total.max(1) as usize)]);
            let (tx, rx) =
                tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::io::Error>>(2);
            tokio::spawn(async move {
                if let Some(ms) = ms {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                let mut sent = 0u64;
                while sent < total {
                    if tx
                        .send(Ok(hyper::body::Frame::data(chunk.clone())))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    sent += chunk.len() as u64;
                }
            });
            let stream = futures_stream(rx);
            let mut r = Response::new(http_body_util::StreamBody::new(stream).boxed());
            *r.status_mut() = hyper::StatusCode::OK;
            Ok(r)
        }
        "/fail" => Ok(full(500, "{\"error\":\"boom\"}".to_owned())),
        _ => Ok(full(
            201,
            format!(
                "{{\"status\":\"succeeded\",\"request\":{},\"first\":{first_effect}}}",
                String::from_utf8_lossy(&body)
            ),
        )),
    }
}

struct Rx<T>(tokio::sync::mpsc::Receiver<T>);

impl<T> futures_core::Stream for Rx<T> {
    type Item = T;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

fn futures_stream<T>(rx: tokio::sync::mpsc::Receiver<T>) -> Rx<T> {
    Rx(rx)
}

/// An upstream that reads a request and drops the connection: without answering, or (with
/// `partial`) after a chunked response head and the first chunk.
pub async fn crashing_upstream_with(partial: bool) -> (SocketAddr, Arc<Mutex<u64>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(Mutex::new(0));
    let c = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                break;
            };
            let c = c.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                *c.lock().unwrap() += 1;
                if partial {
                    let head = "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
                                transfer-encoding: chunked\r\n\r\n6\r\n{\"a\":1\r\n";
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.flush().await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                drop(stream);
            });
        }
    });
    (addr, calls)
}

/// An upstream that reads a request and drops the connection without answering.
pub async fn crashing_upstream() -> (SocketAddr, Arc<Mutex<u64>>) {
    crashing_upstream_with(false).await
}

/// A client answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn problem_type(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["type"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

pub type TestClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

pub fn client() -> TestClient {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http()
}

/// POSTs `body` with these headers (`Idempotency-Key`, `X-Principal`, ...).
pub async fn post(
    c: &TestClient,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Answer, String> {
    let mut req = Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    for (n, v) in headers {
        req.headers_mut().insert(
            hyper::header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let resp = c.request(req).await.map_err(|e| format!("{e:?}"))?;
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| format!("{e:?}"))?
        .to_bytes()
        .to_vec();
    Ok(Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    })
}

/// GET `url` and the body as text.
pub async fn get(c: &TestClient, url: &str) -> Answer {
    let resp = c
        .request(Request::get(url).body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes().to_vec(),
    }
}

/// A gateway configuration in front of `upstream`, with `extra` appended to the route.
pub fn config(store: &str, upstream: SocketAddr, route_path: &str, extra: &str) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
upstream_timeout_ms = 5000
shutdown_deadline_ms = 5000

[store]
{store}

[principal]
header = "X-Principal"

[upstreams]
app = "http://{upstream}"

[[routes]]
method = "POST"
path = "{route_path}"
upstream = "app"
{extra}
"#
    )
}
