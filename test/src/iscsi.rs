//! A small, deliberately low-level iSCSI initiator for tests: it speaks the wire format
//! through riser-iscsi's codec, so tests can send well-formed traffic and also exactly the
//! malformed traffic they want (truncated headers, bad digests, oversized segments).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use riser_iscsi::framer::{Framer, FramerLimits};
use riser_iscsi::pdu::{Bhs, DataOut, Digests, Isid, LoginRequest, NopOut, Op, Pdu, ScsiCommand, Stage, TextRequest, BHS_LEN};
use riser_iscsi::serial::{Itt, Sn};
use riser_iscsi::testing::{data_out, nop_out, read10, scsi_command, text_request, write10};
use riser_iscsi::text::{encode_pairs, parse_pairs, Pairs};

pub const INITIATOR: &str = "iqn.2024-01.io.riser.test:initiator";

/// A connection speaking iSCSI (or deliberately not).
pub struct Client {
    pub sock: TcpStream,
    framer: Framer,
    pub digests: Digests,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
    next_itt: u32,
    /// The ISID this client logs in with (copy it to another client to join or reinstate).
    pub isid: [u8; 6],
    /// 0 for a new session; a session's TSIH to add a connection to it (set after login).
    pub tsih: u16,
    /// The connection ID sent at login.
    pub cid: u16,
}

impl Client {
    pub fn connect(port: u16) -> Client {
        let sock = TcpStream::connect(("127.0.0.1", port)).expect("connect to riser");
        Client::over(sock)
    }

    /// A client on a connection made elsewhere (e.g. [`connect_from`], another source address).
    pub fn over(sock: TcpStream) -> Client {
        sock.set_read_timeout(Some(Duration::from_secs(10))).ok();
        sock.set_nodelay(true).ok();
        let mut framer = Framer::with_limits(FramerLimits { max_recv_data_segment_length: 1 << 20, max_ahs_length: 1020 });
        framer.set_digests(Digests::default());
        Client {
            sock,
            framer,
            digests: Digests::default(),
            cmd_sn: Sn(1),
            exp_stat_sn: Sn(0),
            next_itt: 1,
            isid: unique_isid(),
            tsih: 0,
            cid: 1,
        }
    }

    pub fn itt(&mut self) -> Itt {
        self.next_itt += 1;
        Itt(self.next_itt)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.sock.write_all(bytes)
    }

    pub fn send(&mut self, pdu: &Pdu) -> std::io::Result<()> {
        let bytes = pdu.to_bytes(self.digests).expect("encode");
        self.sock.write_all(&bytes)
    }

