//! A TCP relay in front of a store's server (PostgreSQL, Redis) that a test can cut or freeze.
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP relay between the gateway and its store's server that the test can cut (connections refused,
/// open ones closed) or freeze (connections accepted, nothing relayed).
pub struct Relay {
    pub port: u16,
    mode: Arc<Mutex<Mode>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    held: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Relay,
    Freeze,
}

impl Relay {
    pub async fn start(target: (String, u16)) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(Mutex::new(Mode::Relay));
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let accept = {
            let (mode, tasks, held) = (mode.clone(), tasks.clone(), held.clone());
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if *mode.lock().unwrap() == Mode::Freeze {
                        held.lock().unwrap().push(inbound);
                        continue;
                    }
                    let target = target.clone();
                    let t = tokio::spawn(async move {
                        if let Ok(mut out) = TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                    tasks.lock().unwrap().push(t);
                }
            })
        };
        Self {
            port,
            mode,
            tasks,
            held,
            accept: Some(accept),
        }
    }

    pub fn drop_open(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    /// Closes the open connections; new ones are accepted and never answered.
    pub fn freeze(&self) {
        *self.mode.lock().unwrap() = Mode::Freeze;
        self.drop_open();
    }

    /// Relays again.
    pub fn resume(&self) {
        *self.mode.lock().unwrap() = Mode::Relay;
        self.held.lock().unwrap().clear();
    }

    /// Stops listening and closes every connection.
    pub fn cut(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
        self.drop_open();
        self.held.lock().unwrap().clear();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}
