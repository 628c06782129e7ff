//! [`ScsiDevice`] and [`DeviceChannel`] over malloc LUNs: LUN numbers, REPORT LUNS,
//! LUNs that do not exist, routing, LUN map changes and task management.

use std::sync::Arc;

use riser_bdev::IoBuf;

use super::*;
use crate::lun::LunConfig;
use crate::task::DataOut;
use crate::tests::{malloc_lun, pattern, rw10, BS};

const TUR: [u8; 6] = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];

fn lun(id: u64) -> Arc<Lun> {
    malloc_lun(
        LunConfig {
            id,
            ..LunConfig::default()
        },
        64,
    )
}

fn nexus(n: u64) -> Arc<Nexus> {
    Arc::new(Nexus::new(
        &format!("iqn.2024-01.test:init{n}"),
        n,
        "iqn.2024-01.test:tgt",
        1,
    ))
}

fn device(luns: &[&Arc<Lun>]) -> Arc<ScsiDevice> {
    Arc::new(ScsiDevice::new(luns.iter().map(|l| (*l).clone()).collect()))
}

fn report_luns_cdb(select: u8, alloc: u32) -> Vec<u8> {
    let mut c = vec![0u8; 12];
    c[0] = op::REPORT_LUNS;
    c[2] = select;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// A device channel and the results it returned that were not asked for yet.
struct H {
    dc: DeviceChannel,
    got: Vec<TaskEvent>,
}

impl H {
    fn new(dev: Arc<ScsiDevice>) -> H {
        H {
            dc: DeviceChannel::new(dev),
            got: Vec::new(),
        }
    }

    /// Submits without waiting.
    fn submit(
        &mut self,
        tag: u64,
        lun: u64,
        n: &Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
    ) {
        let mut t = ScsiTask::new(tag, lun, cdb, edtl, n);
        t.write = data.is_some();
        t.data_out = data.map_or(DataOut::None, |d| DataOut::Whole(IoBuf::from(d)));
        self.dc.submit(t);
    }

    /// Polls until `tag` is reported.
    fn wait(&mut self, tag: u64) -> ScsiResult {
        match self.wait_event(tag) {
            TaskEvent::Done(r) => r,
            other => panic!("expected the task's result, got {other:?}"),
        }
    }

    /// Polls until `tag` ends; returns its last event.
    fn wait_event(&mut self, tag: u64) -> TaskEvent {
        for _ in 0..1_000_000 {
            if let Some(p) = self.got.iter().position(|r| r.tag() == tag && r.ends_task()) {
                return self.got.remove(p);
            }
            self.dc.poll(&mut self.got);
        }
        panic!("task {tag} never completed");
    }

    fn run(
        &mut self,
        lun: u64,
        n: &Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
    ) -> ScsiResult {
        self.submit(7, lun, n, cdb, edtl, data);
        self.wait(7)
    }

    /// Consumes the POWER ON unit attention of `n` on LUN `lun`.
    fn power_on(&mut self, lun: u64, n: &Arc<Nexus>) {
        assert_eq!(
            self.run(lun, n, &TUR, 0, None).sense_triplet(),
            Some((6, 0x29, 0))
        );
        assert_eq!(self.run(lun, n, &TUR, 0, None).status, Status::Good);
    }

    /// Runs TEST UNIT READY until it passes (unit attentions consumed).
    fn drain_ua(&mut self, lun: u64, n: &Arc<Nexus>) {
        for _ in 0..8 {
            if self.run(lun, n, &TUR, 0, None).status == Status::Good {
                return;
            }
        }
        panic!("unit attentions never end");
    }
}

fn lun_list(d: &[u8]) -> Vec<[u8; 8]> {
    let n = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    d[8..8 + n]
        .chunks(8)
        .map(|c| c.try_into().unwrap())
        .collect()
}

#[test]
fn lun_encoding() {
    assert_eq!(LunId::new(0).to_field(), [0; 8]);
    assert_eq!(LunId::new(5).to_field(), [0, 5, 0, 0, 0, 0, 0, 0]);
    assert_eq!(LunId::new(300).to_field(), [0x41, 0x2C, 0, 0, 0, 0, 0, 0]);
    for l in [0u64, 1, 255, 256, 1000, 16383] {
        assert_eq!(LunId::from_field(LunId::new(l).to_field()), LunId::new(l));
    }
    // Flat space addressing of a number below 256 decodes too; other address methods
    // address no LUN.
    assert_eq!(
        LunId::from_field([0x40, 5, 0, 0, 0, 0, 0, 0]),
        LunId::new(5)
    );
    assert_eq!(
        LunId::from_field([0x80, 5, 0, 0, 0, 0, 0, 0]),
        LunId::UNSUPPORTED
    );
    assert_eq!(
        LunId::from_field([0xC0, 0, 0, 0, 0, 0, 0, 0]),
        LunId::UNSUPPORTED
    );
    assert_eq!(LunId::from(7u16).get(), 7);
    assert_eq!(u64::from(LunId::new(9)), 9);
}

#[test]
fn device_map_lookup_and_ids() {
    let (l0, l2, l5) = (lun(0), lun(2), lun(5));
    let twin = lun(2);
    let dev = ScsiDevice::new(vec![l5.clone(), l2.clone(), l0.clone(), twin]);
    assert_eq!(dev.len(), 3);
    assert!(!dev.is_empty());
    assert!(ScsiDevice::default().is_empty());
    assert_eq!(
        dev.ids().collect::<Vec<_>>(),
        vec![LunId::new(0), LunId::new(2), LunId::new(5)]
    );
    // The first LUN listed under a number is the one addressed.
    assert!(Arc::ptr_eq(dev.lun(LunId::new(2)).unwrap(), &l2));
    assert!(Arc::ptr_eq(dev.lun(LunId::new(5)).unwrap(), &l5));
    assert!(dev.lun(LunId::new(1)).is_none());
    assert!(dev.lun(LunId::UNSUPPORTED).is_none());
}

#[test]
fn report_luns_lists_the_device() {
    let (l0, l2, l5) = (lun(0), lun(2), lun(5));
    let mut h = H::new(device(&[&l5, &l0, &l2]));
    let a = nexus(1);
    // From any LUN number, existing or not; no unit attention holds it up.
    for at in [0, 2, 9] {
        let r = h.run(at, &a, &report_luns_cdb(0, 64), 64, None);
        assert_eq!(r.status, Status::Good);
        assert_eq!(
            lun_list(r.data()),
            vec![
                LunId::new(0).to_field(),
                LunId::new(2).to_field(),
                LunId::new(5).to_field()
            ]
        );
        assert_eq!(r.residual, Residual::Underflow(64 - 32));
    }
    // SELECT REPORT 2 lists the same, 1 (well-known LUNs) nothing, 3 is refused.
    let r = h.run(0, &a, &report_luns_cdb(2, 64), 64, None);
    assert_eq!(lun_list(r.data()).len(), 3);
    let r = h.run(0, &a, &report_luns_cdb(1, 64), 64, None);
    assert_eq!(r.data(), &[0u8; 8]);
    let r = h.run(0, &a, &report_luns_cdb(3, 64), 64, None);
    assert_eq!(r.sense_triplet(), Some((5, 0x24, 0)));
    // Allocation length and EDTL cut the data.
    let r = h.run(0, &a, &report_luns_cdb(0, 16), 16, None);
    assert_eq!(r.data().len(), 16);
    let r = h.run(0, &a, &report_luns_cdb(0, 64), 12, None);
    assert_eq!(r.data().len(), 12);
    assert_eq!(r.residual, Residual::Overflow(32 - 12));
    // The device is answering, not the LUNs: no channel was opened for it.
    assert_eq!(h.dc.channels.len(), 0);
    // A LUN channel on its own refuses it.
    let mut ch = LunChannel::new(l0.clone());
    ch.submit(ScsiTask::new(1, 0, &report_luns_cdb(0, 64), 64, &a));
    let mut out = Vec::new();
    while out.is_empty() {
        ch.poll(&mut out);
    }
    let TaskEvent::Done(r) = &out[0] else { panic!("expected a result") };
    assert_eq!(r.sense_triplet(), Some((5, 0x20, 0)));
}

#[test]
fn report_luns_clears_the_change_notice_on_the_addressed_lun() {
    let (l0, l1) = (lun(0), lun(1));
    let dev = device(&[&l0]);
    dev.announce_luns();
    let mut h = H::new(dev);
    let a = nexus(1);
    h.power_on(0, &a);
    // LUN 1 comes in: LUN 0 tells its initiators, LUN 1 (new) has nothing to tell.
    let dev = device(&[&l0, &l1]);
    dev.announce_luns();
    h.dc.set_device(dev);
    assert_eq!(l0.pending_ua(&a), vec![Asc::REPORTED_LUNS_DATA_HAS_CHANGED]);
    assert_eq!(l1.target_luns(), vec![0, 1]);
    // REPORT LUNS to another LUN clears nothing on LUN 0; to LUN 0 it does.
    h.run(1, &a, &report_luns_cdb(0, 64), 64, None);
    assert_eq!(l0.pending_ua(&a), vec![Asc::REPORTED_LUNS_DATA_HAS_CHANGED]);
    h.run(0, &a, &report_luns_cdb(0, 64), 64, None);
    assert_eq!(l0.pending_ua(&a), vec![]);
    assert_eq!(h.run(0, &a, &TUR, 0, None).status, Status::Good);
    // The same map announced again changes nothing.
    h.dc.device().announce_luns();
    assert_eq!(l0.pending_ua(&a), vec![]);
}

#[test]
fn missing_lun_answers() {
    let l0 = lun(0);
    let mut h = H::new(device(&[&l0]));
    let a = nexus(1);
    // Standard INQUIRY: peripheral qualifier 011b, device type 1Fh.
    let r = h.run(4, &a, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data().len(), 36);
    assert_eq!(r.data()[0], 0x7F);
    // VPD page 0 lists page 0 only; other pages and a page code without EVPD are refused.
    let r = h.run(4, &a, &[op::INQUIRY, 1, 0, 0, 255, 0], 255, None);
    assert_eq!(r.data(), &[0x7F, 0, 0, 1, 0]);
    let r = h.run(4, &a, &[op::INQUIRY, 1, 0x80, 0, 255, 0], 255, None);
    assert_eq!(r.sense_triplet(), Some((5, 0x24, 0)));
    let r = h.run(4, &a, &[op::INQUIRY, 0, 0x80, 0, 255, 0], 255, None);
    assert_eq!(r.sense_triplet(), Some((5, 0x24, 0)));
    // REQUEST SENSE returns LOGICAL UNIT NOT SUPPORTED as data, in either format.
    let r = h.run(4, &a, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None);
    assert_eq!(r.status, Status::Good);
    assert_eq!((r.data()[0], r.data()[2], r.data()[12]), (0x70, 5, 0x25));
    let r = h.run(4, &a, &[op::REQUEST_SENSE, 1, 0, 0, 18, 0], 18, None);
    assert_eq!((r.data()[0], r.data()[1], r.data()[2]), (0x72, 5, 0x25));
    // Anything else: CHECK CONDITION, LOGICAL UNIT NOT SUPPORTED; also for a LUN field
    // with an address method riser does not use.
    let r = h.run(4, &a, &TUR, 0, None);
    assert_eq!(r.sense_triplet(), Some((5, 0x25, 0)));
    let r = h.run(
        LunId::UNSUPPORTED.get(),
        &a,
        &rw10(op::READ10, 0, 1, 0),
        BS as u32,
        None,
    );
    assert_eq!(r.sense_triplet(), Some((5, 0x25, 0)));
    assert_eq!(r.residual, Residual::Underflow(BS as u32));
    // None of this touched the existing LUN: its POWER ON is still there.
    assert_eq!(h.dc.channels.len(), 0);
    assert_eq!(l0.pending_ua(&a), vec![]);
    h.power_on(0, &a);
}

#[test]
fn tasks_go_to_their_lun() {
    let (l0, l1) = (lun(0), lun(1));
    let mut h = H::new(device(&[&l0, &l1]));
    let a = nexus(1);
    h.power_on(0, &a);
    h.power_on(1, &a);
    assert_eq!(h.dc.channels.len(), 2);
    let p = pattern(BS, 3);
    let r = h.run(
        1,
        &a,
        &rw10(op::WRITE10, 2, 1, 0),
        BS as u32,
        Some(p.clone()),
    );
    assert_eq!(r.status, Status::Good);
    let r = h.run(1, &a, &rw10(op::READ10, 2, 1, 0), BS as u32, None);
    assert_eq!(r.data(), &p[..]);
    let r = h.run(0, &a, &rw10(op::READ10, 2, 1, 0), BS as u32, None);
    assert_eq!(r.data(), &vec![0u8; BS][..]);
    // Several tasks in flight on both LUNs come back from one channel each.
    h.submit(10, 0, &a, &rw10(op::READ10, 2, 1, 0), BS as u32, None);
    h.submit(11, 1, &a, &rw10(op::READ10, 2, 1, 0), BS as u32, None);
    h.submit(12, 3, &a, &TUR, 0, None);
    assert_eq!(h.dc.outstanding(), 3);
    assert!(h.dc.busy());
    assert_eq!(h.wait(11).data(), &p[..]);
    assert_eq!(h.wait(10).data(), &vec![0u8; BS][..]);
    assert_eq!(h.wait(12).sense_triplet(), Some((5, 0x25, 0)));
    assert_eq!(h.dc.outstanding(), 0);
    assert!(!h.dc.busy());
}

#[test]
fn set_device_keeps_the_channels_of_luns_that_stay() {
    let (l0, l1, l2) = (lun(0), lun(1), lun(2));
    let mut h = H::new(device(&[&l0, &l1]));
    let a = nexus(1);
    h.power_on(0, &a);
    h.power_on(1, &a);
    let p = pattern(BS, 9);
    h.run(
        1,
        &a,
        &rw10(op::WRITE10, 0, 1, 0),
        BS as u32,
        Some(p.clone()),
    );
    // A task in flight on LUN 0 and one on LUN 1 while LUN 2 comes in and LUN 1 goes.
    h.submit(20, 0, &a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    h.submit(21, 1, &a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    h.dc.set_device(device(&[&l0, &l2]));
    assert_eq!(h.dc.channels.len(), 1);
    assert_eq!(h.dc.retired.len(), 1);
    // Both complete: the kept channel and the retired one are still polled.
    assert_eq!(h.wait(20).status, Status::Good);
    assert_eq!(h.wait(21).data(), &p[..]);
    assert!(h.dc.retired.is_empty());
    assert!(!h.dc.busy());
    // LUN 0 goes on as before.
    assert_eq!(h.run(0, &a, &TUR, 0, None).status, Status::Good);
    // LUN 1 is gone, LUN 2 is there.
    assert_eq!(
        h.run(1, &a, &TUR, 0, None).sense_triplet(),
        Some((5, 0x25, 0))
    );
    h.power_on(2, &a);
    // Another LUN under number 1: a new channel, to the new LUN.
    let l1b = lun(1);
    h.dc.set_device(device(&[&l0, &l1b, &l2]));
    h.power_on(1, &a);
    let r = h.run(1, &a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    assert_eq!(r.data(), &vec![0u8; BS][..]);
    assert!(Arc::ptr_eq(
        h.dc.channel(LunId::new(1)).unwrap().lun(),
        &l1b
    ));
    assert_eq!(h.dc.device().len(), 3);
}

#[test]
fn a_streamed_write_into_a_lun_that_leaves_gets_its_data_and_completes() {
    let (l0, l1) = (lun(0), lun(1));
    let mut h = H::new(device(&[&l0, &l1]));
    let chunk = 4 * BS;
    h.dc.set_stream_chunk(Some(chunk));
    let a = nexus(1);
    h.power_on(1, &a);
    let data = pattern(12 * BS, 5);
    let mut t = ScsiTask::new(30, 1, &rw10(op::WRITE10, 8, 12, 0), data.len() as u32, &a);
    t.write = true;
    t.data_out = DataOut::Streamed;
    h.dc.submit(t);
    // LUN 1 leaves while the write waits for its first piece: no work, yet not forgotten.
    let mut wants = Vec::new();
    h.dc.poll(&mut wants);
    h.dc.set_device(device(&[&l0]));
    assert_eq!((h.dc.channels.len(), h.dc.retired.len()), (0, 1));
    assert!(!h.dc.busy(), "waiting for the initiator's data keeps no reactor busy");
    assert_eq!(l1.open_channels(), 1);
    // Each piece asked for goes to the retired channel, which then finishes the write.
    let mut done = None;
    for _ in 0..1000 {
        for ev in std::mem::take(&mut wants) {
            match ev {
                TaskEvent::Want(w) => {
                    let (o, n) = (w.offset as usize, w.len as usize);
                    h.dc.write_data(LunId::new(1), 30, w.offset, IoBuf::from(data[o..o + n].to_vec()));
                }
                TaskEvent::Done(r) => done = Some(r),
                _ => {}
            }
        }
        if done.is_some() {
            break;
        }
        h.dc.poll(&mut wants);
    }
    let r = done.expect("the streamed write never completed");
    assert_eq!(r.status, Status::Good, "{r:?}");
    assert!(h.dc.retired.is_empty());
    assert_eq!(l1.open_channels(), 0, "no channel of the removed LUN is left");
    // The data is on LUN 1's device; LUN 1 no longer answers here.
    let mut back = LunChannel::new(l1.clone());
    let mut t = ScsiTask::new(31, 1, &rw10(op::READ10, 8, 12, 0), data.len() as u32, &a);
    t.write = false;
    back.submit(t);
    let mut out = Vec::new();
    while !out.iter().any(|e: &TaskEvent| e.ends_task()) {
        back.poll(&mut out);
    }
    assert!(matches!(out.last(), Some(TaskEvent::Done(r)) if r.data() == &data[..]));
    assert_eq!(h.run(1, &a, &TUR, 0, None).sense_triplet(), Some((5, 0x25, 0)));
}

#[test]
fn task_management() {
    let (l0, l1) = (lun(0), lun(1));
    let mut h = H::new(device(&[&l0, &l1]));
    let (a, b) = (nexus(1), nexus(2));
    for n in [&a, &b] {
        h.power_on(0, n);
        h.power_on(1, n);
    }
    // ABORT TASK finds the task on its LUN only.
    h.submit(30, 1, &a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    assert!(!h.dc.abort_task(&a, LunId::new(0), 30));
    assert!(!h.dc.abort_task(&b, LunId::new(1), 30));
    assert!(h.dc.abort_task(&a, LunId::new(1), 30));
    assert!(h.wait_event(30).is_aborted());
    // LOGICAL UNIT RESET: that LUN only.
    h.submit(31, 0, &a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    h.submit(32, 1, &a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    h.dc.reset_lun(LunId::new(1), ResetKind::LunReset);
    assert!(!h.wait_event(31).is_aborted());
    assert!(h.wait_event(32).is_aborted());
    assert_eq!(l0.pending_ua(&b), vec![]);
    assert_eq!(
        l1.pending_ua(&b),
        vec![Asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED]
    );
    h.dc.reset_lun(LunId::new(6), ResetKind::LunReset);
    // Target reset: every LUN, every task.
    h.submit(33, 0, &a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    h.dc.reset_target(ResetKind::TargetWarmReset);
    assert!(h.wait_event(33).is_aborted());
    assert_eq!(
        l0.pending_ua(&a),
        vec![Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET]
    );
    assert!(l1
        .pending_ua(&b)
        .contains(&Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET));
    for n in [&a, &b] {
        assert_eq!(
            h.run(0, n, &TUR, 0, None).sense_triplet(),
            Some((6, 0x29, 0))
        );
        h.drain_ua(1, n);
    }
    // The connection of `a` ends: its tasks go, and so does what it held (an SPC-2
    // reservation).
    assert_eq!(
        h.run(0, &a, &[op::RESERVE6, 0, 0, 0, 0, 0], 0, None).status,
        Status::Good
    );
    let w = rw10(op::WRITE10, 0, 1, 0);
    let r = h.run(0, &b, &w, BS as u32, Some(vec![0; BS]));
    assert_eq!(r.status, Status::ReservationConflict);
    h.submit(34, 1, &a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    h.dc.teardown(&a);
    assert!(h.wait_event(34).is_aborted());
    let r = h.run(0, &b, &w, BS as u32, Some(vec![0; BS]));
    assert_eq!(r.status, Status::Good);
    assert!(!h.dc.busy());
}
