//! One iSCSI/TCP connection (= one session, MaxConnections=1) of the initiator.
//!
//! The socket is non-blocking from the start. Setup (login, TEST UNIT READY, READ CAPACITY,
//! logout) waits with `poll(2)` and a deadline; the hot path never waits: the owning client
//! thread calls [`Conn::poll`] (one `read(2)`, parse every complete PDU in place) and
//! [`Conn::flush`] (one `write(2)` of everything queued) in its loop, and submits I/Os with
//! [`Conn::submit`]. Nothing is shared with other threads.
//!
//! PDUs are parsed straight out of the receive buffer with riser-iscsi's `Bhs::parse`; the
//! data of a Data-In is copied once, into the task's buffer. PDUs to send are encoded into
//! one transmit buffer, so a pass that completes 20 reads sends 20 commands in one write.
//!
//! Protocol coverage (RFC 7143): login with AuthMethod=None answering every key the target
//! offers; digests (CRC32C) if asked for; ImmediateData / InitialR2T / FirstBurstLength as
//! negotiated, unsolicited Data-Out, R2T-solicited Data-Out split at the target's
//! MaxRecvDataSegmentLength; Data-In with or without status (phase collapse) and a separate
//! SCSI Response; the CmdSN window (a command never goes out beyond MaxCmdSN: it waits);
//! NOP-In pings answered; Async Messages asking for logout end the run; logout at the end.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use riser_iscsi::digest;
use riser_iscsi::pdu::{
    padded_len, raw_data_segment_len, raw_total_ahs_len, Bhs, Digests, Lun, Op, BHS_LEN, DIGEST_LEN,
};
use riser_iscsi::serial::{Itt, Ttt};

use riser_initiator::scsi::{self, rw_cdb, status, CmdResult, Completion, Dir, IoError, ScsiExec};
use riser_initiator::session::{
    self, AbortStats, KeyNegotiation, LoginOptions, LoginParams, Negotiated, Outcome, Received,
    SessionState, TaskState, Tasks, Transport, LOGIN_MAX_RECV_DSL,
};
use crate::sys::wait_fd;
use riser_initiator::url::TargetUrl;

/// Receive buffer: several maximal PDUs, so that one read(2) picks up many completions.
const RX_BUF: usize = 1 << 20;

/// One logged-in iSCSI/TCP connection (see the module documentation).
pub struct Conn {
    sock: TcpStream,
    /// "iscsi://host:port/iqn/lun" for messages.
    pub label: String,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    tx: Vec<u8>,
    tx_off: usize,
    max_recv_dsl: u32,
    pub neg: Negotiated,
    digests: Digests,
    s: SessionState,
    pub block_size: u32,
    pub num_blocks: u64,
    t: Tasks,
    timeout: Duration,
}

fn io_err(label: &str, what: &str, e: io::Error) -> String {
    format!("{label}: {what}: {e}")
}

/// Whether the CRC32C digest after `len` bytes at `at` of `buf` (both there) matches them.
fn digest_ok(buf: &[u8], at: usize, len: usize) -> bool {
    let d = at + len;
    digest::crc32c(&buf[at..d]) == digest::from_wire([buf[d], buf[d + 1], buf[d + 2], buf[d + 3]])
}

/// Appends one PDU in TCP form: header (+ digest), data, padding (+ digest).
fn push_pdu(tx: &mut Vec<u8>, d: Digests, mut bhs: Bhs, data: &[u8]) {
    bhs.data_segment_length = data.len() as u32;
    bhs.total_ahs_length = 0;
    let mut h = [0u8; BHS_LEN];
    bhs.write(&mut h);
    tx.extend_from_slice(&h);
    if d.header {
        tx.extend_from_slice(&digest::to_wire(digest::crc32c(&h)));
    }
    if !data.is_empty() {
        let at = tx.len();
        tx.extend_from_slice(data);
        tx.resize(at + padded_len(data.len()), 0);
        if d.data {
            let crc = digest::crc32c(&tx[at..]);
            tx.extend_from_slice(&digest::to_wire(crc));
        }
    }
}

fn bhs(op: Op) -> Bhs {
    Bhs {
        total_ahs_length: 0,
        data_segment_length: 0,
        op,
    }
}

