//! The JSON-RPC 2.0 server: a Unix socket speaking SPDK's wire format (bare JSON values
//! back to back on the stream, no framing; batches allowed), methods registered with typed
//! parameters, and errors shaped as SPDK sends them.
//!
//! Each client gets its own thread (control plane only; capped), so a slow or hostile
//! client never blocks another. A malformed request gets an error reply and, when the
//! stream can no longer be parsed, a closed connection; the server goes on.

use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use jsonrpc_core::{ErrorCode, IoHandler, Params};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Where riser listens unless told otherwise (`-r`).
pub const DEFAULT_SOCKET: &str = "/var/tmp/riser.sock";

/// Most bytes one client may have buffered without completing a request.
const MAX_REQUEST_BYTES: usize = 16 << 20;
/// Most clients served at once; more are answered with an error and closed.
const MAX_CLIENTS: usize = 64;

/// An error a method returns. The code follows SPDK: JSON-RPC codes for protocol errors,
/// negative errno values for refusals (-17 exists, -19 not found, -16 busy, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into() }
    }
    /// -32602: a parameter is missing, of the wrong type or out of range.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(-32602, message)
    }
    /// -32603: the request was valid but could not be carried out.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(-32603, message)
    }
    /// -17 (EEXIST).
    pub fn exists(message: impl Into<String>) -> Self {
        Self::new(-17, message)
    }
    /// -19 (ENODEV).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(-19, message)
    }
    /// -16 (EBUSY).
    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(-16, message)
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for RpcError {}

impl From<RpcError> for jsonrpc_core::Error {
    fn from(e: RpcError) -> Self {
        jsonrpc_core::Error { code: ErrorCode::from(e.code), message: e.message, data: None }
    }
}

/// Decodes method parameters, naming the offending field on failure. Absent params decode
/// as an empty object, so methods whose parameters are all optional accept none.
pub fn decode_params<P: DeserializeOwned>(params: Value) -> Result<P, RpcError> {
    let v = match params {
        Value::Null => Value::Object(Default::default()),
        v @ Value::Object(_) => v,
        _ => return Err(RpcError::invalid_params("params must be a JSON object")),
    };
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path.is_empty() || path == "." {
            RpcError::invalid_params(format!("invalid params: {inner}"))
        } else {
            RpcError::invalid_params(format!("invalid params: {path}: {inner}"))
        }
    })
}

/// The methods riser answers, by SPDK name.
#[derive(Default)]
pub struct RpcRegistry {
    io: IoHandler,
    methods: Vec<String>,
}

impl RpcRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `name` with typed parameters `P` (use a `#[serde(deny_unknown_fields)]`
    /// struct so misspelt fields are refused, as SPDK does).
    pub fn add<P, F>(&mut self, name: &str, f: F)
    where
        P: DeserializeOwned + 'static,
        F: Fn(P) -> Result<Value, RpcError> + Send + Sync + 'static,
    {
        let method = name.to_string();
        self.methods.push(method.clone());
        self.io.add_sync_method(name, move |params: Params| {
            let raw = match params {
                Params::None => Value::Null,
                Params::Map(m) => Value::Object(m),
                Params::Array(_) => {
                    return Err(RpcError::invalid_params("params must be a JSON object").into())
                }
            };
            let p: P = decode_params(raw)?;
            match f(p) {
                Ok(v) => Ok(v),
                Err(e) => {
                    log::warn!("rpc {method}: {e}");
                    Err(e.into())
                }
            }
        });
    }

    /// Method names in registration order.
    pub fn methods(&self) -> &[String] {
        &self.methods
    }

    /// Answers one request (an object, or a batch array) given as JSON text; `None` for a
    /// notification.
    ///
    /// Not `IoHandler::handle_request_sync`: that logs every request (trace) and every reply
    /// (debug) in full under the `rpc` target, and requests and replies carry CHAP secrets
    /// (`iscsi_create_auth_group`, `iscsi_get_auth_groups`, save_config). Same answers, no
    /// log lines.
    pub fn handle(&self, request: &str) -> Option<String> {
        let response = match jsonrpc_core::serde_from_str::<jsonrpc_core::Request>(request) {
            Ok(r) => jsonrpc_core::futures_executor::block_on(self.io.handle_rpc_request(r)),
            Err(_) => Some(jsonrpc_core::Response::from(
                jsonrpc_core::Error::new(ErrorCode::ParseError),
                Some(jsonrpc_core::Version::V2),
            )),
        };
        response.map(|r| {
            serde_json::to_string(&r).unwrap_or_else(|e| error_reply(Value::Null, -32603, &format!("Internal error: {e}")))
        })
    }

    /// Calls a method in-process (used to replay `--json` config files).
    pub fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let reply = self
            .handle(&req.to_string())
            .ok_or_else(|| RpcError::internal("no reply"))?;
        let reply: Value = serde_json::from_str(&reply).map_err(|e| RpcError::internal(e.to_string()))?;
        if let Some(err) = reply.get("error") {
            return Err(RpcError::new(
                err.get("code").and_then(Value::as_i64).unwrap_or(-32603),
                err.get("message").and_then(Value::as_str).unwrap_or("unknown error"),
            ));
        }
        Ok(reply.get("result").cloned().unwrap_or(Value::Null))
    }
}