    /// The next PDU, or None when the target closed the connection (or timed out).
    pub fn recv(&mut self) -> Option<Pdu> {
        let mut buf = [0u8; 65536];
        loop {
            match self.framer.next_pdu() {
                Ok(Some(p)) => {
                    if let Some(sn) = stat_sn_of(&p) {
                        self.exp_stat_sn = sn.next();
                    }
                    return Some(p);
                }
                Ok(None) => {}
                Err(e) => panic!("target sent something unparsable: {e}"),
            }
            match self.sock.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.framer.feed(&buf[..n]),
            }
        }
    }

    /// How long a read for the target's answer waits (10 s at first): longer for a command
    /// the target may hold on purpose (a PR OUT waiting for another gateway's lease).
    pub fn set_read_timeout(&mut self, d: Duration) {
        self.sock.set_read_timeout(Some(d)).ok();
    }

    /// Waits until the target closes the connection; false if it stays open `within`.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        self.sock.set_read_timeout(Some(within)).ok();
        let mut buf = [0u8; 4096];
        let deadline = std::time::Instant::now() + within;
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                    return false
                }
                Err(_) => return true,
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
        }
    }

    pub fn login_request(&mut self, csg: Stage, nsg: Stage, transit: bool, keys: &[(&str, &str)]) -> Pdu {
        let itt = self.itt();
        Pdu::with_data(
            Op::LoginRequest(LoginRequest {
                transit_bit: transit,
                continue_bit: false,
                csg,
                nsg,
                version_max: 0,
                version_min: 0,
                isid: Isid(self.isid),
                tsih: self.tsih,
                itt,
                cid: self.cid,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            }),
            encode_pairs(keys),
        )
    }

    /// A full login (security stage skipped) with extra operational keys; returns the keys
    /// the target answered, or the login status on failure.
    pub fn login(&mut self, target: &str, extra: &[(&str, &str)]) -> Result<Pairs, (u8, u8)> {
        // Digests start after login (RFC 7143 §13.1).
        let digests = std::mem::take(&mut self.digests);
        let keys: Vec<(&str, &str)> = vec![
            ("InitiatorName", INITIATOR),
            ("TargetName", target),
            ("SessionType", "Normal"),
            ("AuthMethod", "None"),
        ];
        let req = self.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, true, &keys);
        let answered = self.login_step(&req)?.1;
        self.operational(digests, answered, extra)
    }

    /// Sends one Login Request and reads its response: (transit to the next stage, the keys
    /// answered), or the failing status ((0xff, 0xff): the connection closed).
    pub fn login_step(&mut self, req: &Pdu) -> Result<(bool, Pairs), (u8, u8)> {
        self.send(req).map_err(|_| (0xff, 0xff))?;
        let resp = self.recv().ok_or((0xff, 0xff))?;
        let Op::LoginResponse(r) = &resp.bhs.op else { panic!("expected a Login Response, got {:?}", resp.bhs.op) };
        if r.status.class != 0 {
            return Err((r.status.class, r.status.detail));
        }
        Ok((r.transit_bit, parse_pairs(&resp.data).unwrap_or_default()))
    }

    /// A login with CHAP as `user` with `secret` (one-way; AuthMethod=CHAP, then CHAP_A, then
    /// CHAP_N / CHAP_R), as InitiatorName `initiator`; then the operational stage as
    /// [`login`](Self::login) does.
    pub fn login_chap(&mut self, initiator: &str, target: &str, user: &str, secret: &str) -> Result<Pairs, (u8, u8)> {
        use riser_iscsi::chap::{ChapCredentials, ChapInitiator, ChapInitiatorConfig};
        let digests = std::mem::take(&mut self.digests);
        let mut chap = ChapInitiator::new(ChapInitiatorConfig::new(ChapCredentials::new(user, secret)));
        let keys = [("InitiatorName", initiator), ("TargetName", target), ("SessionType", "Normal"), ("AuthMethod", "CHAP")];
        let req = self.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, false, &keys);
        let (_, mut answered) = self.login_step(&req)?;
        let offer = chap.offer().map_err(|_| (0xfe, 0))?;
        let offer: Vec<(&str, &str)> = offer.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let req = self.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, false, &offer);
        let (_, challenge) = self.login_step(&req)?;
        let answer = chap.respond(&challenge).map_err(|_| (0xfe, 1))?;
        let answer: Vec<(&str, &str)> = answer.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let req = self.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, true, &answer);
        let (transit, got) = self.login_step(&req)?;
        if !transit {
            return Err((0xfe, 2));
        }
        answered.extend(got);
        self.operational(digests, answered, &[])
    }

    /// The operational stage of a login, up to full-feature phase, asking for `digests` (in
    /// use from then on).
    fn operational(&mut self, digests: Digests, mut answered: Pairs, extra: &[(&str, &str)]) -> Result<Pairs, (u8, u8)> {
        let mut keys: Vec<(&str, &str)> = vec![
            ("HeaderDigest", if digests.header { "CRC32C" } else { "None" }),
            ("DataDigest", if digests.data { "CRC32C" } else { "None" }),
            ("ImmediateData", "Yes"),
            ("InitialR2T", "Yes"),
            ("MaxRecvDataSegmentLength", "262144"),
        ];
        keys.extend_from_slice(extra);
        let mut req = self.login_request(Stage::LoginOperationalNegotiation, Stage::FullFeaturePhase, true, &keys);
        loop {
            self.send(&req).expect("send login");
            let resp = self.recv().ok_or((0xff, 0xff))?;
            let Op::LoginResponse(r) = &resp.bhs.op else { panic!("expected a Login Response") };
            if r.status.class != 0 {
                return Err((r.status.class, r.status.detail));
            }
            let got = parse_pairs(&resp.data).unwrap_or_default();
            answered.extend(got.iter().cloned());
            if r.transit_bit && r.nsg == Stage::FullFeaturePhase {
                self.cmd_sn = r.exp_cmd_sn;
                self.tsih = r.tsih;
                break;
            }
            // The target offered keys of its own (RFC 7143 §6.2): accept its values.
            let offers: Vec<(String, String)> =
                got.into_iter().filter(|(k, _)| !keys.iter().any(|(s, _)| s == k)).collect();
            let offers: Vec<(&str, &str)> = offers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            req = self.login_request(Stage::LoginOperationalNegotiation, Stage::FullFeaturePhase, true, &offers);
        }
        self.digests = digests;
        self.framer.set_digests(digests);
        Ok(answered)
    }

    pub fn scsi_command(&mut self, cdb: &[u8], read: bool, write: bool, edtl: u32, data: Vec<u8>) -> Pdu {
        let itt = self.itt();
        let cmd = ScsiCommand { exp_stat_sn: self.exp_stat_sn, ..scsi_command(itt, self.cmd_sn, read, write, edtl, cdb) };
        let pdu = Pdu::with_data(Op::ScsiCommand(cmd), data);
        self.cmd_sn = self.cmd_sn.next();
        pdu
    }

    /// WRITE(10) of `data` (whole 512-byte blocks, sent as immediate data) at `lba`;
    /// returns the SCSI status.
    pub fn write10(&mut self, lba: u32, data: &[u8]) -> Option<u8> {
        let blocks = (data.len() / 512) as u16;
        let cdb = write10(lba, blocks);
        let pdu = self.scsi_command(&cdb, false, true, data.len() as u32, data.to_vec());
        self.send(&pdu).ok()?;
        self.wait_status()
    }

    /// WRITE(10) of `data` at `lba` with no immediate data: every R2T is answered with
    /// Data-Out PDUs of at most 8 KiB; returns the SCSI status (None: the connection closed).
    pub fn write10_solicited(&mut self, lba: u32, data: &[u8]) -> Option<u8> {
        let blocks = (data.len() / 512) as u16;
        let cdb = write10(lba, blocks);
        let pdu = self.scsi_command(&cdb, false, true, data.len() as u32, Vec::new());
        let Op::ScsiCommand(cmd) = &pdu.bhs.op else { return None };
        let itt = cmd.itt;
        self.send(&pdu).ok()?;
        loop {
            let p = self.recv()?;
            match p.bhs.op {
                Op::R2t(r) if r.itt == itt => {
                    let end = (r.buffer_offset + r.desired_data_transfer_length).min(data.len() as u32);
                    let mut off = r.buffer_offset;
                    let mut data_sn = Sn(0);
                    while off < end {
                        let len = (end - off).min(8192);
                        let d = DataOut {
                            final_bit: off + len == end,
                            exp_stat_sn: self.exp_stat_sn,
                            ..data_out(itt, r.ttt, data_sn, off)
                        };
                        let seg = data[off as usize..(off + len) as usize].to_vec();
                        self.send(&Pdu::with_data(Op::DataOut(d), seg)).ok()?;
                        off += len;
                        data_sn = data_sn.next();
                    }
                }
                Op::ScsiResponse(r) if r.itt == itt => return Some(r.status),
                _ => {}
            }
        }
    }

    /// PERSISTENT RESERVE OUT (10) with a 24-byte parameter list: `sa` the service action,
    /// `ty` the type (scope LU), `flags` byte 20 (APTPL 0x01, ALL_TG_PT 0x04, SPEC_I_PT 0x08).
    pub fn pr_out(&mut self, sa: u8, ty: u8, key: u64, sark: u64, flags: u8) -> Reply {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x5F;
        cdb[1] = sa;
        cdb[2] = ty;
        cdb[5..9].copy_from_slice(&24u32.to_be_bytes());
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sark.to_be_bytes());
        p[20] = flags;
        let pdu = self.scsi_command(&cdb, false, true, 24, p);
        self.send(&pdu).expect("send PERSISTENT RESERVE OUT");
        self.reply().expect("an answer to PERSISTENT RESERVE OUT")
    }

    /// PERSISTENT RESERVE IN (service action `sa`), which must succeed: its parameter data.
    pub fn pr_in(&mut self, sa: u8) -> Vec<u8> {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x5E;
        cdb[1] = sa;
        cdb[7..9].copy_from_slice(&4096u16.to_be_bytes());
        let pdu = self.scsi_command(&cdb, true, false, 4096, Vec::new());
        self.send(&pdu).expect("send PERSISTENT RESERVE IN");
        let r = self.reply().expect("an answer to PERSISTENT RESERVE IN");
        assert_eq!(r.status, 0, "PERSISTENT RESERVE IN sa {sa}: {r:?} (sense {:?})", r.sense());
        r.data
    }

    /// READ FULL STATUS: per registrant (key, holds the reservation, ALL_TG_PT, type,
    /// initiator port from its TransportID).
    pub fn pr_full_status(&mut self) -> Vec<(u64, bool, bool, u8, String)> {
        let d = self.pr_in(3);
        let be32 = |at: usize| u32::from_be_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]]) as usize;
        let end = 8 + be32(4);
        let mut at = 8;
        let mut out = Vec::new();
        while at + 24 <= end {
            let tid_len = be32(at + 20);
            let tid = &d[at + 24..at + 24 + tid_len];
            let name: Vec<u8> = tid[4..].iter().copied().take_while(|&b| b != 0).collect();
            let key = u64::from_be_bytes(d[at..at + 8].try_into().expect("8 bytes"));
            out.push((key, d[at + 12] & 1 != 0, d[at + 12] & 2 != 0, d[at + 13], String::from_utf8_lossy(&name).into_owned()));
            at += 24 + tid_len;
        }
        out
    }

    /// READ(10); returns (status, data).
    pub fn read10(&mut self, lba: u32, blocks: u16) -> Option<(u8, Vec<u8>)> {
        let cdb = read10(lba, blocks);
        let pdu = self.scsi_command(&cdb, true, false, blocks as u32 * 512, Vec::new());
        self.send(&pdu).ok()?;
        self.reply().map(|r| (r.status, r.data))
    }

    /// Collects the Data-In PDUs and the status of the command just sent; None if the
    /// connection closed first.
    pub fn reply(&mut self) -> Option<Reply> {
        let mut data = Vec::new();
        loop {
            let p = self.recv()?;
            match p.bhs.op {
                Op::DataIn(d) => {
                    let off = d.buffer_offset as usize;
                    if data.len() < off + p.data.len() {
                        data.resize(off + p.data.len(), 0);
                    }
                    data[off..off + p.data.len()].copy_from_slice(&p.data);
                    if d.status_present {
                        return Some(Reply { status: d.status, data, sense_segment: Vec::new() });
                    }
                }
                Op::ScsiResponse(r) => return Some(Reply { status: r.status, data, sense_segment: p.data }),
                _ => {}
            }
        }
    }

    /// TEST UNIT READY until GOOD (a new I_T nexus first sees a POWER ON unit attention);
    /// returns whether the unit became ready.
    pub fn clear_unit_attentions(&mut self) -> bool {
        for _ in 0..8 {
            let pdu = self.scsi_command(&[0u8; 6], false, false, 0, Vec::new());
            if self.send(&pdu).is_err() {
                return false;
            }
            match self.wait_status() {
                Some(0) => return true,
                Some(_) => continue,
                None => return false,
            }
        }
        false
    }

    fn wait_status(&mut self) -> Option<u8> {
        loop {
            let p = self.recv()?;
            match p.bhs.op {
                Op::ScsiResponse(r) => return Some(r.status),
                Op::DataIn(d) if d.status_present => return Some(d.status),
                _ => {}
            }
        }
    }

    pub fn nop(&mut self, ping: &[u8]) -> Option<Vec<u8>> {
        let itt = self.itt();
        let nop = NopOut { exp_stat_sn: self.exp_stat_sn, ..nop_out(itt, self.cmd_sn) };
        let pdu = Pdu::with_data(Op::NopOut(nop), ping.to_vec());
        self.send(&pdu).ok()?;
        loop {
            let p = self.recv()?;
            if let Op::NopIn(n) = &p.bhs.op {
                if n.itt == itt {
                    return Some(p.data);
                }
            }
        }
    }

    pub fn text(&mut self, continue_bit: bool, data: &[u8]) -> Pdu {
        let itt = self.itt();
        let text = TextRequest { exp_stat_sn: self.exp_stat_sn, ..text_request(itt, self.cmd_sn, continue_bit) };
        Pdu::with_data(Op::TextRequest(text), data.to_vec())
    }
}

