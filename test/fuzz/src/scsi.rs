//! The SCSI CDB decoder and everything behind it: arbitrary commands submitted to a
//! `DeviceChannel` over a `ScsiDevice` with two malloc-backed LUNs, as a connection does
//! after login (any CDB, any EDTL, any amount of Data-Out, two I_T nexuses, aborts and
//! resets in between).
//!
//! Input: `config`, then commands until the bytes run out, each:
//! `ctl`, `len` (CDB length, low 5 bits, at most 16), the CDB, EDTL (4 bytes, big-endian),
//! Data-Out length (2 bytes), the Data-Out bytes.
//! - `config` bit 0: LUN 0 read-only, bit 1: removable, bit 2: thin provisioning off, bit 3:
//!   SANITIZE OVERWRITE offered, bit 4: 4096-byte blocks.
//! - `ctl` bit 0: nexus B (else A); bit 1: R bit; bit 2: W bit with the Data-Out; bits 3-4:
//!   LUN 0, 1, 7 (absent) or 0 again; bits 5-6: task attribute; bit 7: wait for the result
//!   before the next command (else several are in flight together).
//!   A `ctl` of 0xff instead aborts the last task, 0xfe resets LUN 0, 0xfd resets the
//!   target, 0xfc ends nexus A's connection (teardown).
//!
//! Checks: every task completes (no hang: a bounded number of polls), exactly once, and
//! never returns more data than its EDTL.

use std::collections::HashSet;
use std::sync::Arc;

use riser_bdev::{BdevRegistry, IoBuf};
use riser_scsi::cdb::{cdb_len, Cdb};
use riser_scsi::{
    command_name, DataOut, DeviceChannel, Lun, LunConfig, LunId, Nexus, ResetKind, ScsiDevice,
    ScsiTask, TaskAttr, TaskEvent,
};

/// Polls allowed for the tasks in flight to finish before it counts as a hang.
const MAX_POLLS: usize = 20_000;
/// Commands per input: enough for multi-step sequences, bounded so one input stays fast.
const MAX_COMMANDS: usize = 64;

pub fn lun(id: u64, blocks: u64, block_size: u32, cfg: LunConfig) -> Arc<Lun> {
    let mut reg = BdevRegistry::new();
    let name = reg
        .create_malloc(None, blocks, block_size, None)
        .expect("malloc bdev");
    let bdev = reg.get(&name).expect("the bdev just made");
    Lun::new(
        LunConfig {
            id,
            target_name: "iqn.2016-06.io.riser:fuzz".into(),
            ..cfg
        },
        bdev,
    )
}

