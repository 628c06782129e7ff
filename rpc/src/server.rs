//! The JSON-RPC 2.0 server: a Unix socket speaking SPDK's wire format (bare JSON values
//! back to back on the stream, no framing; batches allowed), methods registered with typed
//! parameters, and errors shaped as SPDK sends them.
//!
//! Each client gets its own thread (control plane only; capped), so a slow or hostile
//! client never blocks another. A malformed request gets an error reply and, when the
//! stream can no longer be parsed, a closed connection; the server goes on.
//!
//! The socket is reachable by its owner only (mode 0600), or by the owner and one group
//! (0660, `riser --rpc-group`): anyone who can connect can configure riser and read its CHAP
//! secrets. It is never wider, not even while it is being created: it is bound inside a
//! private directory (0700) next to the path, given its mode and group there, and then
//! linked into place with link(2), which refuses to replace anything. What is already at
//! the path is kept and refused (a regular file, a directory, a symlink, a socket some
//! process still answers on, a socket of another user) except a socket of this user that no
//! one answers on: that is what a riser that died leaves, and it is removed, with a log line.
//!
//! Secrets in requests (`iscsi_create_auth_group`, ...) and replies (`iscsi_get_auth_groups`,
//! save_config): a client's read buffer, the text of each request and each reply, the JSON
//! value each request was parsed into and each method's result are overwritten once used
//! ([`zeroize_value`], `Zeroizing`), and the decoded parameters hold secrets in `Zeroizing`
//! strings (the strings jsonrpc-core parsed, moved, not copied). Not covered: the old
//! allocation of a buffer or string that grew (the read buffer, serde_json's output while it
//! writes a reply), a JSON value a method builds and drops on its own, and the kernel's
//! socket buffers.

use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use jsonrpc_core::{ErrorCode, IoHandler, Params};
use serde::de::DeserializeOwned;
use serde_json::Value;
use zeroize::Zeroizing;

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
        response.map(|mut r| {
            let text =
                serde_json::to_string(&r).unwrap_or_else(|e| error_reply(Value::Null, -32603, &format!("Internal error: {e}")));
            // Results may hold secrets (iscsi_get_auth_groups, save_config).
            let outputs = match &mut r {
                jsonrpc_core::Response::Single(o) => std::slice::from_mut(o),
                jsonrpc_core::Response::Batch(v) => v.as_mut_slice(),
            };
            for o in outputs {
                if let jsonrpc_core::Output::Success(s) = o {
                    zeroize_value(&mut s.result);
                }
            }
            text
        })
    }

    /// Calls a method in-process (used to replay `--json` config files). Requests and
    /// replies may hold secrets: the texts and the JSON made here are overwritten once used
    /// (the result returned is the caller's).
    pub fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let mut req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let text = Zeroizing::new(req.to_string());
        zeroize_value(&mut req);
        let reply = Zeroizing::new(self.handle(&text).ok_or_else(|| RpcError::internal("no reply"))?);
        let mut reply: Value = serde_json::from_str(&reply).map_err(|e| RpcError::internal(e.to_string()))?;
        let out = match reply.get("error") {
            Some(err) => Err(RpcError::new(
                err.get("code").and_then(Value::as_i64).unwrap_or(-32603),
                err.get("message").and_then(Value::as_str).unwrap_or("unknown error"),
            )),
            None => Ok(reply.get("result").cloned().unwrap_or(Value::Null)),
        };
        zeroize_value(&mut reply);
        out
    }
}

/// Who may use the socket besides its owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketAccess {
    /// None: the owner only (mode 0600). Some(gid): that group too (0660, the socket's group
    /// set to it; a group the process is not in needs root).
    pub group: Option<u32>,
}

