//! A logged-in TCP connection of a target without CHAP, where an unauthenticated peer
//! ends up: the real TCP datamover (`TcpDatamover` over an in-memory stream) feeding the
//! full-feature phase (`Ffp`), whose commands run on a `DeviceChannel` over a malloc LUN,
//! wired as riser's server wires them (lib/server/src/conn.rs).
//!
//! Input: `m0`, `m1`, then the byte stream the initiator sends after login.
//! - `m0` bit 0: header digest, bit 1: data digest, bits 2-3: the initiator's
//!   MaxRecvDataSegmentLength, bits 4-5: the target's, bits 6-7: MaxBurstLength.
//! - `m1` bits 0-1: MaxOutstandingR2T - 1, bits 2-3: the queue depth, bit 4: ImmediateData,
//!   bit 5: InitialR2T, bit 6: a discovery session, bit 7: write the right digests into
//!   the stream first ([`crate::fix_digests`]).
//! The stream goes in chunks of up to 1024 bytes; between chunks the connection is polled
//! and the clock moves on a second.
//!
//! Checks: everything the target sends is a well-formed PDU stream for the initiator: whole
//! PDUs with right digests, no data segment beyond the initiator's
//! MaxRecvDataSegmentLength; no panic anywhere on the way.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use riser_datamover::mem::{stream_pair, MemStream};
use riser_datamover::tcp::ByteStream;
use riser_datamover::TcpDatamover;
use riser_iscsi::ffp::{
    lun_id, Action, Datamover, DatamoverParams, DmEvent, Ffp, FfpConfig, TextResponder, LARGEST_WRITE,
};
use riser_iscsi::pdu::MAX_AHS_LENGTH;
use riser_iscsi::{Digests, Framer, FramerLimits, Pairs, Sn};
use riser_scsi::{DeviceChannel, Nexus, ResetKind, ScsiDevice, TaskEvent};
use std::io::Read;

const MRDSL: [u32; 4] = [8192, 512, 65_536, 262_144];
const BURST: [u32; 4] = [262_144, 4096, 65_536, 1 << 20];
const QUEUE: [u32; 4] = [64, 1, 4, 128];
/// Poll passes after the last byte for the connection to settle.
const SETTLE_PASSES: usize = 2_000;

struct SendTargets;

impl TextResponder for SendTargets {
    fn respond(&mut self, request: &Pairs) -> Pairs {
        let mut out = Pairs::new();
        for _ in request {
            out.push(("TargetName".into(), "iqn.2016-06.io.riser:fuzz".into()));
            out.push(("TargetAddress".into(), "192.0.2.1:3260,1".into()));
        }
        out
    }
}

struct Conn {
    dm: TcpDatamover<MemStream>,
    ffp: Ffp,
    scsi: DeviceChannel,
    nexus: Arc<Nexus>,
    events: Vec<DmEvent>,
    results: Vec<TaskEvent>,
    closed: bool,
}

impl Conn {
    /// One pass of the server's connection poller.
    fn poll(&mut self, now: Instant) -> usize {
        let mut work = self.dm.poll(&mut self.events);
        for ev in std::mem::take(&mut self.events) {
            work += 1;
            match ev {
                DmEvent::Control(pdu) => self.ffp.on_pdu(pdu, now),
                DmEvent::Command { pdu, buf } => self.ffp.on_command_placed(pdu, buf, now),
                DmEvent::DataReady { itt, buf } => self.ffp.on_data_ready(itt, buf),
                DmEvent::DataFailed { itt, reason, .. } => self.ffp.on_data_failed(itt, reason),
                DmEvent::Reject { header, reason } => self.ffp.reject_raw(&header, reason),
                DmEvent::Terminated(_) => self.closed = true,
            }
        }
        self.ffp.release_held();
        self.scsi.poll(&mut self.results);
        if self.scsi.busy() {
            work += 1;
        }
        for ev in std::mem::take(&mut self.results) {
            work += 1;
            self.ffp.on_scsi(ev);
        }
        while let Some(a) = self.ffp.poll_action() {
            work += 1;
            match a {
                Action::Send(p) => self.dm.send_control(p),
                Action::PutData(p) => self.dm.put_data(p),
                Action::GetData(g) => self.dm.get_data(g),
                Action::Execute(req) => self.scsi.submit(req.into_task(&self.nexus)),
                Action::WriteData { itt, lun, offset, buf } => {
                    self.scsi.write_data(lun_id(lun), u64::from(itt.0), offset, buf)
                }
                Action::Abort { itt, lun } => {
                    self.scsi.abort_task(&self.nexus, lun_id(lun), u64::from(itt.0));
                    let _ = self.dm.deallocate_task_resources(itt);
                }
                Action::ResetLun(lun) => {
                    self.scsi.reset_lun(lun_id(lun), ResetKind::LunReset);
                }
                Action::ResetTarget => {
                    self.scsi.reset_target(ResetKind::TargetWarmReset);
                }
                Action::Close { .. } => {
                    self.dm.connection_terminate();
                    self.closed = true;
                }
            }
        }
        work
    }
}

