//! A LUN channel keeps its reactor awake only for work it must poll for: device I/O in flight
//! on a device that signals its own completions (RBD's eventfd) is not such work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use riser_bdev::{Bdev, BdevInfo, BdevIo, IoChannel, IoCompletion, IoKind, MallocBdev};

use super::*;
use crate::device::{DeviceChannel, ScsiDevice};
use crate::lun::{Lun, LunConfig};

const BLOCKS: u64 = 64;

/// A malloc device whose I/O stays in flight until the gate opens; `signals`: whether its
/// completions wake the reactor by themselves.
struct Gated {
    info: BdevInfo,
    inner: Arc<MallocBdev>,
    open: Arc<AtomicBool>,
    signals: bool,
}

struct GatedChannel {
    inner: Box<dyn IoChannel>,
    open: Arc<AtomicBool>,
    held: Vec<BdevIo>,
    signals: bool,
}

impl Bdev for Gated {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn supports(&self, kind: IoKind) -> bool {
        self.inner.supports(kind)
    }
    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        Box::new(GatedChannel { inner: self.inner.clone().open_channel(), open: self.open.clone(), held: Vec::new(), signals: self.signals })
    }
    fn config_json(&self) -> (&'static str, serde_json::Value) {
        self.inner.config_json()
    }
}

impl IoChannel for GatedChannel {
    fn submit(&mut self, io: BdevIo) {
        self.held.push(io);
    }
    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        if self.open.load(Ordering::Acquire) {
            for io in self.held.drain(..) {
                self.inner.submit(io);
            }
        }
        self.inner.poll(out)
    }
    fn outstanding(&self) -> usize {
        self.held.len() + self.inner.outstanding()
    }
    fn needs_poll(&self) -> bool {
        if self.signals {
            self.inner.needs_poll()
        } else {
            self.outstanding() > 0
        }
    }
}

fn gated(signals: bool) -> (Env, Arc<AtomicBool>) {
    let inner = Arc::new(MallocBdev::new("G", BLOCKS, BS as u32, None).unwrap());
    let info = BdevInfo::new("G", "Malloc disk", BS as u32, BLOCKS, uuid::Uuid::new_v4());
    let open = Arc::new(AtomicBool::new(true));
    let bdev = Arc::new(Gated { info, inner, open: open.clone(), signals });
    let lun = Lun::new(LunConfig { target_name: "iqn.2024-01.test:tgt".into(), ..LunConfig::default() }, bdev);
    let mut e = env();
    e.lun = lun.clone();
    e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
    let (a, b) = (e.a.clone(), e.b.clone());
    for n in [&a, &b] {
        e.run(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None); // POWER ON
    }
    (e, open)
}

/// Submits a write and a read with the gate shut; whether the channel was busy meanwhile,
/// and that both complete once it opens.
fn busy_while_in_flight(signals: bool) -> bool {
    let (mut e, open) = gated(signals);
    let a = e.a.clone();
    open.store(false, Ordering::Release);
    let w = e.task(&a, &rw10(op::WRITE10, 1, 1, 0), BS as u32, Some(pattern(BS, 7)));
    let r = e.task(&a, &rw10(op::READ10, 9, 1, 0), BS as u32, None);
    let tags = [w.tag, r.tag];
    e.dc.submit(w);
    e.dc.submit(r);
    let mut out = Vec::new();
    e.dc.poll(&mut out);
    assert!(out.iter().all(|r| !r.ends_task()), "nothing completes behind a shut gate");
    assert_eq!(e.dc.outstanding(), 2, "both tasks are in flight");
    let busy = e.dc.busy();
    open.store(true, Ordering::Release);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut ended = Vec::new();
    while ended.len() < 2 && std::time::Instant::now() < deadline {
        e.dc.poll(&mut out);
        for r in out.drain(..).filter(|r| r.ends_task()) {
            let r = done(r);
            assert_eq!(r.status, Status::Good);
            ended.push(r.tag);
        }
    }
    ended.sort_unstable();
    assert_eq!(ended, tags, "both complete once the device answers");
    assert!(!e.dc.busy());
    busy
}

#[test]
fn io_in_flight_on_a_signalling_device_keeps_no_reactor_busy() {
    assert!(!busy_while_in_flight(true), "the device's completion wakes the reactor: nothing to spin for");
}

#[test]
fn io_in_flight_on_a_device_without_a_signal_keeps_polling() {
    assert!(busy_while_in_flight(false), "nothing else would notice the completion");
}