/// The group id of `name`: a number is taken as it is, a name is looked up in /etc/group
/// (groups only a name service knows need their number).
pub fn group_id(name: &str) -> Result<u32, String> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").map_err(|e| format!("cannot read /etc/group: {e}"))?;
    groups
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let (n, _, gid) = (f.next()?, f.next()?, f.next()?);
            (n == name).then(|| gid.parse::<u32>().ok()).flatten()
        })
        .next()
        .ok_or_else(|| format!("no group {name:?} in /etc/group (give its number instead)"))
}

/// A running server. [`RpcServer::shutdown`] (or drop) stops it and removes the socket (if
/// the path still is that socket).
pub struct RpcServer {
    path: PathBuf,
    /// Device and inode of the socket at `path`: shutdown removes only that.
    ident: (u64, u64),
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl RpcServer {
    /// Binds `path` for its owner only (mode 0600) and serves; see [`Self::start_with`].
    pub fn start(path: &Path, registry: Arc<RpcRegistry>) -> io::Result<RpcServer> {
        RpcServer::start_with(path, registry, SocketAccess::default())
    }

    /// Binds `path` with the mode and group `access` says (no moment where it is wider) and
    /// serves. Refused (nothing touched): a path that exists and is not a socket, a socket of
    /// another user, one that a process answers on. A socket of this user that no process
    /// answers on (a riser that died) is removed first, and the log says so.
    pub fn start_with(path: &Path, registry: Arc<RpcRegistry>, access: SocketAccess) -> io::Result<RpcServer> {
        let (listener, ident) = bind_private(path, access)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let accept = thread::Builder::new()
            .name("rpc".into())
            .spawn(move || accept_loop(listener, registry, stop2));
        let accept = match accept {
            Ok(a) => a,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        let who = match access.group {
            None => "owner only, mode 0600".to_string(),
            Some(g) => format!("owner and group {g}, mode 0660"),
        };
        log::info!("JSON-RPC server listening on {} ({who})", path.display());
        Ok(RpcServer { path: path.to_path_buf(), ident, stop, accept: Some(accept) })
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
        // Only our socket: whatever replaced it since is someone else's.
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.ident => {
                let _ = std::fs::remove_file(&self.path);
            }
            Ok(_) => log::warn!("{} is no longer riser's socket; left in place", self.path.display()),
            Err(_) => {}
        }
    }
}

/// What is at `path` before riser binds it: nothing or a stale socket (removed) is fine;
/// anything else is refused with an error that says what it is. `uid`: this process's
/// (effective) user.
fn clear_stale(path: &Path, uid: u32) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let ft = meta.file_type();
    let refuse = |what: &str| {
        Err(io::Error::new(
            ErrorKind::AlreadyExists,
            format!("{} exists and is {what}; refusing to replace it (remove it, or choose another path with -r)", path.display()),
        ))
    };
    if ft.is_symlink() {
        return refuse("a symbolic link");
    }
    if ft.is_dir() {
        return refuse("a directory");
    }
    if ft.is_file() {
        return refuse("a regular file");
    }
    if !ft.is_socket() {
        return refuse("not a socket");
    }
    if meta.uid() != uid {
        return refuse(&format!("a socket of user {}, not of this riser's user {uid}", meta.uid()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            ErrorKind::AddrInUse,
            format!("{} is in use: a process answers on it (another riser running?)", path.display()),
        )),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)?;
            log::warn!(
                "{}: removed a stale socket (no process answers on it: left by a riser that did not shut down cleanly)",
                path.display()
            );
            Ok(())
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("{} is a socket riser cannot tell is stale ({e}); refusing to replace it", path.display()),
        )),
    }
}

