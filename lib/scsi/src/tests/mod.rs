//! End-to-end tests: CDBs as an initiator sends them, through a [`DeviceChannel`] and the
//! [`LunChannel`] of the LUN, against a real malloc bdev. Shared fixtures here; the tests, by topic, in the submodules.

mod alua;
mod alua_liveness;
mod fake_shared;
mod inquiry;
mod lu_shared;
mod medium;
mod mode;
mod multi_step;
mod opcodes;
mod pr_diverge;
mod pr_move;
mod pr_offload;
mod read_write;
mod reservations;
mod robustness;
mod sanitize;
mod task_mgmt;
mod unit_attention;
mod durability;
mod xcopy;
mod stream;
mod wake;

use std::sync::Arc;

use riser_bdev::{BdevRegistry, IoBuf};

use crate::cdb::op;
use crate::{
    DataOut, DeviceChannel, Lun, LunChannel, LunConfig, LunId, Nexus, Residual, ScsiDevice,
    ScsiResult, ScsiTask, Status, TaskEvent,
};

/// Polls a channel for the results of tasks that end (tests without streaming or aborts:
/// any other event fails the test).
pub(crate) trait PollResults {
    fn poll_results(&mut self, out: &mut Vec<ScsiResult>) -> usize;
}

fn push_results(events: Vec<TaskEvent>, out: &mut Vec<ScsiResult>) -> usize {
    let n = events.len();
    out.extend(events.into_iter().map(done));
    n
}

impl PollResults for DeviceChannel {
    fn poll_results(&mut self, out: &mut Vec<ScsiResult>) -> usize {
        let mut ev = Vec::new();
        self.poll(&mut ev);
        push_results(ev, out)
    }
}

impl PollResults for LunChannel {
    fn poll_results(&mut self, out: &mut Vec<ScsiResult>) -> usize {
        let mut ev = Vec::new();
        self.poll(&mut ev);
        push_results(ev, out)
    }
}

/// The result of a task's last event (which must be its end, not an abort).
pub(crate) fn done(ev: TaskEvent) -> ScsiResult {
    match ev {
        TaskEvent::Done(r) => r,
        other => panic!("expected the task's result, got {other:?}"),
    }
}

pub(crate) const BS: usize = 512;
pub(crate) const BLOCKS: u64 = 8192;

pub(crate) struct Env {
    pub lun: Arc<Lun>,
    /// The device: `lun` alone, until [`Env::set_luns`].
    pub dc: DeviceChannel,
    pub a: Arc<Nexus>,
    pub b: Arc<Nexus>,
    next_tag: u64,
}

/// A LUN over a new malloc bdev of `blocks` blocks.
pub(crate) fn malloc_lun(cfg: LunConfig, blocks: u64) -> Arc<Lun> {
    let mut reg = BdevRegistry::new();
    let name = reg.create_malloc(None, blocks, BS as u32, None).unwrap();
    let bdev = reg.get(&name).unwrap();
    Lun::new(
        LunConfig {
            target_name: "iqn.2024-01.test:tgt".into(),
            ..cfg
        },
        bdev,
    )
}

pub(crate) fn env_with(cfg: LunConfig) -> Env {
    let lun = malloc_lun(cfg, BLOCKS);
    let dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun.clone()])));
    let a = Arc::new(Nexus::new(
        "iqn.2024-01.test:init1",
        0x23d0_0000_0001,
        "iqn.2024-01.test:tgt",
        1,
    ));
    let b = Arc::new(Nexus::new(
        "iqn.2024-01.test:init2",
        0x23d0_0000_0002,
        "iqn.2024-01.test:tgt",
        1,
    ));
    let mut e = Env {
        lun,
        dc,
        a,
        b,
        next_tag: 1,
    };
    // Consume the power-on unit attentions, as initiators do after login.
    let (a, b) = (e.a.clone(), e.b.clone());
    let r = e.run(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense_triplet(), Some((6, 0x29, 0x00)));
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.run(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e
}

pub(crate) fn env() -> Env {
    env_with(LunConfig::default())
}

impl Env {
    /// The channel of the env's LUN.
    pub fn ch(&mut self) -> &mut LunChannel {
        let id = LunId::new(self.lun.id());
        self.dc.channel(id).expect("the env's LUN is in its device")
    }

    /// Changes the LUN map to the numbers `ids`: the LUNs already there stay, a small new
    /// malloc LUN comes in for each other number (the env's LUN is the one numbered
    /// `lun.id()`, if listed).
    pub fn set_luns(&mut self, ids: &[u64]) {
        let mut luns = Vec::new();
        for &id in ids {
            let l = match self.dc.device().lun(LunId::new(id)) {
                Some(l) => l.clone(),
                None if id == self.lun.id() => self.lun.clone(),
                None => malloc_lun(
                    LunConfig {
                        id,
                        ..LunConfig::default()
                    },
                    64,
                ),
            };
            luns.push(l);
        }
        self.dc.set_device(Arc::new(ScsiDevice::new(luns)));
    }