/// A running server. [`RpcServer::shutdown`] (or drop) stops it and removes the socket.
pub struct RpcServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl RpcServer {
    /// Binds `path` (replacing a stale socket file, refusing a live one) and serves.
    pub fn start(path: &Path, registry: Arc<RpcRegistry>) -> io::Result<RpcServer> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    ErrorKind::AddrInUse,
                    format!("{} is in use by another process (another riser running?)", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let accept = thread::Builder::new()
            .name("rpc".into())
            .spawn(move || accept_loop(listener, registry, stop2))?;
        log::info!("JSON-RPC server listening on {}", path.display());
        Ok(RpcServer { path: path.to_path_buf(), stop, accept: Some(accept) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.stop_now();
        }
    }
}

fn accept_loop(listener: UnixListener, registry: Arc<RpcRegistry>, stop: Arc<AtomicBool>) {
    let clients = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((mut stream, _)) => {
                if clients.load(Ordering::Acquire) >= MAX_CLIENTS {
                    log::warn!("rpc: too many clients ({MAX_CLIENTS}); refusing one");
                    let _ = stream.write_all(error_reply(Value::Null, -32603, "too many RPC clients").as_bytes());
                    continue;
                }
                clients.fetch_add(1, Ordering::AcqRel);
                let (reg, stop, clients) = (registry.clone(), stop.clone(), clients.clone());
                let spawned = thread::Builder::new().name("rpc-client".into()).spawn(move || {
                    if let Err(e) = serve_client(stream, &reg, &stop) {
                        log::debug!("rpc client: {e}");
                    }
                    clients.fetch_sub(1, Ordering::AcqRel);
                });
                if let Err(e) = spawned {
                    log::error!("rpc: cannot start a client thread: {e}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                log::warn!("rpc: accept failed: {e}");
                thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn error_reply(id: Value, code: i64, message: &str) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        .to_string()
}

/// Reads requests off one stream until it closes, answering each in order.
fn serve_client(mut stream: UnixStream, reg: &RpcRegistry, stop: &AtomicBool) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    // Wake up now and then to notice shutdown.
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue
            }
            Err(e) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut consumed = 0;
        let mut fatal = false;
        {
            let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
            loop {
                match it.next() {
                    Some(Ok(v)) => {
                        consumed = it.byte_offset();
                        if let Some(reply) = answer(reg, v) {
                            stream.write_all(reply.as_bytes())?;
                        }
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(e)) => {
                        log::warn!("rpc: unparsable request: {e}; closing that client");
                        stream.write_all(error_reply(Value::Null, -32700, &format!("Parse error: {e}")).as_bytes())?;
                        fatal = true;
                        break;
                    }
                    None => {
                        consumed = buf.len();
                        break;
                    }
                }
            }
        }
        if fatal {
            return Ok(());
        }
        buf.drain(..consumed);
        if buf.len() > MAX_REQUEST_BYTES {
            stream.write_all(error_reply(Value::Null, -32700, "request too large").as_bytes())?;
            return Ok(());
        }
    }
}

fn answer(reg: &RpcRegistry, v: Value) -> Option<String> {
    if let Some(m) = v.get("method").and_then(Value::as_str) {
        log::debug!("rpc call {m}");
    }
    match v {
        // JSON-RPC 2.0 §6: an empty batch is answered with one Invalid Request error.
        Value::Array(ref a) if a.is_empty() => Some(error_reply(Value::Null, -32600, "Invalid Request: empty batch")),
        Value::Object(_) | Value::Array(_) => reg.handle(&v.to_string()),
        _ => Some(error_reply(Value::Null, -32600, "Invalid request: expected a JSON object or array")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct P {
        name: String,
        #[allow(dead_code)]
        num_blocks: u64,
    }

    fn reg() -> RpcRegistry {
        let mut r = RpcRegistry::new();
        r.add("echo", |p: P| Ok(Value::String(p.name)));
        r.add("refuse", |_: P| Err(RpcError::exists("x already exists")));
        r
    }

    fn err_of(reply: &str) -> (i64, String) {
        let v: Value = serde_json::from_str(reply).unwrap();
        (v["error"]["code"].as_i64().unwrap(), v["error"]["message"].as_str().unwrap().to_string())
    }

    #[test]
    fn params_are_validated_with_the_field_named() {
        let r = reg();
        let ok = r.handle(r#"{"jsonrpc":"2.0","id":1,"method":"echo","params":{"name":"a","num_blocks":3}}"#).unwrap();
        assert!(ok.contains(r#""result":"a""#), "{ok}");
        let (c, m) = err_of(&r.handle(r#"{"jsonrpc":"2.0","id":1,"method":"echo","params":{"name":"a","num_blocks":"x"}}"#).unwrap());
        assert_eq!(c, -32602);
        assert!(m.contains("num_blocks"), "{m}");
        let (c, m) = err_of(&r.handle(r#"{"jsonrpc":"2.0","id":1,"method":"echo","params":{"name":"a"}}"#).unwrap());
        assert_eq!(c, -32602);
        assert!(m.contains("num_blocks"), "{m}");
        let (c, m) = err_of(&r.handle(r#"{"jsonrpc":"2.0","id":1,"method":"echo","params":{"name":"a","num_blocks":1,"bogus":1}}"#).unwrap());
        assert_eq!(c, -32602);
        assert!(m.contains("bogus"), "{m}");
        let (c, _) = err_of(&r.handle(r#"{"jsonrpc":"2.0","id":1,"method":"echo","params":[1]}"#).unwrap());
        assert_eq!(c, -32602);
        let (c, _) = err_of(&r.handle(r#"{"jsonrpc":"2.0","id":1,"method":"nope"}"#).unwrap());
        assert_eq!(c, -32601);
        let (c, m) = err_of(&r.handle(r#"{"jsonrpc":"2.0","id":1,"method":"refuse","params":{"name":"a","num_blocks":1}}"#).unwrap());
        assert_eq!((c, m.as_str()), (-17, "x already exists"));
        assert_eq!(r.call("echo", serde_json::json!({"name":"z","num_blocks":1})), Ok(Value::String("z".into())));
    }

    /// The replies of `handle` are those of jsonrpc-core's own request handling, which logs
    /// whole requests and replies (secrets included) and so is not used.
    #[test]
    fn handle_answers_as_jsonrpc_core_does() {
        let r = reg();
        for req in [
            r#"{"jsonrpc":"2.0","id":1,"method":"echo","params":{"name":"a","num_blocks":3}}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"refuse","params":{"name":"a","num_blocks":1}}"#,
            r#"[{"jsonrpc":"2.0","id":3,"method":"echo","params":{"name":"c","num_blocks":1}},{"jsonrpc":"2.0","id":4,"method":"nope"}]"#,
            r#"{"jsonrpc":"2.0","method":"echo","params":{"name":"n","num_blocks":1}}"#,
            r#"{"jsonrpc":"2.0","id":5}"#,
            r#"{"id":6,"method":"echo"}"#,
            r#"[1]"#,
            r#"not json"#,
            r#""#,
        ] {
            assert_eq!(r.handle(req), r.io.handle_request_sync(req), "{req}");
        }
    }

    #[test]
    fn socket_survives_garbage_and_answers_batches() {
        let dir = std::env::temp_dir().join(format!("riser-rpc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let server = RpcServer::start(&path, Arc::new(reg())).unwrap();
        // Two requests in one write, unframed, and a batch.
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(br#"{"jsonrpc":"2.0","id":1,"method":"echo","params":{"name":"a","num_blocks":1}}{"jsonrpc":"2.0","id":2,"#).unwrap();
        c.write_all(br#""method":"echo","params":{"name":"b","num_blocks":1}}[{"jsonrpc":"2.0","id":3,"method":"echo","params":{"name":"c","num_blocks":1}},{"jsonrpc":"2.0","id":4,"method":"nope"}]"#).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        while serde_json::Deserializer::from_slice(&got).into_iter::<Value>().filter_map(Result::ok).count() < 3 {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        let vals: Vec<Value> = serde_json::Deserializer::from_slice(&got).into_iter::<Value>().map(Result::unwrap).collect();
        assert_eq!(vals[0]["result"], "a");
        assert_eq!(vals[1]["result"], "b");
        assert_eq!(vals[2].as_array().unwrap().len(), 2);
        // Garbage: parse error, connection closed, server alive.
        let mut g = UnixStream::connect(&path).unwrap();
        g.write_all(b"}}}not json").unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert!(s.contains("-32700"), "{s}");
        let mut c2 = UnixStream::connect(&path).unwrap();
        c2.write_all(br#"{"jsonrpc":"2.0","id":9,"method":"echo","params":{"name":"alive","num_blocks":1}}"#).unwrap();
        let n = c2.read(&mut buf).unwrap();
        assert!(std::str::from_utf8(&buf[..n]).unwrap().contains("alive"));
        // A second server on the same live socket is refused.
        assert!(RpcServer::start(&path, Arc::new(reg())).is_err());
        server.shutdown();
        assert!(!path.exists());
    }
}
