//! JSON-RPC 2.0 client for riser's control socket (used by `riser-rpc` and the tests).
//!
//! The wire format is SPDK's: requests and replies are bare JSON values written back to
//! back on a Unix stream socket, with no length prefix and no guaranteed separator. A
//! reply is therefore complete only when the bytes received so far parse as one whole
//! JSON value; bytes after it belong to the next reply and are kept for later.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use thiserror::Error;

/// Where riser listens unless told otherwise (same as SPDK's `/var/tmp/spdk.sock` habit).
pub const DEFAULT_SOCKET_PATH: &str = "/var/tmp/riser.sock";

/// How long one call may wait for its reply by default (rpc.py's default too).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Size of one read from the socket; replies larger than this simply take several reads.
const READ_CHUNK: usize = 64 * 1024;

/// Everything that can go wrong talking to riser.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The socket could not be opened at all.
    #[error("cannot connect to {}: {}{}", .path.display(), io_text(.source), connect_hint(.source))]
    Connect { path: PathBuf, source: io::Error },

    /// Reading or writing the socket failed after connecting.
    #[error("{context} {}: {}", .path.display(), io_text(.source))]
    Io { context: &'static str, path: PathBuf, source: io::Error },

    /// No complete reply arrived within the timeout.
    #[error("no reply to {method} within {}", secs(*.timeout))]
    Timeout { method: String, timeout: Duration },

    /// The server closed the connection before a complete reply arrived.
    #[error("riser closed the connection before replying to {method}")]
    Closed { method: String },

    /// The bytes received are not JSON.
    #[error("invalid JSON from riser: {0}")]
    Parse(String),

    /// Valid JSON, but not a JSON-RPC 2.0 reply to our request.
    #[error("malformed JSON-RPC reply: {0}")]
    BadReply(String),

    /// The server answered with a JSON-RPC error object.
    #[error("{message} (code {code})")]
    Rpc { code: i64, message: String },

    /// A configuration given to `load_config` does not have the `save_config` shape.
    #[error("invalid configuration: {0}")]
    BadConfig(String),

    /// One call of `load_config` failed; `method` says which.
    #[error("{method}: {source}")]
    Load { method: String, source: Box<ClientError> },
}

impl ClientError {
    /// The JSON-RPC error code, when the server answered with an error object.
    pub fn rpc_code(&self) -> Option<i64> {
        match self {
            ClientError::Rpc { code, .. } => Some(*code),
            ClientError::Load { source, .. } => source.rpc_code(),
            _ => None,
        }
    }
}

/// An io::Error as text without Rust's " (os error N)" suffix, which means nothing to users.
fn io_text(e: &io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) if s.ends_with(')') => s[..i].to_string(),
        _ => s,
    }
}

/// The usual reasons a connect fails are "riser is not started" or "wrong -s path".
fn connect_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => " (is riser running?)",
        io::ErrorKind::PermissionDenied => " (try as the user running riser)",
        _ => "",
    }
}

/// A duration as seconds ("0.1s", "60s"), the unit of riser-rpc's -t option.
fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// Outcome of trying to cut one JSON value off the front of a buffer.
#[derive(Debug, PartialEq)]
enum Cut {
    /// A complete value and the number of bytes it used (trailing whitespace not included).
    Value(Value, usize),
    /// The buffer holds only whitespace or the beginning of a value.
    NeedMore,
}

/// Parses the first JSON value of `buf`; an error at end of input means the value is
/// not all here yet, any other error means the stream is not JSON.
fn cut_value(buf: &[u8]) -> Result<Cut, serde_json::Error> {
    let mut values = serde_json::Deserializer::from_slice(buf).into_iter::<Value>();
    match values.next() {
        None => Ok(Cut::NeedMore),
        Some(Ok(v)) => Ok(Cut::Value(v, values.byte_offset())),
        Some(Err(e)) if e.is_eof() => Ok(Cut::NeedMore),
        Some(Err(e)) => Err(e),
    }
}