fn stat_sn_of(p: &Pdu) -> Option<Sn> {
    Some(match &p.bhs.op {
        Op::ScsiResponse(r) => r.stat_sn,
        Op::NopIn(n) if !n.itt.is_reserved() => n.stat_sn,
        Op::TextResponse(t) => t.stat_sn,
        Op::LogoutResponse(l) => l.stat_sn,
        Op::TaskMgmtResponse(t) => t.stat_sn,
        Op::DataIn(d) if d.status_present => d.stat_sn,
        _ => return None,
    })
}

/// A TCP connection to 127.0.0.1:`port` from `source` (every 127.x.y.z address is loopback
/// on Linux, so a test can play several hosts), with a receive buffer of `rcvbuf` bytes if
/// given (a small one plus never reading: a peer that advertises a zero window).
pub fn connect_from(source: std::net::Ipv4Addr, port: u16, rcvbuf: Option<i32>) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns; the addresses are valid
    // sockaddr_in values on the stack for the duration of each call; on success the descriptor
    // is handed to TcpStream, which closes it, and on failure it is closed here.
    #[allow(unsafe_code)]
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fail = |fd: i32| {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            Err(e)
        };
        if let Some(size) = rcvbuf {
            let v = &size as *const i32 as *const libc::c_void;
            if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v, 4) != 0 {
                return fail(fd);
            }
        }
        let src = sockaddr(source, 0);
        if libc::bind(fd, &src as *const libc::sockaddr_in as *const libc::sockaddr, len) != 0 {
            return fail(fd);
        }
        let dst = sockaddr(std::net::Ipv4Addr::LOCALHOST, port);
        if libc::connect(fd, &dst as *const libc::sockaddr_in as *const libc::sockaddr, len) != 0 {
            return fail(fd);
        }
        Ok(TcpStream::from_raw_fd(fd))
    }
}

