//! The fetcher: a thread that reads riser over its JSON-RPC socket once per interval and
//! sends each [`Sample`] (or why there is none) to the screen, so a slow or vanished riser
//! never freezes the keyboard. It reconnects by itself.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use riser_rpc::client::{ClientError, RpcClient};
use serde_json::{json, Value};

use crate::model::{Conn, Hist, IoStat, Reactors, Sample};

/// JSON-RPC's "Method not found": an older riser without that method.
const METHOD_NOT_FOUND: i64 = -32601;

/// What the screen asks of the fetcher.
#[derive(Debug)]
pub enum Cmd {
    /// Latency histograms on or off for every device (now and for devices added later).
    Histograms(bool),
    Quit,
}

/// What the fetcher tells the screen.
#[derive(Debug)]
pub enum Msg {
    /// A refresh; `notes` name the parts riser did not give (method missing, error).
    Sample { sample: Box<Sample>, notes: Vec<String> },
    /// riser does not answer (not started, gone, hung); retrying.
    Down(String),
}

/// How one call went, short of losing the connection.
enum Part {
    Ok(Value),
    /// riser answered with an error; the part shows "-".
    Missing,
}

/// Starts the fetcher for the socket at `sock`: one refresh now, then one every `interval`
/// and one right after each command.
pub fn spawn(sock: PathBuf, interval: Duration) -> std::io::Result<(Sender<Cmd>, Receiver<Msg>, JoinHandle<()>)> {
    let (cmd_tx, cmd_rx) = mpsc::channel();
    let (msg_tx, msg_rx) = mpsc::channel();
    let h = thread::Builder::new().name("riser-top-fetch".into()).spawn(move || Fetcher::new(sock, interval).run(&cmd_rx, &msg_tx))?;
    Ok((cmd_tx, msg_rx, h))
}

struct Fetcher {
    sock: PathBuf,
    interval: Duration,
    client: Option<RpcClient>,
    /// Methods this riser answered "Method not found": not asked again until a reconnect.
    unknown: BTreeSet<&'static str>,
    /// The histogram state the user asked for; `None` until `h` is pressed.
    want_histograms: Option<bool>,
    version: Option<String>,
    start: Instant,
}

impl Fetcher {
    fn new(sock: PathBuf, interval: Duration) -> Fetcher {
        Fetcher { sock, interval, client: None, unknown: BTreeSet::new(), want_histograms: None, version: None, start: Instant::now() }
    }

    fn run(mut self, cmds: &Receiver<Cmd>, out: &Sender<Msg>) {
        let mut next = Instant::now();
        loop {
            match cmds.recv_timeout(next.saturating_duration_since(Instant::now())) {
                Ok(Cmd::Quit) | Err(RecvTimeoutError::Disconnected) => return,
                Ok(Cmd::Histograms(on)) => self.want_histograms = Some(on),
                Err(RecvTimeoutError::Timeout) => {}
            }
            next = Instant::now() + self.interval;
            let msg = self.refresh();
            if out.send(msg).is_err() {
                return;
            }
        }
    }

    /// One refresh: every method once, the devices' histograms one by one.
    fn refresh(&mut self) -> Msg {
        match self.try_refresh() {
            Ok(m) => m,
            Err(e) => {
                // The connection is no good any more: start over at the next refresh.
                self.client = None;
                Msg::Down(e.to_string())
            }
        }
    }

    fn try_refresh(&mut self) -> Result<Msg, ClientError> {
        if self.client.is_none() {
            // Each call may wait this long; a hung riser shows as "not answering".
            let timeout = self.interval.max(Duration::from_secs(2));
            self.client = Some(RpcClient::connect(&self.sock, timeout)?);
            // A new riser may serve methods the old one did not.
            self.unknown.clear();
            self.version = None;
        }
        let mut notes = Vec::new();
        if self.version.is_none() {
            if let Part::Ok(v) = self.call("spdk_get_version", None, &mut notes)? {
                self.version = v.get("version").and_then(Value::as_str).map(str::to_string);
            }
        }
        let mut sample = Sample { at_s: self.start.elapsed().as_secs_f64(), version: self.version.clone(), ..Default::default() };
        if let Part::Ok(v) = self.call("framework_get_reactors", None, &mut notes)? {
            sample.reactors = Some(Reactors::parse(&v));
        }
        if let Part::Ok(v) = self.call("iscsi_get_connections", None, &mut notes)? {
            sample.conns = Some(Conn::parse_list(&v));
        }
        sample.iostat = match self.call("bdev_get_iostat", None, &mut notes)? {
            Part::Ok(v) => Some(IoStat::parse(&v)),
            // Without statistics the device list still shows, figures "-".
            Part::Missing => match self.call("bdev_get_bdevs", None, &mut notes)? {
                Part::Ok(v) => Some(IoStat::names_only(&v)),
                Part::Missing => None,
            },
        };
        let names: Vec<String> = sample.iostat.iter().flat_map(|s| s.devs.iter().map(|d| d.name.clone())).collect();
        for name in names {
            if let Some(h) = self.histogram(&name, &mut notes)? {
                sample.hists.insert(name, h);
            }
        }
        notes.sort();
        notes.dedup();
        Ok(Msg::Sample { sample: Box::new(sample), notes })
    }