/// A connection to riser's JSON-RPC socket. Calls are made one at a time, in order.
pub struct RpcClient {
    stream: UnixStream,
    path: PathBuf,
    timeout: Duration,
    next_id: u64,
    /// Received bytes not yet consumed: the start of the next reply, or whole replies.
    buf: Vec<u8>,
}

impl RpcClient {
    /// Connects to the socket at `path`; each later call waits at most `timeout` for its reply.
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Self, ClientError> {
        let path = path.as_ref().to_path_buf();
        let stream = match UnixStream::connect(&path) {
            Ok(s) => s,
            Err(source) => return Err(ClientError::Connect { path, source }),
        };
        Ok(RpcClient { stream, path, timeout, next_id: 1, buf: Vec::new() })
    }

    /// Connects to [`DEFAULT_SOCKET_PATH`] with [`DEFAULT_TIMEOUT`].
    pub fn connect_default() -> Result<Self, ClientError> {
        Self::connect(DEFAULT_SOCKET_PATH, DEFAULT_TIMEOUT)
    }

    /// The socket path this client is connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Changes the per-call reply timeout.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Calls `method` and returns its `result`; a JSON-RPC error reply becomes
    /// [`ClientError::Rpc`]. `params` is left out of the request when `None`.
    pub fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut request = json!({ "jsonrpc": "2.0", "method": method, "id": id });
        if let (Some(p), Some(obj)) = (params, request.as_object_mut()) {
            obj.insert("params".to_string(), p);
        }
        // Serializing a Value cannot fail (all keys are strings); map it anyway rather than panic.
        let bytes = serde_json::to_vec(&request).map_err(|e| ClientError::BadReply(e.to_string()))?;
        let deadline = Instant::now() + self.timeout;
        self.send_raw(&bytes)?;