/// An ISID no other client of this process has used (a collision would reinstate, and so
/// close, another test's session): random format (80h), the process id, a counter.
fn unique_isid() -> [u8; 6] {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_be_bytes();
    let pid = std::process::id().to_be_bytes();
    [0x80, pid[1], pid[2], pid[3], n[0], n[1]]
}

/// A raw 48-byte header with `opcode` and the given data segment length.
pub fn raw_header(opcode: u8, data_len: u32, itt: u32) -> [u8; BHS_LEN] {
    let mut h = [0u8; BHS_LEN];
    h[0] = opcode;
    h[1] = 0x80;
    h[5..8].copy_from_slice(&data_len.to_be_bytes()[1..]);
    h[16..20].copy_from_slice(&itt.to_be_bytes());
    h
}

/// Whether a PDU is a Reject, and its reason.
pub fn reject_reason(p: &Pdu) -> Option<u8> {
    match &p.bhs.op {
        Op::Reject(r) => Some(r.reason),
        _ => None,
    }
}

pub fn parse_header(h: &[u8; BHS_LEN]) -> Bhs {
    Bhs::parse(h).expect("valid header")
}

/// What a SCSI command came back with.
#[derive(Debug)]
pub struct Reply {
    pub status: u8,
    /// Data-In, reassembled by buffer offset.
    pub data: Vec<u8>,
    /// The SCSI Response's data segment (SenseLength, then the sense data), if any.
    pub sense_segment: Vec<u8>,
}

impl Reply {
    /// (sense key, ASC, ASCQ) of the sense data, fixed (70h/71h) or descriptor (72h/73h)
    /// format; None without sense data.
    pub fn sense(&self) -> Option<(u8, u8, u8)> {
        sense_of(&self.sense_segment)
    }
}

/// Reads (key, ASC, ASCQ) from a SCSI Response data segment: a 2-byte SenseLength, then
/// the sense data (RFC 7143 §11.4.7.2); fixed format (SPC-4 §4.5.3) or descriptor format
/// (SPC-4 §4.5.2).
pub fn sense_of(segment: &[u8]) -> Option<(u8, u8, u8)> {
    if segment.len() < 2 {
        return None;
    }
    let len = u16::from_be_bytes([segment[0], segment[1]]) as usize;
    let sense = segment.get(2..2 + len)?;
    match sense.first()? & 0x7f {
        0x70 | 0x71 if sense.len() >= 14 => Some((sense[2] & 0x0f, sense[12], sense[13])),
        0x72 | 0x73 if sense.len() >= 4 => Some((sense[1] & 0x0f, sense[2], sense[3])),
        _ => None,
    }
}