impl Conn {
    /// Connects and logs in (normal session, AuthMethod=None).
    pub fn login(url: &TargetUrl, opts: &LoginOptions) -> Result<Conn, String> {
        let label = url.to_string();
        let addr = url.socket_addr();
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| format!("{label}: cannot resolve {}: {e}", url.host))?
            .collect();
        let mut last = None;
        let mut sock = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, opts.timeout) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let sock = match sock {
            Some(s) => s,
            None => {
                return Err(match last {
                    Some(e) => io_err(&label, &format!("cannot connect to {addr}"), e),
                    None => format!("{label}: {} resolves to no address", url.host),
                })
            }
        };
        sock.set_nodelay(true)
            .and_then(|_| sock.set_nonblocking(true))
            .map_err(|e| io_err(&label, "socket setup", e))?;
        let mut c = Conn {
            sock,
            label,
            rx: vec![0u8; RX_BUF],
            rx_start: 0,
            rx_end: 0,
            tx: Vec::with_capacity(64 * 1024),
            tx_off: 0,
            max_recv_dsl: LOGIN_MAX_RECV_DSL,
            neg: Negotiated::default(),
            digests: Digests::default(),
            s: SessionState::new(Lun(url.lun_field())),
            block_size: 0,
            num_blocks: 0,
            t: Tasks::new(),
            timeout: opts.timeout,
        };
        c.do_login(url, opts)?;
        Ok(c)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    fn do_login(&mut self, url: &TargetUrl, opts: &LoginOptions) -> Result<(), String> {
        let deadline = self.deadline();
        let neg = KeyNegotiation::new(opts.header_digest, opts.data_digest);
        let params = LoginParams::for_url(url, opts);
        let neg = session::login(self, &params, neg, deadline)?;
        self.neg = neg.result;
        self.digests = Digests {
            header: self.neg.header_digest,
            data: self.neg.data_digest,
        };
        self.max_recv_dsl = neg.proposal().max_recv_dsl;
        Ok(())
    }

    /// Reads what the socket has; Err on EOF or error. Returns bytes read (0: nothing now).
    fn fill(&mut self) -> Result<usize, String> {
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else if self.rx.len() - self.rx_end < 128 * 1024 {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        match (&self.sock).read(&mut self.rx[self.rx_end..]) {
            Ok(0) => Err(format!("{}: the target closed the connection", self.label)),
            Ok(n) => {
                self.rx_end += n;
                Ok(n)
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Ok(0)
            }
            Err(e) => Err(io_err(&self.label, "receive", e)),
        }
    }

    /// The next complete PDU in the receive buffer: its header and the place of its data
    /// segment (valid until the next `fill`).
    fn next_frame(&mut self) -> Result<Option<(Bhs, usize, usize)>, String> {
        let start = self.rx_start;
        let avail = self.rx_end - start;
        if avail < BHS_LEN {
            return Ok(None);
        }
        let mut h = [0u8; BHS_LEN];
        h.copy_from_slice(&self.rx[start..start + BHS_LEN]);
        let ahs = raw_total_ahs_len(&h);
        let hd = if self.digests.header { DIGEST_LEN } else { 0 };
        let header_len = BHS_LEN + ahs + hd;
        if avail < header_len {
            return Ok(None);
        }
        if self.digests.header && !digest_ok(&self.rx, start, BHS_LEN + ahs) {
            return Err(format!(
                "{}: header digest error from the target",
                self.label
            ));
        }
        let dsl = raw_data_segment_len(&h);
        if dsl > self.max_recv_dsl as usize {
            return Err(format!(
                "{}: the target sent a {dsl}-byte data segment, above our MaxRecvDataSegmentLength {}",
                self.label, self.max_recv_dsl
            ));
        }
        let data_len = if dsl == 0 {
            0
        } else {
            padded_len(dsl) + if self.digests.data { DIGEST_LEN } else { 0 }
        };
        if avail < header_len + data_len {
            return Ok(None);
        }
        let ds = start + header_len;
        if dsl > 0 && self.digests.data && !digest_ok(&self.rx, ds, padded_len(dsl)) {
            return Err(format!("{}: data digest error from the target", self.label));
        }
        let bhs = Bhs::parse(&h)
            .map_err(|e| format!("{}: malformed PDU from the target: {e}", self.label))?;
        self.rx_start += header_len + data_len;
        Ok(Some((bhs, ds, dsl)))
    }

    /// Blocks (poll) for the next PDU until `deadline`.
    fn wait_frame(&mut self, deadline: Instant, what: &str) -> Result<(Bhs, usize, usize), String> {
        loop {
            if let Some(f) = self.next_frame()? {
                return Ok(f);
            }
            if self
                .fill()
                .map_err(|e| format!("{e} while waiting for {what}"))?
                > 0
            {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "{}: timed out after {:?} waiting for {what}",
                    self.label, self.timeout
                ));
            }
            wait_fd(self.sock.as_raw_fd(), false, left)?;
        }
    }

    /// Writes what is queued without waiting; true if everything went out.
    pub fn flush(&mut self) -> Result<bool, String> {
        while self.tx_off < self.tx.len() {
            match (&self.sock).write(&self.tx[self.tx_off..]) {
                Ok(0) => return Err(format!("{}: the connection is closed", self.label)),
                Ok(n) => self.tx_off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&self.label, "send", e)),
            }
        }
        self.tx.clear();
        self.tx_off = 0;
        Ok(true)
    }

    fn flush_until(&mut self, deadline: Instant) -> Result<(), String> {
        while !self.flush()? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("{}: timed out sending", self.label));
            }
            wait_fd(self.sock.as_raw_fd(), true, left)?;
        }
        Ok(())
    }

    // ---- management commands (setup / teardown) ------------------------------------

    /// Runs one SCSI command (no data out) and waits for its status.
    pub fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<CmdResult, String> {
        let deadline = self.deadline();
        let (status, sense, _) = session::run_mgmt(self, cdb, read_len, deadline)?;
        Ok(CmdResult {
            status,
            sense,
            data: self.s.take_mgmt_data(),
        })
    }

    fn wait_and_dispatch(&mut self, deadline: Instant, what: &str) -> Result<(), String> {
        let (h, ds, dl) = self.wait_frame(deadline, what)?;
        let mut none = Vec::new();
        self.handle(h, ds, dl, &mut none)?;
        self.flush_until(deadline)
    }

    /// TEST UNIT READY until GOOD (see [`scsi::wait_ready`]).
    pub fn wait_ready(&mut self) -> Result<(), String> {
        scsi::wait_ready(self)
    }

    /// READ CAPACITY (see [`scsi::read_capacity`]): sets `block_size` and `num_blocks`.
    pub fn read_capacity(&mut self) -> Result<(), String> {
        let (bs, n) = scsi::read_capacity(self)?;
        self.block_size = bs;
        self.num_blocks = n;
        Ok(())
    }

    /// Logout (close the session) and close the socket; errors are the caller's to report
    /// or ignore.
    pub fn logout(&mut self) -> Result<(), String> {
        let deadline = self.deadline();
        session::logout(self, deadline, |c| {
            let _ = c.sock.shutdown(Shutdown::Both);
        })
    }

    // ---- the data path ---------------------------------------------------------------

    /// Prepares `qd` task slots with `bs`-byte buffers.
    pub fn start_io(&mut self, qd: usize, bs: usize) {
        self.t.start(qd, bs);
    }

    pub fn fd(&self) -> i32 {
        self.sock.as_raw_fd()
    }

    /// Whether bytes are queued that the socket has not taken yet.
    pub fn wants_write(&self) -> bool {
        self.tx_off < self.tx.len()
    }

    /// I/Os in flight (and `--abort-every`'s ABORT TASKs awaiting their response).
    pub fn inflight(&self) -> usize {
        self.t.busy()
    }

    /// `--abort-every N` (after [`Self::start_io`]; see [`riser_initiator::session::Aborter`]).
    pub fn abort_every(&mut self, n: u32) {
        self.t.abort_every(n);
    }

    /// `--abort-every`: what the target answered, and the first violation.
    pub fn abort_stats(&self) -> Option<(AbortStats, Result<(), String>)> {
        self.t.abort.as_ref().map(|a| (a.stats, a.result()))
    }

    /// A slot's buffer: fill it before submitting a write; holds a read's data after it
    /// completed.
    pub fn buf(&self, slot: usize) -> &[u8] {
        &self.t.slots[slot].buf
    }

    pub fn buf_mut(&mut self, slot: usize) -> &mut [u8] {
        &mut self.t.slots[slot].buf
    }

    /// The LBA of a slot's current (or last) I/O.
    pub fn lba(&self, slot: usize) -> u64 {
        self.t.slots[slot].lba
    }

    /// Queues one I/O of `blocks` blocks at `lba` on an idle slot. It goes out with the next
    /// [`Conn::flush`], or waits for the CmdSN window.
    pub fn submit(&mut self, slot: usize, dir: Dir, lba: u64, blocks: u32) {
        let open = self.s.window_open();
        if self.t.submit(slot, dir, lba, blocks, self.block_size, open) {
            self.send_command(slot);
        }
    }

    fn send_command(&mut self, slot: usize) {
        let neg = self.neg;
        let t = &mut self.t.slots[slot];
        t.state = TaskState::InFlight;
        let write = t.dir == Dir::Write;
        // Unsolicited data: immediate (in the command) and/or Data-Out before any R2T.
        let (unsolicited, immediate) = if write {
            neg.unsolicited(t.len)
        } else {
            (0, 0)
        };
        let cmd = self.s.command(
            Itt(t.itt),
            !write,
            write,
            t.len,
            rw_cdb(t.dir, t.lba, t.blocks),
            unsolicited == immediate,
        );
        let cmd_sn = cmd.cmd_sn;
        push_pdu(
            &mut self.tx,
            self.digests,
            bhs(Op::ScsiCommand(cmd)),
            &t.buf[..immediate as usize],
        );
        if unsolicited > immediate {
            self.send_data_out(slot, Ttt::RESERVED, immediate, unsolicited - immediate);
        }
        if let Some(req) = self.t.abort_after(&mut self.s, slot, cmd_sn, true) {
            push_pdu(&mut self.tx, self.digests, bhs(Op::TaskMgmtRequest(req)), &[]);
        }
    }

    /// Data-Out PDUs for `[offset, offset + len)` of a task, one sequence (DataSN from 0).
    fn send_data_out(&mut self, slot: usize, ttt: Ttt, offset: u32, len: u32) {
        let t = &self.t.slots[slot];
        let (tx, digests) = (&mut self.tx, self.digests);
        let max = self.neg.max_send_dsl;
        session::data_outs(&self.s, Itt(t.itt), ttt, offset, len, max, |d, r| {
            push_pdu(tx, digests, bhs(Op::DataOut(d)), &t.buf[r])
        });
    }

    fn complete(&mut self, o: Outcome, out: &mut Vec<Completion>) {
        let Outcome {
            slot,
            status,
            sense,
            residual,
            ..
        } = o;
        let t = self.t.finish(slot);
        let result = if status != status::GOOD {
            Err(t.status_error(status, sense))
        } else if t.dir == Dir::Read && (t.received != t.len || residual) {
            Err(IoError {
                status,
                sense: None,
                what: format!(
                    "READ of {} blocks at LBA {}: {} of {} bytes transferred",
                    t.blocks, t.lba, t.received, t.len
                ),
            })
        } else {
            Ok(())
        };
        out.push(Completion {
            slot,
            result,
            aborted: false,
        });
    }

    /// Receives and handles whatever PDUs have arrived; completions are appended to `out`.
    /// Returns whether anything was received. Commands waiting for the CmdSN window are
    /// queued for sending as it opens.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<bool, String> {
        let n = self.fill()?;
        if n == 0 && self.rx_end - self.rx_start < BHS_LEN {
            return Ok(false);
        }
        while let Some((h, ds, dl)) = self.next_frame()? {
            self.handle(h, ds, dl, out)?;
        }
        let ping = self.t.release_aborted(&mut self.s, true, out);
        if let Some(nop) = ping {
            push_pdu(&mut self.tx, self.digests, bhs(Op::NopOut(nop)), &[]);
        }
        while let Some(slot) = self.t.unblock(self.s.window_open()) {
            self.send_command(slot);
        }
        Ok(true)
    }

    fn handle(
        &mut self,
        h: Bhs,
        ds: usize,
        dl: usize,
        out: &mut Vec<Completion>,
    ) -> Result<(), String> {
        if self.t.stale(&mut self.s, &h.op) {
            return Ok(());
        }
        match &h.op {
            Op::TaskMgmtResponse(r) => self.t.tmf_response(r),
            Op::NopIn(n) => self.t.nop_in(n.itt),
            _ => {}
        }
        match h.op {
            Op::DataIn(d) => {
                let data = &self.rx[ds..ds + dl];
                if let Some(o) = self.t.data_in(&mut self.s, &self.label, &d, data)? {
                    self.complete(o, out);
                }
            }
            Op::R2t(r) => {
                let slot = self.t.r2t(&mut self.s, &self.label, &r)?;
                self.send_data_out(slot, r.ttt, r.buffer_offset, r.desired_data_transfer_length);
            }
            op => {
                let data = &self.rx[ds..ds + dl];
                let (tasks, label) = (&self.t, self.label.as_str());
                match self
                    .s
                    .receive(label, &op, data, |itt| tasks.slot_of(label, itt))?
                {
                    Received::Ping(reply) => {
                        push_pdu(&mut self.tx, self.digests, bhs(Op::NopOut(reply)), data)
                    }
                    Received::Complete(o) => self.complete(o, out),
                    // Done (Reject, LogoutRequested and Dropping are errors from receive()).
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

impl Transport for Conn {
    fn state(&mut self) -> &mut SessionState {
        &mut self.s
    }

    fn send_control(&mut self, op: Op, data: &[u8], deadline: Instant) -> Result<(), String> {
        // Login PDUs go out without digests: they are off until login ends.
        push_pdu(&mut self.tx, self.digests, bhs(op), data);
        self.flush_until(deadline)
    }

    fn recv_login(&mut self, deadline: Instant, text: &mut Vec<u8>) -> Result<Bhs, String> {
        let (h, ds, dl) = self.wait_frame(deadline, "a Login Response")?;
        text.extend_from_slice(&self.rx[ds..ds + dl]);
        Ok(h)
    }

    fn progress(&mut self, deadline: Instant, what: &str) -> Result<(), String> {
        self.wait_and_dispatch(deadline, what)
    }
}

impl ScsiExec for Conn {
    fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<CmdResult, String> {
        Conn::exec(self, cdb, read_len)
    }
    fn label(&self) -> &str {
        &self.label
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole data path against a strict fake target with the settings riser and tgt
    /// never choose: unsolicited Data-Out (InitialR2T=No, ImmediateData=No), R2Ts, 1 KiB
    /// Data-Out / odd-sized Data-In segments, status in the last Data-In or separately, a
    /// 2-command CmdSN window under a queue depth of 8, a unit attention at start.
    #[test]
    fn full_session_against_a_strict_fake_target() {
        use crate::fake_target as ft;
        use riser_initiator::session::INITIATOR_NAME;
        use crate::verify;
        let (port, obs, h) = ft::start();
        let url = riser_initiator::url::parse(&format!("iscsi://127.0.0.1:{port}/iqn.2024-01.test:fake/0"))
            .unwrap();
        let opts = LoginOptions {
            initiator_name: INITIATOR_NAME.into(),
            header_digest: false,
            data_digest: false,
            timeout: Duration::from_secs(10),
            isid: [0x80, 0, 0, 0, 0, 1],
            chap: None,
        };
        let mut c = Conn::login(&url, &opts).unwrap();
        assert_eq!(
            c.neg,
            Negotiated {
                header_digest: false,
                data_digest: false,
                max_send_dsl: ft::TARGET_MRDSL as u32,
                immediate_data: false,
                initial_r2t: false,
                first_burst: ft::FIRST_BURST as u32,
                max_burst: ft::MAX_BURST as u32,
            }
        );
        c.wait_ready().unwrap();
        c.read_capacity().unwrap();
        assert_eq!((c.num_blocks, c.block_size), (ft::BLOCKS, ft::BLOCK as u32));
        let (qd, io_blocks) = (8usize, 16u64);
        c.start_io(qd, io_blocks as usize * ft::BLOCK);
        let bsz = ft::BLOCK;
        let mut out = Vec::new();
        let mut m = verify::Mismatches::default();
        for dir in [Dir::Write, Dir::Read] {
            let mut next = 0u64;
            let issue = |c: &mut Conn, slot: usize, next: &mut u64| {
                if *next >= ft::BLOCKS {
                    return;
                }
                let n = (ft::BLOCKS - *next).min(io_blocks) as u32;
                if dir == Dir::Write {
                    verify::fill(&mut c.buf_mut(slot)[..n as usize * bsz], bsz, *next, 5);
                }
                c.submit(slot, dir, *next, n);
                *next += n as u64;
            };
            for slot in 0..qd {
                issue(&mut c, slot, &mut next);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.inflight() > 0 {
                assert!(Instant::now() < deadline, "I/Os did not complete");
                c.flush().unwrap();
                c.poll(&mut out).unwrap();
                for done in out.drain(..) {
                    done.result.unwrap();
                    if dir == Dir::Read {
                        let lba = c.lba(done.slot);
                        let n = (ft::BLOCKS - lba).min(io_blocks) as usize;
                        m.check(&c.buf(done.slot)[..n * bsz], bsz, lba, 5);
                    }
                    issue(&mut c, done.slot, &mut next);
                }
            }
        }
        assert_eq!(m.blocks, 0, "{:?}", m.runs);
        c.logout().unwrap();
        h.join().unwrap();
        let o = obs.lock().unwrap();
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        assert!(o.answered_offer && o.logged_out);
        // 63 writes: the first 2 KiB unsolicited in two 1 KiB PDUs, the rest by R2T.
        let writes = ft::BLOCKS.div_ceil(io_blocks) as usize;
        assert_eq!(o.unsolicited_data_outs, 2 * writes);
        assert!(o.r2ts >= writes, "{} R2Ts", o.r2ts);
        // 2 TUR (unit attention, then GOOD) + READ CAPACITY + writes + reads.
        assert_eq!(o.commands, 3 + 2 * writes);
    }
}