        loop {
            let reply = self.recv_until(method, deadline)?;
            match reply_id(&reply) {
                Some(got) if got == id => return interpret_reply(reply),
                // A late reply to an earlier call that timed out: it is stale, skip it.
                Some(got) if got < id => continue,
                _ => {
                    return Err(ClientError::BadReply(format!(
                        "expected a reply with id {id}, got {}",
                        compact(&reply)
                    )))
                }
            }
        }
    }

    /// Writes bytes to the socket as they are (tests use this to send malformed requests).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        // A write timeout too: a server that stops reading must not hang us forever.
        let set = self.stream.set_write_timeout(Some(self.timeout.max(Duration::from_millis(1))));
        set.and_then(|_| self.stream.write_all(bytes)).and_then(|_| self.stream.flush()).map_err(|source| {
            ClientError::Io { context: "cannot write to", path: self.path.clone(), source }
        })
    }

    /// Reads the next complete JSON value from the socket, whatever it is (a reply, an
    /// error object, a batch array), within the client's timeout.
    pub fn recv_value(&mut self) -> Result<Value, ClientError> {
        let deadline = Instant::now() + self.timeout;
        self.recv_until("the request", deadline)
    }

    /// Reads until one whole JSON value is buffered, returns it and keeps what follows it.
    fn recv_until(&mut self, method: &str, deadline: Instant) -> Result<Value, ClientError> {
        let mut chunk = vec![0u8; READ_CHUNK];
        loop {
            // Bytes left over from an earlier read may already hold the whole next reply.
            match cut_value(&self.buf).map_err(|e| ClientError::Parse(e.to_string()))? {
                Cut::Value(v, used) => {
                    self.buf.drain(..used);
                    return Ok(v);
                }
                Cut::NeedMore => {}
            }
            let timed_out = || ClientError::Timeout { method: method.to_string(), timeout: self.timeout };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            self.stream.set_read_timeout(Some(left)).map_err(|source| ClientError::Io {
                context: "cannot set a timeout on",
                path: self.path.clone(),
                source,
            })?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ClientError::Closed { method: method.to_string() }),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return Err(timed_out())
                }
                Err(source) => {
                    return Err(ClientError::Io { context: "cannot read from", path: self.path.clone(), source })
                }
            }
        }
    }

    /// The whole running configuration, as SPDK's `rpc.py save_config` builds it:
    /// `{"subsystems":[{"subsystem":NAME,"config":[{"method":..,"params":..},..]},..]}`.
    pub fn save_config(&mut self) -> Result<Value, ClientError> {
        let list = self.call("framework_get_subsystems", None)?;
        let list = list
            .as_array()
            .ok_or_else(|| ClientError::BadReply(format!("framework_get_subsystems returned {}", compact(&list))))?;
        let mut subsystems = Vec::with_capacity(list.len());
        for entry in list {
            let name = entry.get("subsystem").and_then(Value::as_str).ok_or_else(|| {
                ClientError::BadReply(format!("framework_get_subsystems entry without a name: {}", compact(entry)))
            })?;
            let config = self.call("framework_get_config", Some(json!({ "name": name })))?;
            subsystems.push(json!({ "subsystem": name, "config": config }));
        }
        Ok(json!({ "subsystems": subsystems }))
    }

    /// Replays a configuration made by [`save_config`](Self::save_config): every
    /// `{method, params}` of every subsystem, in order. Stops at the first failure, which
    /// is returned as [`ClientError::Load`] naming the method.
    pub fn load_config(&mut self, config: &Value) -> Result<(), ClientError> {
        let subsystems = config
            .get("subsystems")
            .and_then(Value::as_array)
            .ok_or_else(|| ClientError::BadConfig("no \"subsystems\" array at the top level".into()))?;
        for subsystem in subsystems {
            // A subsystem with nothing to configure may have a null or absent config.
            let calls = match subsystem.get("config") {
                None | Some(Value::Null) => continue,
                Some(Value::Array(calls)) => calls,
                Some(other) => {
                    return Err(ClientError::BadConfig(format!(
                        "subsystem {}: \"config\" is not an array: {}",
                        subsystem.get("subsystem").map(compact).unwrap_or_default(),
                        compact(other)
                    )))
                }
            };
            for entry in calls {
                let method = entry
                    .get("method")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ClientError::BadConfig(format!("entry without a \"method\": {}", compact(entry))))?;
                let params = entry.get("params").filter(|p| !p.is_null()).cloned();
                self.call(method, params)
                    .map_err(|e| ClientError::Load { method: method.to_string(), source: Box::new(e) })?;
            }
        }
        Ok(())
    }
}

/// The numeric id of a reply, if it has one (a parse-error reply has `"id": null`).
fn reply_id(reply: &Value) -> Option<u64> {
    reply.get("id").and_then(Value::as_u64)
}

/// Turns a reply object into the call's result or its error.
fn interpret_reply(reply: Value) -> Result<Value, ClientError> {
    let Value::Object(mut obj) = reply else {
        return Err(ClientError::BadReply(format!("not an object: {}", compact(&reply))));
    };
    if let Some(err) = obj.remove("error") {
        let code = err.get("code").and_then(Value::as_i64);
        let message = err.get("message").and_then(Value::as_str);
        return match (code, message) {
            (Some(code), Some(message)) => Err(ClientError::Rpc { code, message: message.to_string() }),
            _ => Err(ClientError::BadReply(format!("error without code and message: {}", compact(&err)))),
        };
    }
    obj.remove("result").ok_or_else(|| ClientError::BadReply("neither \"result\" nor \"error\"".into()))
}

