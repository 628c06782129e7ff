//! Target URLs: `iscsi://host[:port]/IQN/LUN` (libiscsi's form, without credentials: CHAP
//! takes `--chap`) for iSCSI over TCP, and `iser://host[:port]/IQN/LUN` for iSER (RDMA:
//! InfiniBand, RoCE).
//!
//! The host is a name, an IPv4 address or an IPv6 address in brackets (`[::1]`); the port
//! defaults to 3260 (the iSCSI well-known port, also iSER's); the LUN is a decimal number
//! below 16384 (peripheral addressing below 256, flat space addressing above).

use std::fmt;

pub const DEFAULT_PORT: u16 = 3260;
/// Highest LUN that single-level peripheral / flat space addressing can carry.
pub const MAX_LUN: u64 = 16383;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Iser,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetUrl {
    pub transport: Transport,
    /// Host as written, without IPv6 brackets.
    pub host: String,
    pub port: u16,
    /// Target name (iqn./eui./naa. form; taken as written apart from a sanity check).
    pub iqn: String,
    pub lun: u64,
}

impl fmt::Display for TargetUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.transport {
            Transport::Tcp => "iscsi",
            Transport::Iser => "iser",
        };
        if self.host.contains(':') {
            write!(
                f,
                "{scheme}://[{}]:{}/{}/{}",
                self.host, self.port, self.iqn, self.lun
            )
        } else {
            write!(
                f,
                "{scheme}://{}:{}/{}/{}",
                self.host, self.port, self.iqn, self.lun
            )
        }
    }
}

impl TargetUrl {
    /// `host:port` for `ToSocketAddrs` (IPv6 in brackets).
    pub fn socket_addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The 8-byte LUN field of the URL's LUN (see [`lun_field`]).
    pub fn lun_field(&self) -> u64 {
        lun_field(self.lun)
    }
}

/// The 8-byte LUN field of LUN `lun` (at most [`MAX_LUN`]; SAM-5 4.6.6 peripheral device
/// addressing below 256, 4.6.7 flat space addressing up to 16383), as a big-endian u64 the
/// way the PDU carries it.
pub fn lun_field(lun: u64) -> u64 {
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        let l = (lun & 0x3fff) as u16;
        b[0] = 0x40 | (l >> 8) as u8;
        b[1] = l as u8;
    }
    u64::from_be_bytes(b)
}

/// Parses one URL, or says exactly what is wrong with it.
pub fn parse(url: &str) -> Result<TargetUrl, String> {
    let bad = |why: &str| {
        format!("bad URL \"{url}\": {why} (expected iscsi://host[:port]/IQN/LUN or iser://host[:port]/IQN/LUN)")
    };
    let (transport, rest) = if let Some(r) = strip_prefix_ci(url, "iscsi://") {
        (Transport::Tcp, r)
    } else if let Some(r) = strip_prefix_ci(url, "iser://") {
        (Transport::Iser, r)
    } else {
        return Err(bad("the scheme must be iscsi:// or iser://"));
    };
    let (authority, path) = rest
        .split_once('/')
        .ok_or_else(|| bad("no target name after the host"))?;
    if authority.contains('@') {
        // Secrets stay out of URLs, which riser-perf prints; not even this message quotes it.
        return Err("bad URL: credentials in the URL are not accepted: give CHAP credentials with --chap USER:SECRET (expected iscsi://host[:port]/IQN/LUN or iser://host[:port]/IQN/LUN)".into());
    }
    let (host, port) = split_host_port(authority).map_err(|e| bad(&e))?;
    // The IQN itself contains no '/'; the LUN is what follows the last one.
    let (iqn, lun) = path
        .rsplit_once('/')
        .ok_or_else(|| bad("no LUN after the target name"))?;
    if iqn.is_empty() {
        return Err(bad("empty target name"));
    }
    if iqn.contains('/') {
        return Err(bad("a target name cannot contain '/'"));
    }
    if iqn.len() > 223 {
        return Err(bad("the target name is longer than 223 bytes"));
    }
    if !iqn
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'))
    {
        return Err(bad("the target name has characters outside [a-z0-9.-:_]"));
    }
    if lun.is_empty() {
        return Err(bad("empty LUN"));
    }
    if !lun.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(&format!("LUN \"{lun}\" is not a decimal number")));
    }
    let lun: u64 = lun
        .parse()
        .ok()
        .filter(|l| *l <= MAX_LUN)
        .ok_or_else(|| bad(&format!("LUN {lun} is above {MAX_LUN}")))?;
    Ok(TargetUrl {
        transport,
        host,
        port,
        iqn: iqn.to_string(),
        lun,
    })
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

