//! Readiness for systemd (`Type=notify`, sd_notify(3) without libsystemd): one datagram to
//! `$NOTIFY_SOCKET` once the config is loaded and the RPC socket listens ("READY=1"), and one
//! when a stop begins ("STOPPING=1"). Without the variable (not under systemd) nothing is sent.

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The address `NOTIFY_SOCKET` names: a path, or "@name" for the abstract namespace.
pub fn notify_addr(var: &OsStr) -> Result<SocketAddr, String> {
    let bytes = var.as_bytes();
    match bytes.first() {
        Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]).map_err(|e| e.to_string()),
        Some(b'/') => SocketAddr::from_pathname(var).map_err(|e| e.to_string()),
        _ => Err("neither an absolute path nor @abstract".into()),
    }
}

/// Sends `state` ("READY=1", ...) to the service manager, if there is one; a failure is
/// logged, never fatal.
pub fn notify(state: &str) {
    let Some(var) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = notify_addr(&var).and_then(|addr| {
        let sock = UnixDatagram::unbound().map_err(|e| e.to_string())?;
        sock.send_to_addr(state.as_bytes(), &addr).map_err(|e| e.to_string())
    });
    match sent {
        Ok(_) => log::debug!("told the service manager {state:?}"),
        Err(e) => log::warn!("cannot notify the service manager at NOTIFY_SOCKET={}: {e}", var.to_string_lossy()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_socket_addresses() {
        let a = notify_addr(OsStr::new("/run/systemd/notify")).unwrap();
        assert_eq!(a.as_pathname(), Some(std::path::Path::new("/run/systemd/notify")));
        let a = notify_addr(OsStr::new("@/org/freedesktop/systemd1/notify/42")).unwrap();
        assert_eq!(a.as_abstract_name(), Some(&b"/org/freedesktop/systemd1/notify/42"[..]));
        assert!(notify_addr(OsStr::new("relative/path")).is_err());
        assert!(notify_addr(OsStr::new("")).is_err());
    }

    #[test]
    fn a_datagram_reaches_the_socket() {
        let dir = std::env::temp_dir().join(format!("riser-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        let addr = notify_addr(path.as_os_str()).unwrap();
        UnixDatagram::unbound().unwrap().send_to_addr(b"READY=1", &addr).unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