    pub fn task<'n>(
        &mut self,
        n: &'n Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
    ) -> ScsiTask<'n> {
        let lun = self.lun.id();
        self.task_to(lun, n, cdb, edtl, data)
    }

    /// A task addressed to LUN number `lun`.
    pub fn task_to<'n>(
        &mut self,
        lun: u64,
        n: &'n Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
    ) -> ScsiTask<'n> {
        let tag = self.next_tag;
        self.next_tag += 1;
        let mut t = ScsiTask::new(tag, lun, cdb, edtl, n);
        t.write = data.is_some();
        t.read = data.is_none() && edtl > 0;
        t.data_out = data.map_or(DataOut::None, |d| DataOut::Whole(IoBuf::from(d)));
        t
    }

    /// Submits to the env's LUN and polls until the result comes back.
    pub fn run(
        &mut self,
        n: &Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
    ) -> ScsiResult {
        let lun = self.lun.id();
        self.run_to(lun, n, cdb, edtl, data)
    }

    /// Submits to LUN number `lun` and polls until the result comes back.
    pub fn run_to(
        &mut self,
        lun: u64,
        n: &Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
    ) -> ScsiResult {
        let t = self.task_to(lun, n, cdb, edtl, data);
        let tag = t.tag;
        self.dc.submit(t);
        let mut out = Vec::new();
        // Time-bounded: some work finishes on another thread (PR OUT on shared state).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            self.dc.poll(&mut out);
            if let Some(p) = out.iter().position(|r| r.tag() == tag && r.ends_task()) {
                return done(out.swap_remove(p));
            }
        }
        panic!("task {tag} never completed");
    }

    pub fn ok(&mut self, n: &Arc<Nexus>, cdb: &[u8], edtl: u32, data: Option<Vec<u8>>) -> Vec<u8> {
        let r = self.run(n, cdb, edtl, data);
        assert_eq!(r.status, Status::Good, "{cdb:02x?}: {r:?}");
        r.data().to_vec()
    }

    /// Expects CHECK CONDITION with (key, asc, ascq).
    pub fn check(
        &mut self,
        n: &Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
        k: (u8, u8, u8),
    ) {
        let r = self.run(n, cdb, edtl, data);
        assert_eq!(r.status, Status::CheckCondition, "{cdb:02x?}: {r:?}");
        assert_eq!(r.sense_triplet(), Some(k), "{cdb:02x?}: {r:?}");
    }

    pub fn conflict(&mut self, n: &Arc<Nexus>, cdb: &[u8], edtl: u32, data: Option<Vec<u8>>) {
        let r = self.run(n, cdb, edtl, data);
        assert_eq!(r.status, Status::ReservationConflict, "{cdb:02x?}: {r:?}");
    }

    pub fn write16(&mut self, n: &Arc<Nexus>, lba: u64, data: Vec<u8>) -> ScsiResult {
        let blocks = (data.len() / BS) as u32;
        let c = rw16(op::WRITE16, lba, blocks, 0);
        let len = data.len() as u32;
        self.run(n, &c, len, Some(data))
    }

    pub fn read16(&mut self, n: &Arc<Nexus>, lba: u64, blocks: u32) -> Vec<u8> {
        let c = rw16(op::READ16, lba, blocks, 0);
        self.ok(n, &c, blocks * BS as u32, None)
    }
}

pub(crate) fn rw10(opc: u8, lba: u32, blocks: u16, flags: u8) -> Vec<u8> {
    let mut c = vec![opc, flags, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub(crate) fn rw12(opc: u8, lba: u32, blocks: u32, flags: u8) -> Vec<u8> {
    let mut c = vec![opc, flags, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub(crate) fn rw16(opc: u8, lba: u64, blocks: u32, flags: u8) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = opc;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub(crate) fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const ILLEGAL_FIELD: (u8, u8, u8) = (5, 0x24, 0);
const LBA_OOR: (u8, u8, u8) = (5, 0x21, 0);

fn caw(lba: u64, blocks: u8) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op::COMPARE_AND_WRITE;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

fn get_lba_status(lba: u64, alloc: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op::SERVICE_ACTION_IN16;
    c[1] = op::SAI_GET_LBA_STATUS;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// (lba, blocks, status) of each descriptor.
fn lba_status_descs(d: &[u8]) -> Vec<(u64, u32, u8)> {
    d[8..]
        .chunks_exact(16)
        .map(|x| {
            (
                u64::from_be_bytes(x[0..8].try_into().unwrap()),
                u32::from_be_bytes(x[8..12].try_into().unwrap()),
                x[12],
            )
        })
        .collect()
}
