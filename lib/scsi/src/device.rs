//! The SCSI target device (SPDK's `spdk_scsi_dev`): the logical units of one target by
//! LUN number, and what is answered at target level rather than by a logical unit.
//!
//! * [`LunId`] — a LUN number and the 8-byte LUN field that addresses it (SAM-5 4.6).
//! * [`ScsiDevice`] — the LUN map of a target (shared, `Arc`, built on the control plane
//!   and replaced as a whole when the map changes): lookup, REPORT LUNS (SPC-4 6.33), and
//!   the resets and nexus loss that concern every LUN.
//! * [`DeviceChannel`] — the per-connection executor for one device: routes each task to
//!   its LUN's [`LunChannel`] (opened on first use), answers REPORT LUNS and tasks for
//!   LUN numbers the device does not have (SPC-4 6.6.2, peripheral qualifier 011b), and
//!   fans task management out to the channels.

use std::fmt;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use riser_bdev::IoBuf;

use crate::cdb::{op, put_be32, Cdb};
use crate::exec::{BufAlloc, LunChannel};
use crate::lun::{Lun, ResetKind};
use crate::sense::{Asc, CmdError, CmdResult, Sense, SenseKey, Status};
use crate::task::{Nexus, Residual, ScsiResult, ScsiTask, TagMap, TaskEvent};

/// A LUN number: what the 8-byte LUN field of a command addresses.
///
/// riser uses the first addressing level only, with peripheral device addressing below
/// 256 and flat space addressing up to 16383 (SAM-5 4.6.6, 4.6.7), as Linux and libiscsi
/// expect. A field with another address method decodes to [`LunId::UNSUPPORTED`], a
/// number no LUN has.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct LunId(u64);

impl LunId {
    /// What a LUN field with an address method riser does not use decodes to.
    pub const UNSUPPORTED: LunId = LunId(u64::MAX);