pub fn run(data: &[u8]) {
    let mut data = data;
    let config = crate::take_u8(&mut data);
    let block_size = if config & 0x10 != 0 { 4096 } else { 512 };
    let lun0 = lun(
        0,
        (128 * 1024) / u64::from(block_size),
        block_size,
        LunConfig {
            read_only: config & 1 != 0,
            removable: config & 2 != 0,
            thin_provisioning: (config & 4 != 0).then_some(false),
            sanitize_overwrite: config & 8 != 0,
            ..LunConfig::default()
        },
    );
    let lun1 = lun(1, 64, 512, LunConfig::default());
    let mut dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun0, lun1])));
    let nexus = [
        Arc::new(Nexus::new("iqn.1994-05.com.redhat:a", 0x23d0_0000_0001, "iqn.2016-06.io.riser:fuzz", 1)),
        Arc::new(Nexus::new("iqn.1994-05.com.redhat:b", 0x23d0_0000_0002, "iqn.2016-06.io.riser:fuzz", 1)),
    ];

    let mut pending: HashSet<u64> = HashSet::new();
    let mut edtls = std::collections::HashMap::new();
    let mut last: Option<(usize, u64, u64)> = None;
    let mut tag = 0u64;
    let mut out = Vec::new();
    for _ in 0..MAX_COMMANDS {
        if data.is_empty() {
            break;
        }
        let ctl = crate::take_u8(&mut data);
        match ctl {
            0xff => {
                if let Some((n, l, t)) = last {
                    dc.abort_task(&nexus[n], LunId::new(l), t);
                }
                continue;
            }
            0xfe => {
                dc.reset_lun(LunId::new(0), ResetKind::LunReset);
                continue;
            }
            0xfd => {
                dc.reset_target(ResetKind::TargetWarmReset);
                continue;
            }
            0xfc => {
                dc.teardown(&nexus[0]);
                continue;
            }
            _ => {}
        }
        let len = usize::from(crate::take_u8(&mut data) & 0x1f).min(16);
        let cdb = crate::take(&mut data, len).to_vec();
        let edtl = crate::take_be(&mut data, 4) as u32;
        let dout_len = crate::take_be(&mut data, 2) as usize;
        let dout = crate::take(&mut data, dout_len).to_vec();

        decode(&cdb);

        let n = usize::from(ctl & 1);
        let l = match (ctl >> 3) & 3 {
            1 => 1,
            2 => 7,
            _ => 0,
        };
        tag += 1;
        let mut task = ScsiTask::new(tag, l, &cdb, edtl, &nexus[n]);
        task.read = ctl & 2 != 0;
        task.write = ctl & 4 != 0;
        if task.write {
            task.data_out = DataOut::Whole(IoBuf::from(dout));
        }
        task.attr = match (ctl >> 5) & 3 {
            0 => TaskAttr::Simple,
            1 => TaskAttr::Ordered,
            2 => TaskAttr::HeadOfQueue,
            _ => TaskAttr::Untagged,
        };
        pending.insert(tag);
        edtls.insert(tag, edtl);
        last = Some((n, l, tag));
        dc.submit(task);
        if ctl & 0x80 != 0 {
            settle(&mut dc, &mut out, &mut pending, &edtls, Some(tag));
        }
    }
    settle(&mut dc, &mut out, &mut pending, &edtls, None);
    dc.teardown(&nexus[0]);
    dc.teardown(&nexus[1]);
    settle(&mut dc, &mut out, &mut pending, &edtls, None);
}

/// Polls until `tag` (or every task) has its result.
fn settle(
    dc: &mut DeviceChannel,
    out: &mut Vec<TaskEvent>,
    pending: &mut HashSet<u64>,
    edtls: &std::collections::HashMap<u64, u32>,
    tag: Option<u64>,
) {
    for _ in 0..MAX_POLLS {
        out.clear();
        dc.poll(out);
        for ev in out.iter() {
            assert!(pending.remove(&ev.tag()), "task {} completed twice (or never started)", ev.tag());
            // No streaming here: every event is a task's end; an abort brings no data.
            let TaskEvent::Done(r) = ev else { continue };
            let edtl = edtls.get(&r.tag).copied().unwrap_or(0);
            assert!(
                r.data().len() <= edtl as usize,
                "task {}: {} bytes of data for an EDTL of {edtl}: {r:?}",
                r.tag,
                r.data().len()
            );
            let _ = r.sense_triplet();
        }
        let done = match tag {
            Some(t) => !pending.contains(&t),
            None => pending.is_empty() && !dc.busy(),
        };
        if done {
            return;
        }
    }
    panic!(
        "hang: tasks {pending:?} still pending after {MAX_POLLS} polls ({} outstanding)",
        dc.outstanding()
    );
}

/// The CDB accessors, as the executors use them.
fn decode(bytes: &[u8]) {
    let cdb = Cdb::new(bytes);
    let _ = cdb_len(cdb.opcode());
    let _ = cdb.len();
    let _ = cdb.control();
    let _ = cdb.service_action();
    for i in 0..20 {
        let _ = (cdb.u8(i), cdb.be16(i), cdb.be24(i), cdb.be32(i), cdb.be64(i));
    }
    let _ = command_name(&cdb);
    let _ = format!("{cdb:?}");
}