fn split_host_port(a: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = a.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or("an IPv6 address needs its closing ']'")?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or("only \":port\" may follow an IPv6 address")?,
            ),
        };
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("\"{h}\" is not an IPv6 address"));
        }
        (h, port)
    } else {
        match a.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    if !host.contains(':')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return Err(format!("\"{host}\" is not a host name or address"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("port \"{p}\" is not a number from 1 to 65535"))?,
    };
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_urls() {
        let u = parse("iscsi://127.0.0.1:3264/iqn.2016-06.io.riser:null/0").unwrap();
        assert_eq!(u.transport, Transport::Tcp);
        assert_eq!((u.host.as_str(), u.port, u.lun), ("127.0.0.1", 3264, 0));
        assert_eq!(u.iqn, "iqn.2016-06.io.riser:null");
        assert_eq!(u.socket_addr(), "127.0.0.1:3264");
        assert_eq!(
            u.to_string(),
            "iscsi://127.0.0.1:3264/iqn.2016-06.io.riser:null/0"
        );

        let u = parse("iscsi://storage-1.example/iqn.2024-01.test.peer:file/1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.lun),
            ("storage-1.example", 3260, 1)
        );

        let u = parse("ISCSI://[::1]:3265/eui.0123456789abcdef/300").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.lun), ("::1", 3265, 300));
        assert_eq!(u.socket_addr(), "[::1]:3265");
        let u = parse("iscsi://[fe80::1]/iqn.x:y/7").unwrap();
        assert_eq!(u.port, 3260);

        let u = parse("iser://10.0.0.1/iqn.x:y/2").unwrap();
        assert_eq!(u.transport, Transport::Iser);
        assert_eq!((u.host.as_str(), u.port, u.lun), ("10.0.0.1", 3260, 2));
        assert_eq!(u.socket_addr(), "10.0.0.1:3260");
        assert_eq!(u.to_string(), "iser://10.0.0.1:3260/iqn.x:y/2");
        let u = parse("ISER://[fd00::2]:3261/iqn.2003-01.org.linux-iscsi.x:t/1").unwrap();
        assert_eq!(
            (u.transport, u.host.as_str(), u.port, u.lun),
            (Transport::Iser, "fd00::2", 3261, 1)
        );
        assert!(parse("iser://h/iqn.x")
            .unwrap_err()
            .contains("iser://host[:port]/IQN/LUN"));
    }

    #[test]
    fn lun_field_encoding() {
        let lun = |n| parse(&format!("iscsi://h/iqn.x/{n}")).unwrap().lun_field();
        assert_eq!(lun(0), 0);
        assert_eq!(lun(1), 0x0001_0000_0000_0000);
        assert_eq!(lun(255), 0x00ff_0000_0000_0000);
        assert_eq!(lun(256), 0x4100_0000_0000_0000);
        assert_eq!(lun(16383), 0x7fff_0000_0000_0000);
    }

    #[test]
    fn bad_urls_say_why() {
        let err = |u: &str| parse(u).expect_err(u);
        assert!(err("http://h/iqn.x/0").contains("scheme"));
        assert!(err("127.0.0.1/iqn.x/0").contains("scheme"));
        assert!(err("iscsi://h").contains("no target name"));
        assert!(err("iscsi://h/iqn.x").contains("no LUN"));
        assert!(err("iscsi://h/iqn.x/").contains("empty LUN"));
        assert!(err("iscsi://h//0").contains("empty target name"));
        assert!(err("iscsi://h/iqn.x/a/0").contains("'/'"));
        assert!(err("iscsi://h/iqn.x/one").contains("not a decimal"));
        assert!(err("iscsi://h/iqn.x/-1").contains("not a decimal"));
        assert!(err("iscsi://h/iqn.x/16384").contains("above 16383"));
        assert!(err("iscsi://h/iqn.x/99999999999999999999999").contains("above"));
        assert!(err("iscsi://h:0/iqn.x/0").contains("port"));
        assert!(err("iscsi://h:65536/iqn.x/0").contains("port"));
        assert!(err("iscsi://h:abc/iqn.x/0").contains("port"));
        assert!(err("iscsi://:3260/iqn.x/0").contains("empty host"));
        assert!(err("iscsi://[::1/iqn.x/0").contains("']'"));
        assert!(err("iscsi://[zz]/iqn.x/0").contains("IPv6"));
        assert!(err("iscsi://[::1]x/iqn.x/0").contains(":port"));
        assert!(err("iscsi://user%pw@h/iqn.x/0").contains("CHAP"));
        assert!(!err("iscsi://user%pw@h/iqn.x/0").contains("pw"), "the secret is not repeated");
        assert!(err("iscsi://h o/iqn.x/0").contains("host"));
        assert!(err("iscsi://h/iqn x/0").contains("characters"));
        // Every message quotes the URL and the expected form.
        assert!(err("iscsi://h/iqn.x").contains("iscsi://host[:port]/IQN/LUN"));
    }
}