pub fn run(data: &[u8]) {
    let mut data = data;
    let m0 = crate::take_u8(&mut data);
    let m1 = crate::take_u8(&mut data);
    let digests = Digests {
        header: m0 & 1 != 0,
        data: m0 & 2 != 0,
    };
    let initiator_mrdsl = MRDSL[usize::from((m0 >> 2) & 3)];
    let target_mrdsl = MRDSL[usize::from((m0 >> 4) & 3)];
    let max_burst = BURST[usize::from(m0 >> 6)];
    let first_burst = max_burst.min(65_536);
    let params = DatamoverParams {
        initiator_max_recv_data_segment_length: initiator_mrdsl,
        target_max_recv_data_segment_length: target_mrdsl,
        max_burst_length: max_burst,
        first_burst_length: first_burst,
        max_outstanding_r2t: u32::from(m1 & 3) + 1,
        header_digest: digests.header,
        data_digest: digests.data,
        ..DatamoverParams::default()
    };
    let cfg = FfpConfig {
        queue_depth: QUEUE[usize::from((m1 >> 2) & 3)],
        immediate_data: m1 & 0x10 != 0,
        initial_r2t: m1 & 0x20 != 0,
        first_burst_length: first_burst,
        max_burst_length: max_burst,
        initiator_mrdsl,
        target_mrdsl,
        discovery: m1 & 0x40 != 0,
        largest_write: LARGEST_WRITE,
        ..FfpConfig::default()
    };
    let mut stream = data.to_vec();
    if m1 & 0x80 != 0 {
        crate::fix_digests(&mut stream, digests);
    }

    let a: SocketAddr = ([192, 0, 2, 7], 40_000).into();
    let b: SocketAddr = ([192, 0, 2, 1], 3260).into();
    let (target_end, mut initiator) = stream_pair(a, b);
    initiator.set_nonblocking().expect("in-memory stream");
    let mut dm = TcpDatamover::new(target_end, &[]).expect("in-memory stream");
    dm.notice_key_values(params);
    let start = Instant::now();
    let mut ffp = Ffp::new(cfg, Sn(1), Sn(0x100), start);
    ffp.set_responder(Box::new(SendTargets));
    // Immediate data of writes partly immediate goes straight into write buffers.
    dm.set_write_buffers(ffp.write_buffers());
    let lun = crate::scsi::lun(0, 256, 512, riser_scsi::LunConfig::default());
    let mut conn = Conn {
        dm,
        ffp,
        scsi: DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun]))),
        nexus: Arc::new(Nexus::new("iqn.1994-05.com.redhat:a", 0x23d0_0000_0001, "iqn.2016-06.io.riser:fuzz", 1)),
        events: Vec::new(),
        results: Vec::new(),
        closed: false,
    };
    let mut out = Framer::with_limits(FramerLimits {
        max_recv_data_segment_length: initiator_mrdsl as usize,
        max_ahs_length: MAX_AHS_LENGTH,
    });
    out.set_digests(digests);

    let mut now = start;
    let mut rest = &stream[..];
    let mut rx = vec![0u8; 64 * 1024];
    let mut passes = 0usize;
    loop {
        if !rest.is_empty() && !conn.closed {
            let (chunk, tail) = rest.split_at(rest.len().min(1024));
            rest = tail;
            let _ = std::io::Write::write_all(&mut initiator, chunk);
            now += Duration::from_secs(1);
            conn.ffp.on_timer(now);
        } else {
            passes += 1;
        }
        let work = conn.poll(now);
        // What the target sent: whole, valid PDUs for this initiator.
        loop {
            match initiator.read(&mut rx) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.feed(rx.get(..n).unwrap_or_default()),
            }
        }
        while let Some(pdu) = out
            .next_pdu()
            .unwrap_or_else(|e| panic!("the target sent a PDU its initiator cannot take: {e}"))
        {
            assert!(pdu.data.len() <= initiator_mrdsl as usize);
        }
        let quiet = work == 0 && !conn.scsi.busy();
        if (rest.is_empty() || conn.closed) && (quiet || passes >= SETTLE_PASSES) {
            break;
        }
    }
    conn.scsi.teardown(&conn.nexus);
}