/// A value on one line, cut short: for error messages only.
fn compact(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 200 {
        let mut end = 200;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread;

    /// A unique socket path for one test (tests run in parallel threads of one process).
    fn sock_path(tag: &str) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("riser-client-{}-{tag}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// Reads exactly one request object from a server-side stream (the client never pipelines).
    fn read_request(s: &mut UnixStream, pending: &mut Vec<u8>) -> Value {
        let mut chunk = [0u8; 4096];
        loop {
            if let Cut::Value(v, used) = cut_value(pending).unwrap() {
                pending.drain(..used);
                return v;
            }
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "client closed early");
            pending.extend_from_slice(&chunk[..n]);
        }
    }

    /// Starts a fake server running `serve` on the first accepted connection.
    fn fake_server(tag: &str, serve: impl FnOnce(UnixStream) + Send + 'static) -> (PathBuf, thread::JoinHandle<()>) {
        let path = sock_path(tag);
        let listener = UnixListener::bind(&path).unwrap();
        let h = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            serve(s);
        });
        (path, h)
    }

    #[test]
    fn cut_value_cases() {
        assert_eq!(cut_value(b"").unwrap(), Cut::NeedMore);
        assert_eq!(cut_value(b"  \n").unwrap(), Cut::NeedMore);
        assert_eq!(cut_value(br#"{"a":[1,2"#).unwrap(), Cut::NeedMore);
        assert_eq!(cut_value(br#"{"a":"x"#).unwrap(), Cut::NeedMore);
        assert_eq!(cut_value(br#"{"a":1}{"b""#).unwrap(), Cut::Value(json!({"a":1}), 7));
        assert_eq!(cut_value(b" true ").unwrap(), Cut::Value(json!(true), 5));
        assert!(cut_value(b"}garbage").is_err());
    }

    #[test]
    fn two_replies_in_one_read() {
        let (path, h) = fake_server("two", |mut s| {
            let mut pending = Vec::new();
            let r1 = read_request(&mut s, &mut pending);
            assert_eq!(r1["method"], "first");
            assert_eq!(r1["jsonrpc"], "2.0");
            assert!(r1.get("params").is_none(), "no params key when None");
            // Answer both calls at once, before the second request is even sent.
            s.write_all(br#"{"jsonrpc":"2.0","id":1,"result":"one"}{"jsonrpc":"2.0","id":2,"result":{"n":2}}"#)
                .unwrap();
            let r2 = read_request(&mut s, &mut pending);
            assert_eq!(r2["method"], "second");
            assert_eq!(r2["params"], json!({"x": 1}));
        });
        let mut c = RpcClient::connect(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(c.call("first", None).unwrap(), json!("one"));
        assert_eq!(c.call("second", Some(json!({"x": 1}))).unwrap(), json!({"n": 2}));
        h.join().unwrap();
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn reply_split_over_reads() {
        let (path, h) = fake_server("split", |mut s| {
            let mut pending = Vec::new();
            read_request(&mut s, &mut pending);
            let reply = br#"{"jsonrpc":"2.0","id":1,"result":{"name":"Malloc0","list":[1,2,3]}}"#;
            // Cut inside a key, inside a string and inside an array, flushing each piece.
            for piece in [&reply[..5], &reply[5..30], &reply[30..50], &reply[50..]] {
                s.write_all(piece).unwrap();
                s.flush().unwrap();
                thread::sleep(Duration::from_millis(20));
            }
        });
        let mut c = RpcClient::connect(&path, Duration::from_secs(5)).unwrap();
        let r = c.call("bdev_get_bdevs", None).unwrap();
        assert_eq!(r, json!({"name":"Malloc0","list":[1,2,3]}));
        h.join().unwrap();
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn error_reply_becomes_rpc_error() {
        let (path, h) = fake_server("err", |mut s| {
            let mut pending = Vec::new();
            read_request(&mut s, &mut pending);
            s.write_all(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#).unwrap();
        });
        let mut c = RpcClient::connect(&path, Duration::from_secs(5)).unwrap();
        match c.call("nope", None) {
            Err(ClientError::Rpc { code, message }) => {
                assert_eq!(code, -32601);
                assert_eq!(message, "Method not found");
            }
            other => panic!("unexpected {other:?}"),
        }
        h.join().unwrap();
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn close_and_garbage_and_timeout() {
        // Closed before a complete reply.
        let (path, h) = fake_server("closed", |mut s| {
            let mut pending = Vec::new();
            read_request(&mut s, &mut pending);
            s.write_all(br#"{"jsonrpc":"2.0","id":1,"res"#).unwrap();
        });
        let mut c = RpcClient::connect(&path, Duration::from_secs(5)).unwrap();
        assert!(matches!(c.call("m", None), Err(ClientError::Closed { .. })));
        h.join().unwrap();

        // Not JSON at all.
        let (path2, h) = fake_server("garbage", |mut s| {
            let mut pending = Vec::new();
            read_request(&mut s, &mut pending);
            s.write_all(b"HTTP/1.1 400 Bad Request\r\n").unwrap();
        });
        let mut c = RpcClient::connect(&path2, Duration::from_secs(5)).unwrap();
        assert!(matches!(c.call("m", None), Err(ClientError::Parse(_))));
        h.join().unwrap();

        // No reply at all: the timeout fires.
        let (path3, h) = fake_server("timeout", |mut s| {
            let mut pending = Vec::new();
            read_request(&mut s, &mut pending);
            thread::sleep(Duration::from_millis(500));
        });
        let mut c = RpcClient::connect(&path3, Duration::from_millis(100)).unwrap();
        let e = c.call("slow_method", None).unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
        assert_eq!(e.to_string(), "no reply to slow_method within 0.1s");
        h.join().unwrap();
        for p in [path, path2, path3] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn connect_error_message() {
        let path = sock_path("missing");
        let e = RpcClient::connect(&path, Duration::from_secs(1)).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!("cannot connect to {}: No such file or directory (is riser running?)", path.display())
        );
    }

    #[test]
    fn save_and_load_config() {
        let (path, h) = fake_server("config", |mut s| {
            let mut pending = Vec::new();
            let answer = |s: &mut UnixStream, req: &Value, result: Value| {
                let reply = json!({"jsonrpc":"2.0","id":req["id"].clone(),"result":result});
                s.write_all(reply.to_string().as_bytes()).unwrap();
            };
            let r = read_request(&mut s, &mut pending);
            assert_eq!(r["method"], "framework_get_subsystems");
            answer(&mut s, &r, json!([{"subsystem":"bdev","depends_on":[]},{"subsystem":"iscsi","depends_on":["bdev"]}]));
            let r = read_request(&mut s, &mut pending);
            assert_eq!(r["params"], json!({"name":"bdev"}));
            answer(&mut s, &r, json!([{"method":"bdev_malloc_create","params":{"name":"M0"}}]));
            let r = read_request(&mut s, &mut pending);
            assert_eq!(r["params"], json!({"name":"iscsi"}));
            answer(&mut s, &r, json!([]));

            // load_config: the first call works, the second fails, the third is never sent.
            let r = read_request(&mut s, &mut pending);
            assert_eq!(r["method"], "a");
            assert!(r.get("params").is_none());
            answer(&mut s, &r, json!(true));
            let r = read_request(&mut s, &mut pending);
            assert_eq!(r["method"], "b");
            let reply = json!({"jsonrpc":"2.0","id":r["id"].clone(),"error":{"code":-17,"message":"File exists"}});
            s.write_all(reply.to_string().as_bytes()).unwrap();
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            assert!(rest.is_empty() && pending.is_empty(), "no call after the failure");
        });
        let mut c = RpcClient::connect(&path, Duration::from_secs(5)).unwrap();
        let cfg = c.save_config().unwrap();
        assert_eq!(
            cfg,
            json!({"subsystems":[
                {"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"M0"}}]},
                {"subsystem":"iscsi","config":[]}
            ]})
        );
        let load = json!({"subsystems":[
            {"subsystem":"x","config":[{"method":"a"},{"method":"b","params":{"k":1}}]},
            {"subsystem":"y","config":[{"method":"c"}]}
        ]});
        let e = c.load_config(&load).unwrap_err();
        assert_eq!(e.to_string(), "b: File exists (code -17)");
        assert_eq!(e.rpc_code(), Some(-17));
        drop(c);
        h.join().unwrap();
        let _ = std::fs::remove_file(path);
    }
}