    pub const fn new(id: u64) -> LunId {
        LunId(id)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// Decodes the 8-byte LUN field (peripheral or flat space addressing, first level).
    pub fn from_field(b: [u8; 8]) -> LunId {
        match b[0] >> 6 {
            0b00 => LunId(b[1] as u64 | (((b[0] & 0x3F) as u64) << 8)),
            0b01 => LunId((((b[0] & 0x3F) as u64) << 8) | b[1] as u64),
            _ => LunId::UNSUPPORTED,
        }
    }

    /// The 8-byte LUN field for this number: peripheral device addressing below 256, flat
    /// space addressing above (14 bits: higher numbers are not addressable).
    pub fn to_field(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        if self.0 < 256 {
            b[1] = self.0 as u8;
        } else {
            let l = (self.0 & 0x3FFF) as u16;
            b[0] = 0x40 | (l >> 8) as u8;
            b[1] = l as u8;
        }
        b
    }
}

impl From<u16> for LunId {
    fn from(id: u16) -> LunId {
        LunId(id as u64)
    }
}

impl From<LunId> for u64 {
    fn from(id: LunId) -> u64 {
        id.0
    }
}

impl fmt::Display for LunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The LUNs of one target, by LUN number. Immutable: a change of the LUN map is a new
/// `ScsiDevice`, handed to every [`DeviceChannel`] with [`DeviceChannel::set_device`].
#[derive(Default)]
pub struct ScsiDevice {
    /// Sorted by LUN number, one LUN per number.
    luns: Vec<Arc<Lun>>,
}

impl fmt::Debug for ScsiDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScsiDevice")
            .field(
                "luns",
                &self.luns.iter().map(|l| l.id()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ScsiDevice {
    /// The device of the LUNs `luns`, each under its own number ([`Lun::id`]). Should two
    /// LUNs have the same number, the first one listed is the one addressed.
    pub fn new(mut luns: Vec<Arc<Lun>>) -> ScsiDevice {
        luns.sort_by_key(|l| l.id());
        luns.dedup_by_key(|l| l.id());
        ScsiDevice { luns }
    }

    /// The LUN numbered `id`.
    pub fn lun(&self, id: LunId) -> Option<&Arc<Lun>> {
        self.luns
            .binary_search_by_key(&id.0, |l| l.id())
            .ok()
            .map(|i| &self.luns[i])
    }

    /// Every LUN, by increasing number.
    pub fn luns(&self) -> &[Arc<Lun>] {
        &self.luns
    }

    /// The LUN numbers, increasing.
    pub fn ids(&self) -> impl Iterator<Item = LunId> + '_ {
        self.luns.iter().map(|l| LunId(l.id()))
    }

    pub fn len(&self) -> usize {
        self.luns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.luns.is_empty()
    }

    /// Tells every LUN the LUN numbers of this device ([`Lun::set_target_luns`]): a LUN
    /// that had been told a different set queues REPORTED LUNS DATA HAS CHANGED for every
    /// I_T nexus (SPC-4 6.33). Call it once for each new LUN map.
    pub fn announce_luns(&self) {
        let ids: Vec<u64> = self.luns.iter().map(|l| l.id()).collect();
        for l in &self.luns {
            l.set_target_luns(&ids);
        }
    }

    /// The shared-state part of a reset, on every LUN ([`Lun::reset`]). The tasks are
    /// aborted by each connection's [`DeviceChannel`]
    /// ([`DeviceChannel::reset_target`] does both).
    pub fn reset(&self, kind: ResetKind) -> ResetPending {
        ResetPending(self.luns.iter().filter_map(|l| l.reset(kind)).collect())
    }

    /// The I_T nexus is gone: [`Lun::nexus_lost`] on every LUN.
    pub fn nexus_lost(&self, nexus: &Nexus) {
        for l in &self.luns {
            l.nexus_lost(nexus);
        }
    }

    /// Answers REPORT LUNS addressed to any LUN number, existing or not: the numbers of
    /// this device. Reporting them clears REPORTED LUNS DATA HAS CHANGED for the task's
    /// nexus on the addressed LUN (SPC-4 6.33).
    pub fn report_luns(&self, task: &ScsiTask) -> ScsiResult {
        let ids: Vec<u64> = self.luns.iter().map(|l| l.id()).collect();
        report_luns(task, &ids, self.lun(LunId(task.lun)))
    }
}

/// Whether a CDB is answered at target level ([`ScsiDevice::report_luns`]) rather than by
/// the addressed LUN: REPORT LUNS.
pub(crate) fn is_target_level(cdb: &Cdb) -> bool {
    cdb.opcode() == op::REPORT_LUNS
}

/// REPORT LUNS parameter data (SPC-4 6.33) for `luns`, before allocation-length
/// truncation. SELECT REPORT 0, 1 and 2 all list the same (riser has no well-known LUNs).
pub(crate) fn report_luns_data(cdb: &Cdb, luns: &[u64]) -> CmdResult<Vec<u8>> {
    let select = cdb.u8(2);
    if select > 0x02 {
        return Err(CmdError::invalid_cdb(2, None));
    }
    // SPC-4 6.33: an allocation length below 16 is an error.
    if cdb.be32(6) < 16 {
        return Err(CmdError::invalid_cdb(6, None));
    }
    let mut ids: Vec<u64> = if select == 0x01 {
        Vec::new()
    } else {
        luns.to_vec()
    };
    ids.sort_unstable();
    ids.dedup();
    let mut v = vec![0u8; 8 + 8 * ids.len()];
    put_be32(&mut v, 0, (8 * ids.len()) as u32);
    for (i, id) in ids.iter().enumerate() {
        v[8 + 8 * i..16 + 8 * i].copy_from_slice(&LunId(*id).to_field());
    }
    Ok(v)
}

/// REPORT LUNS for a target whose LUN numbers are `luns`; `addressed` is the LUN the task
/// was sent to, if it exists.
pub(crate) fn report_luns(
    task: &ScsiTask,
    luns: &[u64],
    addressed: Option<&Arc<Lun>>,
) -> ScsiResult {
    if let Some(lun) = addressed {
        lun.clear_ua(task.nexus, Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
    }
    match report_luns_data(&task.cdb, luns) {
        Ok(v) => data_result(task, v, task.cdb.be32(6) as usize),
        Err(e) => error_result(task, e),
    }
}

/// The answer for a task addressed to a LUN that does not exist (SPC-4 6.6.2, SAM-5):
/// INQUIRY returns data with peripheral qualifier 011b and device type 1Fh; REQUEST SENSE
/// returns LOGICAL UNIT NOT SUPPORTED as sense data; everything else (REPORT LUNS is
/// answered before a LUN is looked for) is CHECK CONDITION, ILLEGAL REQUEST, LOGICAL UNIT
/// NOT SUPPORTED.
pub(crate) fn no_such_lun(task: &ScsiTask) -> ScsiResult {
    let cdb = &task.cdb;
    match cdb.opcode() {
        op::INQUIRY => {
            let evpd = cdb.u8(1) & 0x01 != 0;
            if cdb.u8(1) & 0x02 != 0 || (!evpd && cdb.u8(2) != 0) {
                return error_result(task, CmdError::invalid_cdb(if evpd { 1 } else { 2 }, None));
            }
            let v = if evpd {
                match cdb.u8(2) {
                    0x00 => vec![0x7F, 0x00, 0x00, 0x01, 0x00],
                    _ => return error_result(task, CmdError::invalid_cdb(2, None)),
                }
            } else {
                let mut d = vec![0u8; 36];
                d[0] = 0x7F; // qualifier 011b, type 1Fh: no logical unit here
                d[2] = 0x06;
                d[3] = 0x12;
                d[4] = 31;
                d
            };
            data_result(task, v, cdb.be16(3) as usize)
        }
        op::REQUEST_SENSE => {
            let s = Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED);
            let b = s.encode(cdb.u8(1) & 0x01 != 0);
            data_result(task, b.as_slice().to_vec(), cdb.u8(4) as usize)
        }
        _ => error_result(task, CmdError::illegal(Asc::LOGICAL_UNIT_NOT_SUPPORTED)),
    }
}

fn data_result(task: &ScsiTask, mut v: Vec<u8>, alloc: usize) -> ScsiResult {
    v.truncate(alloc);
    let residual = Residual::compute(v.len() as u64, task.edtl);
    v.truncate(task.edtl as usize);
    let n = v.len();
    ScsiResult {
        tag: task.tag,
        status: Status::Good,
        sense: None,
        data_in: if n > 0 {
            Some(IoBuf::from(v))
        } else {
            None
        },
        data_len: n,
        data_offset: 0,
        residual,
    }
}

fn error_result(task: &ScsiTask, e: CmdError) -> ScsiResult {
    ScsiResult {
        tag: task.tag,
        status: e.status,
        sense: e.sense.map(|s| s.fixed()),
        data_in: None,
        data_len: 0,
        data_offset: 0,
        residual: Residual::compute(0, task.edtl),
    }
}

/// Makes the buffer allocator of each [`LunChannel`] a [`DeviceChannel`] opens.
pub type BufAllocFactory = Box<dyn FnMut() -> BufAlloc>;

/// Runs the tasks of one connection (one reactor) against a [`ScsiDevice`]: one
/// [`LunChannel`] per LUN, opened when the LUN is first addressed. Not shared between
/// threads.
///
/// Like a [`LunChannel`], it never completes a task inside [`submit`](Self::submit):
/// every result, the ones answered at target level included, comes from
/// [`poll`](Self::poll).
pub struct DeviceChannel {
    dev: Arc<ScsiDevice>,
    /// By LUN number (only LUNs the device has get a channel: a peer picking numbers cannot
    /// grow the map, whatever they collide on).
    channels: TagMap<u64, LunChannel>,
    /// Channels of LUNs that left the device with tasks in flight: polled until those
    /// are done, then dropped.
    retired: Vec<LunChannel>,
    /// Results answered at target level, for the next poll.
    done: Vec<TaskEvent>,
    alloc: Option<BufAllocFactory>,
    /// What the connection holds of the buffer budget; every LUN channel charges its reads.
    account: riser_buf::Account,
    /// Reads larger than this stream in pieces (see [`Self::set_stream_chunk`]).
    stream_chunk: Option<usize>,
}

impl DeviceChannel {
    pub fn new(dev: Arc<ScsiDevice>) -> DeviceChannel {
        DeviceChannel {
            dev,
            channels: TagMap::default(),
            retired: Vec::new(),
            done: Vec::new(),
            alloc: None,
            account: riser_buf::Account::new(),
            stream_chunk: None,
        }
    }

    /// Charges the reads of every LUN channel to `account` (the connection's, shared with
    /// its write buffers: see `riser_buf::Pool::try_alloc_for`).
    pub fn set_account(&mut self, account: riser_buf::Account) {
        for ch in self.channels.values_mut() {
            ch.set_account(account.clone());
        }
        self.account = account;
    }

    /// Streams READs larger than `bytes` in pieces on every LUN channel (see
    /// [`LunChannel::set_stream_chunk`]); `None`: whole.
    pub fn set_stream_chunk(&mut self, bytes: Option<usize>) {
        for ch in self.channels.values_mut() {
            ch.set_stream_chunk(bytes);
        }
        self.stream_chunk = bytes;
    }

    /// Data for a streamed write on LUN `lun` (see [`LunChannel::write_data`]).
    /// A write streaming into a LUN that left the device (`iscsi_target_node_remove_lun`)
    /// still gets its data on the retired channel, so it completes instead of waiting forever.
    pub fn write_data(&mut self, lun: LunId, tag: u64, offset: u32, buf: riser_bdev::IoBuf) {
        let ch = match self.channels.get_mut(&lun.0) {
            Some(ch) if ch.takes_data(tag) => Some(ch),
            _ => self.retired.iter_mut().find(|ch| ch.lun().id() == lun.0 && ch.takes_data(tag)),
        };
        match ch {
            Some(ch) => ch.write_data(tag, offset, buf),
            None => match self.channels.get_mut(&lun.0) {
                // Its own channel says why it takes none.
                Some(ch) => ch.write_data(tag, offset, buf),
                None => log::debug!("data for task {tag:#x} of LUN {}, which has no channel: dropped", lun.0),
            },
        }
    }

    /// Like [`new`](Self::new), with each LUN channel's buffers coming from an allocator
    /// made by `alloc` (see [`LunChannel::with_allocator`]).
    pub fn with_allocator(dev: Arc<ScsiDevice>, alloc: BufAllocFactory) -> DeviceChannel {
        DeviceChannel {
            alloc: Some(alloc),
            ..DeviceChannel::new(dev)
        }
    }

    pub fn device(&self) -> &Arc<ScsiDevice> {
        &self.dev
    }

    /// The LUN map changed: from now on tasks are routed by `dev`. The channels of LUNs
    /// that are still there (the same [`Lun`]) are kept; those of LUNs that left finish
    /// the tasks they have (reported by [`poll`](Self::poll) as usual; a streamed write
    /// still gets its data, [`write_data`](Self::write_data)) and are dropped.
    pub fn set_device(&mut self, dev: Arc<ScsiDevice>) {
        for (id, ch) in std::mem::take(&mut self.channels) {
            let kept = dev.lun(LunId(id)).is_some_and(|l| Arc::ptr_eq(l, ch.lun()));
            if kept {
                self.channels.insert(id, ch);
            } else if ch.outstanding() > 0 {
                // Not `busy`: a streamed write waiting for the initiator's data is no
                // work, but it is a task that must end.
                self.retired.push(ch);
            }
        }
        self.dev = dev;
    }

    /// The channel of LUN `id` on this connection, opened on first use; `None` if the
    /// device has no such LUN.
    pub fn channel(&mut self, id: LunId) -> Option<&mut LunChannel> {
        // One lookup per task (the entry), not a check and then a get.
        match self.channels.entry(id.0) {
            Entry::Occupied(e) => Some(e.into_mut()),
            Entry::Vacant(e) => {
                let lun = self.dev.lun(id)?.clone();
                let mut ch = match self.alloc.as_mut() {
                    Some(make) => LunChannel::with_allocator(lun, make()),
                    None => LunChannel::new(lun),
                };
                ch.set_account(self.account.clone());
                ch.set_stream_chunk(self.stream_chunk);
                Some(e.insert(ch))
            }
        }
    }

    /// Starts a task addressed to LUN number `task.lun`. REPORT LUNS is answered by the
    /// device, a task for a LUN the device does not have as SPC-4 6.6.2 says; everything
    /// else goes to the LUN's channel. The result comes from a later [`poll`](Self::poll).
    pub fn submit(&mut self, task: ScsiTask) {
        if is_target_level(&task.cdb) {
            let r = self.dev.report_luns(&task);
            self.done.push(TaskEvent::Done(r));
            return;
        }
        match self.channel(LunId(task.lun)) {
            Some(ch) => ch.submit(task),
            None => self.done.push(TaskEvent::Done(no_such_lun(&task))),
        }
    }

    /// Moves the tasks' events (see [`TaskEvent`]) into `out`; returns how many.
    pub fn poll(&mut self, out: &mut Vec<TaskEvent>) -> usize {
        let mut n = self.done.len();
        out.append(&mut self.done);
        for ch in self.channels.values_mut() {
            n += ch.poll(out);
        }
        for ch in self.retired.iter_mut() {
            n += ch.poll(out);
        }
        self.retired.retain(|ch| ch.outstanding() > 0);
        n
    }

    /// Moves the events already queued (answers at target level, pieces, wants) into `out`
    /// without polling the devices: for tests that serve a streamed write's wants before its
    /// writes in flight complete.
    #[cfg(test)]
    pub(crate) fn take_events(&mut self, out: &mut Vec<TaskEvent>) {
        out.append(&mut self.done);
        for ch in self.channels.values_mut() {
            ch.take_events(out);
        }
    }

    /// Whether `poll` has work to do (results to return, I/O in flight, tasks waiting for
    /// a range lock, a background SANITIZE): keep polling while true.
    pub fn busy(&self) -> bool {
        !self.done.is_empty()
            || self.retired.iter().any(|ch| ch.busy())
            || self.channels.values().any(|ch| ch.busy())
    }

    /// Tasks in flight, plus the events waiting for `poll` (see [`LunChannel::outstanding`]).
    pub fn outstanding(&self) -> usize {
        self.done.len()
            + self
                .channels
                .values()
                .chain(self.retired.iter())
                .map(|ch| ch.outstanding())
                .sum::<usize>()
    }

    /// ABORT TASK: aborts the task `tag` of `nexus` sent to LUN `lun` (see
    /// [`LunChannel::abort_task`]). Returns whether it was found.
    pub fn abort_task(&mut self, nexus: &Nexus, lun: LunId, tag: u64) -> bool {
        if let Some(ch) = self.channels.get_mut(&lun.0) {
            if ch.abort_task(nexus, tag) {
                return true;
            }
        }
        self.retired
            .iter_mut()
            .filter(|ch| ch.lun().id() == lun.0)
            .any(|ch| ch.abort_task(nexus, tag))
    }

    /// LOGICAL UNIT RESET of LUN `lun`: its shared state ([`Lun::reset`], once for every
    /// connection: the LUN is shared) and the tasks of this connection on it. Nothing
    /// happens for a LUN number the device does not have.
    ///
    /// Returns at once; the response to the task management function should wait until
    /// what it returns is [settled](ResetPending::settled) (the other gateways told).
    /// Tasks still in flight on a channel of a LUN that left the device under that number
    /// are aborted too.
    pub fn reset_lun(&mut self, lun: LunId, kind: ResetKind) -> ResetPending {
        let pending = ResetPending(self.dev.lun(lun).and_then(|l| l.reset(kind)).into_iter().collect());
        if let Some(ch) = self.channels.get_mut(&lun.0) {
            ch.abort_all();
        }
        for ch in self.retired.iter_mut().filter(|ch| ch.lun().id() == lun.0) {
            ch.abort_all();
        }
        pending
    }

    /// TARGET WARM/COLD RESET: every LUN's shared state, and every task of this
    /// connection.
    pub fn reset_target(&mut self, kind: ResetKind) -> ResetPending {
        let pending = self.dev.reset(kind);
        for ch in self.channels.values_mut().chain(self.retired.iter_mut()) {
            ch.abort_all();
        }
        pending
    }

    /// The connection (and with it the I_T nexus `nexus`) ends: its tasks are aborted,
    /// the channels forget the nexus, and every LUN drops what the nexus held (SPC-2
    /// reservations, medium removal prevention: [`Lun::nexus_lost`]).
    pub fn teardown(&mut self, nexus: &Nexus) {
        for ch in self.channels.values_mut().chain(self.retired.iter_mut()) {
            ch.abort_nexus(nexus);
            ch.forget_nexus(nexus);
        }
        self.dev.nexus_lost(nexus);
    }
}

#[cfg(test)]
mod tests;

/// The announcements of a reset to the other gateways exporting the same devices (see
/// `lu_events`), for the connection to hold its task management response until they are
/// settled; empty for local devices.
#[derive(Default)]
pub struct ResetPending(Vec<Arc<crate::lu_events::Announcement>>);

impl ResetPending {
    /// Every other gateway was told (or the bound, `lu_events::ANNOUNCE_WAIT`, passed).
    pub fn settled(&self) -> bool {
        self.0.iter().all(|a| a.settled())
    }
}