/// Binds a Unix socket at `path` that is never reachable beyond `access`: created in a
/// private directory (0700) in `path`'s directory, given its group and mode there, then
/// hard-linked to `path` (link(2) fails if anything appeared there meanwhile) and its
/// temporary name removed. Returns the listener and the socket's (device, inode).
fn bind_private(path: &Path, access: SocketAccess) -> io::Result<(UnixListener, (u64, u64))> {
    let Some(name) = path.file_name() else {
        return Err(io::Error::new(ErrorKind::InvalidInput, format!("{}: not a file path", path.display())));
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // The private directory; its owner is this process's effective user.
    let mut private = None;
    for n in 0..16u32 {
        let p = dir.join(format!(".{}.{}.{n}", name.to_string_lossy(), std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => {
                private = Some(p);
                break;
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("cannot create a directory in {}: {e}", dir.display()))),
        }
    }
    let Some(private) = private else {
        return Err(io::Error::new(ErrorKind::AlreadyExists, format!("cannot create a private directory in {}", dir.display())));
    };
    let tmp = private.join("s");
    let result = (|| {
        let uid = std::fs::metadata(&private)?.uid();
        clear_stale(path, uid)?;
        let listener = UnixListener::bind(&tmp).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", tmp.display())))?;
        if let Some(gid) = access.group {
            std::os::unix::fs::chown(&tmp, None, Some(gid))
                .map_err(|e| io::Error::new(e.kind(), format!("cannot give the socket to group {gid}: {e}")))?;
        }
        let mode = if access.group.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        std::fs::hard_link(&tmp, path).map_err(|e| match e.kind() {
            ErrorKind::AlreadyExists => io::Error::new(
                e.kind(),
                format!("{} appeared while riser was starting; refusing to replace it", path.display()),
            ),
            _ => io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        })?;
        let m = std::fs::symlink_metadata(path)?;
        Ok((listener, (m.dev(), m.ino())))
    })();
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&private);
    result
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
    // Requests carry CHAP secrets: overwritten when the client goes.
    let mut buf: Zeroizing<Vec<u8>> = Zeroizing::new(Vec::new());
    let mut chunk: Zeroizing<Vec<u8>> = Zeroizing::new(vec![0u8; 64 * 1024]);
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

/// Overwrites every string in `v` (values, not object keys): JSON that held secrets, before
/// it is dropped. Keys stay (serde_json's maps do not lend them mutably); riser's keys are
/// field names, never secrets.
pub fn zeroize_value(v: &mut Value) {
    use zeroize::Zeroize;
    match v {
        Value::String(s) => s.zeroize(),
        Value::Array(a) => a.iter_mut().for_each(zeroize_value),
        Value::Object(m) => m.values_mut().for_each(zeroize_value),
        _ => {}
    }
}

/// The reply to one request (zeroized when dropped: it may hold secrets, as may the
/// request's text made here and the parsed request, overwritten once answered).
fn answer(reg: &RpcRegistry, mut v: Value) -> Option<Zeroizing<String>> {
    if let Some(m) = v.get("method").and_then(Value::as_str) {
        log::debug!("rpc call {m}");
    }
    match v {
        // JSON-RPC 2.0 §6: an empty batch is answered with one Invalid Request error.
        Value::Array(ref a) if a.is_empty() => Some(error_reply(Value::Null, -32600, "Invalid Request: empty batch").into()),
        Value::Object(_) | Value::Array(_) => {
            let request = Zeroizing::new(v.to_string());
            zeroize_value(&mut v);
            reg.handle(&request).map(Zeroizing::new)
        }
        _ => Some(error_reply(Value::Null, -32600, "Invalid request: expected a JSON object or array").into()),
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

    /// A fresh, empty directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("riser-rpc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// One request over the socket at `path`: the `echo` of `name`.
    fn echo(path: &Path, name: &str) -> Value {
        let mut c = UnixStream::connect(path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"name": name, "num_blocks": 1}});
        c.write_all(req.to_string().as_bytes()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "closed");
            got.extend_from_slice(&buf[..n]);
            if let Some(Ok(v)) = serde_json::Deserializer::from_slice(&got).into_iter::<Value>().next() {
                return v["result"].clone();
            }
        }
    }

    #[test]
    fn zeroize_value_overwrites_every_string() {
        let mut v = serde_json::json!({"a": "SECRET", "b": [1, "SECRET", {"c": "SECRET"}], "d": null, "e": true});
        zeroize_value(&mut v);
        assert_eq!(v, serde_json::json!({"a": "", "b": [1, "", {"c": ""}], "d": null, "e": true}));
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn the_socket_is_its_owners_only_or_a_groups() {
        let d = scratch("mode");
        let path = d.join("r.sock");
        let server = RpcServer::start(&path, Arc::new(reg())).unwrap();
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_socket());
        assert_eq!(mode_of(&path), 0o600, "whatever the umask");
        assert_eq!(echo(&path, "owner"), "owner");
        // The private directory it was made in is gone.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        server.shutdown();
        assert!(!path.exists());

        // A group: 0660, and the socket is that group's (ours here: no root needed).
        let gid = std::fs::metadata(&d).unwrap().gid();
        let server = RpcServer::start_with(&path, Arc::new(reg()), SocketAccess { group: Some(gid) }).unwrap();
        assert_eq!(mode_of(&path), 0o660);
        assert_eq!(std::fs::symlink_metadata(&path).unwrap().gid(), gid);
        assert_eq!(echo(&path, "group"), "group");
        server.shutdown();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn what_is_not_a_stale_socket_of_ours_is_refused_and_kept() {
        let d = scratch("refuse");
        let path = d.join("r.sock");
        let start = |p: &Path| RpcServer::start(p, Arc::new(reg())).map(|_| ()).unwrap_err().to_string();

        std::fs::write(&path, "keep me").unwrap();
        assert!(start(&path).contains("exists and is a regular file; refusing to replace it"), "{}", start(&path));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
        std::fs::remove_file(&path).unwrap();

        let target = d.join("target");
        std::fs::write(&target, "keep me too").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(start(&path).contains("is a symbolic link"));
        assert_eq!(std::fs::read_link(&path).unwrap(), target);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me too");
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(d.join("nowhere"), &path).unwrap();
        assert!(start(&path).contains("is a symbolic link"), "a dangling link too");
        std::fs::remove_file(&path).unwrap();

        std::fs::create_dir(&path).unwrap();
        assert!(start(&path).contains("is a directory"));
        assert!(path.is_dir());
        std::fs::remove_dir(&path).unwrap();

        // A socket some process answers on.
        let live = UnixListener::bind(&path).unwrap();
        let e = RpcServer::start(&path, Arc::new(reg())).map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
        assert!(UnixStream::connect(&path).is_ok(), "the live socket still answers");
        drop(live);

        // A stale socket of another user is not ours to remove (root can make one).
        if std::os::unix::fs::chown(&path, Some(65534), None).is_ok() {
            assert!(start(&path).contains("a socket of user 65534"), "{}", start(&path));
            assert_eq!(std::fs::symlink_metadata(&path).unwrap().uid(), 65534);
        }
        // Nothing else was left behind.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 2, "the stale socket and the link's target");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_stale_socket_of_a_dead_riser_is_replaced() {
        let d = scratch("stale");
        let path = d.join("r.sock");
        // What a riser killed with SIGKILL leaves: a socket no one answers on.
        drop(UnixListener::bind(&path).unwrap());
        assert!(UnixStream::connect(&path).is_err());
        let server = RpcServer::start(&path, Arc::new(reg())).unwrap();
        assert_eq!(mode_of(&path), 0o600);
        assert_eq!(echo(&path, "fresh"), "fresh");
        server.shutdown();
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Shutdown removes riser's socket only: what took its place meanwhile stays.
    #[test]
    fn shutdown_removes_only_its_own_socket() {
        let d = scratch("own");
        let path = d.join("r.sock");
        let server = RpcServer::start(&path, Arc::new(reg())).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "someone else's").unwrap();
        server.shutdown();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "someone else's");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn groups_by_name_or_number() {
        assert_eq!(group_id("0"), Ok(0));
        assert_eq!(group_id("root"), Ok(0));
        assert!(group_id("no-such-group-here").unwrap_err().contains("give its number"));
    }
}