    /// One device's histogram, switched on or off first when it is not as asked.
    fn histogram(&mut self, name: &str, notes: &mut Vec<String>) -> Result<Option<Hist>, ClientError> {
        let Part::Ok(v) = self.call("bdev_get_histogram", Some(json!({ "name": name })), notes)? else {
            return Ok(None);
        };
        let h = Hist::parse(&v);
        match self.want_histograms {
            Some(want) if h.enabled != Some(want) => {
                let params = json!({ "name": name, "enable": want });
                if let Part::Missing = self.call("bdev_enable_histogram", Some(params), notes)? {
                    return Ok(Some(h));
                }
                match self.call("bdev_get_histogram", Some(json!({ "name": name })), notes)? {
                    Part::Ok(v) => Ok(Some(Hist::parse(&v))),
                    Part::Missing => Ok(None),
                }
            }
            _ => Ok(Some(h)),
        }
    }

    /// One call. An error answer is a missing part (noted); only a broken connection
    /// (closed, timed out, not JSON) is an error.
    fn call(&mut self, method: &'static str, params: Option<Value>, notes: &mut Vec<String>) -> Result<Part, ClientError> {
        if self.unknown.contains(method) {
            notes.push(format!("{method}: not served by this riser"));
            return Ok(Part::Missing);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(ClientError::BadReply("not connected".into()));
        };
        match client.call(method, params) {
            Ok(v) => Ok(Part::Ok(v)),
            Err(ClientError::Rpc { code, message }) => {
                if code == METHOD_NOT_FOUND {
                    self.unknown.insert(method);
                    notes.push(format!("{method}: not served by this riser"));
                } else {
                    notes.push(format!("{method}: {message} ({code})"));
                }
                Ok(Part::Missing)
            }
            // A reply that is JSON but not what we asked: this part is missing, the
            // connection may still be in step.
            Err(ClientError::BadReply(m)) => {
                notes.push(format!("{method}: {m}"));
                Ok(Part::Missing)
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    const HANG_UP: i64 = i64::MIN;

    /// A fake riser: answers each request with `answer(method, params)` (a result, or an
    /// error object when it returns Err((code, message))).
    fn fake_riser(tag: &str, answer: impl Fn(&str, &Value) -> Result<Value, (i64, &'static str)> + Send + 'static) -> PathBuf {
        let path = std::env::temp_dir().join(format!("riser-top-{}-{tag}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind");
        thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else { return };
            // One connection only: a later connect is refused at once, not queued on a
            // listener that is about to go (which read as a reset, by timing).
            drop(listener);
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
                match it.next() {
                    Some(Ok(req)) => {
                        let used = it.byte_offset();
                        buf.drain(..used);
                        let method = req["method"].as_str().unwrap_or("").to_string();
                        let reply = match answer(&method, &req["params"]) {
                            Ok(r) => json!({"jsonrpc": "2.0", "id": req["id"], "result": r}),
                            // riser stops: the connection closes without a reply.
                            Err((HANG_UP, _)) => return,
                            Err((code, m)) => {
                                json!({"jsonrpc": "2.0", "id": req["id"], "error": {"code": code, "message": m}})
                            }
                        };
                        if s.write_all(reply.to_string().as_bytes()).is_err() {
                            return;
                        }
                    }
                    _ => match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    },
                }
            }
        });
        path
    }

    #[test]
    fn an_old_riser_without_the_statistics_methods() {
        let path = fake_riser("old", |m, _| match m {
            "spdk_get_version" => Ok(json!({"version": "riser v0.0.1"})),
            "framework_get_reactors" => Ok(json!({"reactors": [{"lcore": 0, "busy": 1, "idle": 1}]})),
            "iscsi_get_connections" => Ok(json!([{"id": 1, "initiator_name": "iqn.i"}])),
            "bdev_get_bdevs" => Ok(json!([{"name": "Malloc0"}])),
            _ => Err((METHOD_NOT_FOUND, "Method not found")),
        });
        let mut f = Fetcher::new(path.clone(), Duration::from_millis(100));
        let Msg::Sample { sample, notes } = f.refresh() else { panic!("no sample") };
        assert_eq!(sample.version.as_deref(), Some("riser v0.0.1"));
        assert_eq!(sample.reactors.map(|r| r.list.len()), Some(1));
        assert_eq!(sample.conns.map(|c| c.len()), Some(1));
        let io = sample.iostat.expect("device names from bdev_get_bdevs");
        assert_eq!(io.devs[0].name, "Malloc0");
        assert_eq!(io.devs[0].read_ops, None);
        assert!(sample.hists.is_empty());
        assert!(notes.contains(&"bdev_get_iostat: not served by this riser".to_string()), "{notes:?}");
        assert!(notes.contains(&"bdev_get_histogram: not served by this riser".to_string()), "{notes:?}");
        // The second refresh does not ask again for what is missing, and still works.
        assert!(f.unknown.contains("bdev_get_iostat"));
        assert!(matches!(f.refresh(), Msg::Sample { .. }));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn histograms_switched_as_asked() {
        use std::sync::{Arc, Mutex};
        let on = Arc::new(Mutex::new(false));
        let o = on.clone();
        let path = fake_riser("hist", move |m, p| {
            let mut on = o.lock().unwrap_or_else(|e| e.into_inner());
            match m {
                "bdev_get_iostat" => Ok(json!({"tick_rate": 1000, "ticks": 5, "bdevs": [{"name": "N0"}]})),
                "bdev_get_histogram" => Ok(json!({"name": p["name"], "enabled": *on, "count": 3,
                                                  "latency_us": {"p50": 10.0, "p99": 20.0}})),
                "bdev_enable_histogram" => {
                    *on = p["enable"].as_bool().unwrap_or(false);
                    Ok(json!(true))
                }
                // A method failing with another error leaves its part out.
                "iscsi_get_connections" => Err((-1, "busy")),
                _ => Ok(json!({})),
            }
        });
        let mut f = Fetcher::new(path.clone(), Duration::from_millis(100));
        let Msg::Sample { sample, notes } = f.refresh() else { panic!("no sample") };
        assert_eq!(sample.hists["N0"].enabled, Some(false));
        assert!(sample.conns.is_none());
        assert!(notes.contains(&"iscsi_get_connections: busy (-1)".to_string()), "{notes:?}");
        f.want_histograms = Some(true);
        let Msg::Sample { sample, .. } = f.refresh() else { panic!("no sample") };
        assert_eq!(sample.hists["N0"].enabled, Some(true));
        assert_eq!(sample.hists["N0"].p99_us, Some(20.0));
        assert!(*on.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn riser_stops_and_comes_back() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let path = fake_riser("restart", move |m, _| match m {
            "framework_get_reactors" if c.fetch_add(1, Ordering::Relaxed) == 1 => Err((HANG_UP, "")),
            "framework_get_reactors" => Ok(json!({"reactors": []})),
            "spdk_get_version" => Ok(json!({"version": "riser v1"})),
            _ => Err((METHOD_NOT_FOUND, "Method not found")),
        });
        let mut f = Fetcher::new(path.clone(), Duration::from_millis(100));
        assert!(matches!(f.refresh(), Msg::Sample { .. }));
        match f.refresh() {
            // The fake closes with our request unread: an end of file, or a reset (Unix
            // sockets report ECONNRESET when unread data is thrown away), by timing.
            Msg::Down(why) => assert!(why.contains("closed the connection") || why.contains("reset by peer"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Gone for good: the socket file is still there, nobody listens.
        match f.refresh() {
            Msg::Down(why) => assert!(why.contains("cannot connect"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A new riser on the same socket, serving more methods than the old one.
        let path2 = fake_riser("restart", |m, _| match m {
            "spdk_get_version" => Ok(json!({"version": "riser v2"})),
            "framework_get_reactors" => Ok(json!({"reactors": []})),
            _ => Err((METHOD_NOT_FOUND, "Method not found")),
        });
        assert_eq!(path, path2);
        let Msg::Sample { sample, .. } = f.refresh() else { panic!("no sample after the restart") };
        assert_eq!(sample.version.as_deref(), Some("riser v2"));
        assert!(sample.reactors.is_some());
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn no_riser_then_down_and_garbage_is_down_too() {
        let missing = std::env::temp_dir().join(format!("riser-top-{}-none.sock", std::process::id()));
        let mut f = Fetcher::new(missing, Duration::from_millis(100));
        match f.refresh() {
            Msg::Down(e) => assert!(e.contains("is riser running?"), "{e}"),
            other => panic!("{other:?}"),
        }
        // A socket that answers with something that is not JSON-RPC at all.
        let path = std::env::temp_dir().join(format!("riser-top-{}-junk.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind");
        thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let _ = s.write_all(b"<html>");
                let mut sink = [0u8; 1024];
                while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
            }
        });
        let mut f = Fetcher::new(path.clone(), Duration::from_millis(100));
        assert!(matches!(f.refresh(), Msg::Down(_)));
        assert!(f.client.is_none(), "reconnects at the next refresh");
        let _ = std::fs::remove_file(path);
    }
}
