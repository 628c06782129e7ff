//! The per-reactor executor: [`LunChannel`] runs SCSI tasks against one LUN through the
//! reactor's own bdev channel.
//!
//! `submit` never blocks and never completes a task by itself: emulated commands are
//! answered at the next [`poll`](LunChannel::poll), block commands when their bdev I/Os
//! complete. Multi-step commands (COMPARE AND WRITE, ORWRITE, WRITE AND VERIFY, WRITE
//! SAME, UNMAP with several descriptors, ...) are small state machines advanced by bdev
//! completions.
//!
//! Here: the types, the public API and the results. `dispatch` runs the common checks and
//! picks the handler, `handlers` decodes the CDBs into jobs, `jobs` runs them against the
//! bdev (`rmw`: the read-modify-write jobs), `util` holds small helpers.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use riser_bdev::{BdevError, BdevIo, IoBuf, IoCompletion, IoKind, Lba};
use riser_buf::{Account, Pool, Waiter};
use riser_reactor::{Tag, TagLayout};

use crate::cdb::{get_be16, get_be32, get_be64, op, Cdb};
use crate::inquiry::{
    self, MAX_CAW_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_UNMAP_LBA_COUNT, MAX_WRITE_SAME_BLOCKS,
    WRITE_SAME_CHUNK_BYTES,
};
use crate::lock::{FastCounter, RangeGrant, WriteAdmission};
use crate::lun::{Lun, ATTN_RESERVED, ATTN_SANITIZE, MODE_DSENSE, MODE_NO_MEDIUM, MODE_WCE};
use crate::opcodes::{self, CmdDesc, F_MEDIUM};
use crate::pr;
use crate::rw;
use crate::sanitize::{self, SanitizeOp, SanitizeState};
use crate::sense::{Asc, CmdError, CmdResult, Sense, SenseKey, Status};
use crate::task::{DataOut, DataPiece, DataWant, Nexus, Residual, ScsiResult, ScsiTask, TaskEvent};
use crate::xcopy::{self, CopyStatus, Segment};

mod dispatch;
mod handlers;
mod jobs;
mod rmw;
mod util;
use rmw::Rmw;
use util::*;

/// Allocates data buffers of exactly the requested length. The executor fills every byte
/// of each buffer it takes (a device read, a pattern), so their contents may be stale.
pub type BufAlloc = Box<dyn FnMut(usize) -> IoBuf + Send>;

fn default_alloc() -> BufAlloc {
    Box::new(IoBuf::alloc)
}

/// A hasher for the small set of nexus ids (already unique integers).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | *b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// What a multi-step command needs from the range lock before it starts.
#[derive(Debug)]
pub(crate) enum Need {
    None,
    /// A write of these `(lba, blocks)` ranges.
    Shared(Vec<(Lba, u64)>),
    /// A write of one range (the common case, without a vector).
    One(Lba, u64),
    /// An atomic read-modify-write of `[lba, lba+blocks)`.
    Exclusive(Lba, u64),
}

#[derive(Debug)]
enum Adm {
    None,
    Fast,
    Grant(RangeGrant),
}

/// How many pieces of a streamed read may be read ahead of the one going out.
const STREAM_WINDOW: usize = 4;

/// Where an op's bdev I/O tag keeps what the op table needs back, in riser-reactor's one tag
/// layout: the op's slot, and a piece number (a streamed read's piece, read back to put the
/// piece in order; a streamed write's piece + 1, never read back) in the route field. No
/// generation: an op's slot is taken again only once every I/O of the op is back. The top 16
/// bits are the shared bdev channel's ([`riser_bdev::channel::ROUTE`]); a piece keeps its low
/// 16 bits, enough for [`STREAM_WINDOW`]'s ring.
const OP_TAG: TagLayout = TagLayout::low(32, 0, 16);

/// The tag of an I/O of the op in `slot`, for `piece`.
fn op_tag(slot: usize, piece: u64) -> u64 {
    OP_TAG.encode(Tag { slot: slot as u32, gen: 0, route: piece as u32 })
}

/// A READ that goes out in pieces ([`LunChannel::set_stream_chunk`]): each piece is read
/// into its own buffer, taken from the budget when the piece is submitted, and handed up
/// (in order) as soon as it and the pieces before it are in, so a READ of any size holds
/// at most [`STREAM_WINDOW`] pieces of memory.
pub(crate) struct StreamRead {
    lba: Lba,
    /// Bytes to deliver (EDTL or the transfer length, the smaller).
    ret_len: usize,
    /// Blocks read (whole blocks covering `ret_len`).
    blocks: u64,
    chunk_blocks: u64,
    /// Pieces submitted, and delivered (in order).
    next: u64,
    delivered: u64,
    /// Pieces read but not yet delivered (a later one finished first), by piece % window.
    ready: [Option<IoBuf>; STREAM_WINDOW],
    /// The place in the queue for budgeted memory while the next piece waits for it.
    waiter: Option<Waiter>,
}

impl StreamRead {
    fn pieces(&self) -> u64 {
        self.blocks.div_ceil(self.chunk_blocks)
    }
}

/// A plain WRITE whose data is asked for piece by piece ([`DataOut::Streamed`]): the
/// next piece is asked for when the last one starts being written, and each is written as
/// it comes (one write at a time, each admitted by the range lock for its own blocks), so a
/// WRITE of any size holds at most two pieces of memory: one being written, one being
/// fetched (or waiting for its turn).
pub(crate) struct StreamWrite {
    lba: Lba,
    blocks: u64,
    chunk_blocks: u64,
    fua: bool,
    /// Pieces asked for, and written.
    asked: u64,
    written: u64,
    /// A piece whose data is in, waiting for the one being written (or for admission).
    pending: Option<(u64, IoBuf)>,
    /// The range admission of the piece being written (`Adm::None`: none is).
    adm: Adm,
    writing: bool,
}

impl StreamWrite {
    fn pieces(&self) -> u64 {
        self.blocks.div_ceil(self.chunk_blocks)
    }

    /// Waiting on the initiator alone (a piece asked for, nothing to write meanwhile).
    fn idle(&self) -> bool {
        !self.writing && self.pending.is_none() && self.asked > self.written
    }
}

/// The block-level work of a command.
pub(crate) enum Job {
    ReadStream(Box<StreamRead>),
    WriteStream(Box<StreamWrite>),
    Read {
        lba: Lba,
        blocks: u64,
        ret_len: usize,
        /// The read buffer, taken from the budget before the job starts.
        buf: Option<IoBuf>,
        /// The job's place in the queue for budgeted memory while it waits.
        waiter: Option<Waiter>,
    },
    Write {
        lba: Lba,
        blocks: u64,
        buf: Option<IoBuf>,
        /// The CDB's FUA bit: durable before GOOD.
        fua: bool,
    },
    /// WRITE AND VERIFY: write, then read back and compare (`check` when BYTCHK=1).
    WriteVerify {
        lba: Lba,
        blocks: u64,
        buf: Option<IoBuf>,
        written: Option<IoBuf>,
        check: bool,
    },
    Flush {
        lba: Lba,
        blocks: u64,
    },
    /// UNMAP descriptors, or WRITE SAME of zeros with UNMAP (deallocate, reads zeros).
    Unmap {
        ranges: Vec<(Lba, u64)>,
    },
    WriteZeroes {
        lba: Lba,
        blocks: u64,
    },
    WriteSame {
        next: Lba,
        end: Lba,
        pattern: Vec<u8>,
        buf: Option<IoBuf>,
    },
    /// VERIFY with BYTCHK 01b (`expect` is the whole range) or 11b (one block repeated).
    Compare {
        lba: Lba,
        blocks: u64,
        expect: IoBuf,
        repeat_block: bool,
    },
    /// COMPARE AND WRITE and ORWRITE: read, combine with the Data-Out buffer, write.
    Rmw(Rmw),
    /// COMPARE AND WRITE done by a device that compares and writes atomically itself
    /// (RBD: atomic in the cluster, across gateways): `buf` is the verify then the write instance.
    DeviceCaw { lba: Lba, blocks: u64, buf: Option<IoBuf> },
    /// GET LBA STATUS: read window after window from the starting LBA and report runs of
    /// zeroed (deallocated) blocks; `lba`/`blocks` is the window being read.
    LbaStatus {
        lba: Lba,
        blocks: u64,
        alloc: usize,
        runs: LbaRuns,
        scanned: u64,
    },
    /// EXTENDED COPY: segments copied one chunk at a time (read, then write).
    Copy(CopyJob),
    /// SANITIZE: the whole medium, one chunk at a time.
    Sanitize(SanitizeJob),
    /// Work running on another thread (PERSISTENT RESERVE OUT on the `pr::work` pool: the
    /// APTPL file's write, a device's shared state): counted as one I/O in flight until
    /// `poll` finds its result.
    Deferred(Arc<crate::pr::shared::Deferred>),
}

pub(crate) struct SanitizeJob {
    op: SanitizeOp,
    ause: bool,
    /// IMMED: GOOD was returned when the operation started.
    immed: bool,
    /// Current pass, and the first block not yet submitted in it.
    pass: u8,
    next: Lba,
    /// Where the chunk in flight ends (recorded in the LUN state once it is written).
    done_to: Lba,
    rng: sanitize::Rng,
    /// The chunk buffer, reused while its size fits, and the pass it holds data for
    /// (overwrite patterns differ between passes with INVERT).
    buf: Option<IoBuf>,
    buf_pass: Option<u8>,
}

pub(crate) struct CopyJob {
    segments: Vec<Segment>,
    /// Current segment and blocks of it already copied.
    idx: usize,
    pos: u64,
    /// Blocks of the chunk in flight.
    chunk: u64,
    writing: bool,
    copied: u64,
    /// Where to record the outcome for RECEIVE COPY RESULTS.
    record: Option<(Arc<str>, u8)>,
}

struct Op {
    tag: u64,
    nexus_id: u64,
    edtl: u32,
    xfer: u64,
    dsense: bool,
    aborted: bool,
    inflight: u32,
    err: Option<CmdError>,
    need: Need,
    adm: Adm,
    begun_exclusive: bool,
    started: bool,
    /// The task's result was already reported (a SANITIZE with IMMED, or one whose task was
    /// aborted): the operation goes on and reports nothing when it ends.
    detached: bool,
    job: Job,
}

/// How a command handler answers.
// Moved once from the handler to the channel, never stored: boxing the Job would add an
// allocation per command.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Action {
    /// Data-in produced by emulation, before truncation to the allocation length.
    Data(Vec<u8>, usize),
    Good,
    Job(Need, Job),
}

/// Per-task facts a handler fills in.
pub(crate) struct Ctx<'a> {
    lun: &'a Arc<Lun>,
    nexus: &'a Arc<Nexus>,
    cdb: Cdb,
    edtl: u32,
    /// The command's SCSI transfer length in bytes (for the residual).
    xfer: u64,
    /// The write data is asked for piece by piece ([`DataOut::Streamed`]).
    data_later: bool,
}

/// Runs SCSI tasks for one LUN on one reactor. Not shared between threads.
pub struct LunChannel {
    lun: Arc<Lun>,
    /// The reactor thread's channel to the LUN's device, shared with the thread's other
    /// connections to it.
    io: riser_bdev::SharedChannel,
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    waiting: VecDeque<usize>,
    /// Events for the next poll, in the order they happened: results, read pieces, and the
    /// wants of streamed writes.
    done: Vec<TaskEvent>,
    comps: Vec<IoCompletion>,
    counter: Arc<FastCounter>,
    seen: IdSet,
    /// The nexus `seen` was last found to hold: a channel serves one connection's nexus,
    /// so the set is looked up once, not per command.
    last_seen: Option<u64>,
    alloc: BufAlloc,
    active: usize,
    /// Where read buffers come from, under the budget (the global pool; tests give their own).
    pool: &'static Pool,
    /// What the connection holds of the budget, reads and writes.
    account: Account,
    /// Slots of [`Job::Deferred`] ops not finished yet.
    deferred: Vec<usize>,
    /// Reads larger than this many bytes stream in pieces of this size (0: never).
    stream_chunk: usize,
    /// Slots of streamed reads waiting for budget for their next piece, and of streamed
    /// writes whose piece waits for range admission.
    pumping: Vec<usize>,
    /// Streamed writes among the ops.
    write_streams: usize,
    /// The initiator's rate limits on this LUN, if it has any, with the generation of the
    /// LUN's table they were looked up in, and this channel's share of them.
    qos: Option<Arc<riser_bdev::qos::Qos>>,
    qos_generation: u64,
    throttle: riser_bdev::qos::Throttle,
}

impl Drop for LunChannel {
    /// A channel dropped with commands still in flight gives back their range admissions,
    /// so that other reactors' writes and atomic commands are not held up forever.
    fn drop(&mut self) {
        if self.ops.iter().any(|o| {
            matches!(
                o,
                Some(Op {
                    job: Job::Sanitize(_),
                    ..
                })
            )
        }) {
            // A sanitize operation does not end with its executor (SBC-3 4.11): leave it
            // for the next channel of this LUN to take over from where it got.
            let mut st = self.lun.lock();
            if let SanitizeState::Running { owned, .. } = &mut st.sanitize {
                *owned = false;
                self.lun
                    .sanitize_orphan
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        }
        for mut o in self.ops.iter_mut().filter_map(|o| o.take()) {
            // A streamed write holds the admission of the piece being written itself.
            if let Job::WriteStream(j) = &mut o.job {
                match std::mem::replace(&mut j.adm, Adm::None) {
                    Adm::Fast => self.lun.ranges.fast_done(&self.counter),
                    Adm::Grant(g) => self.lun.ranges.release(g),
                    Adm::None => {}
                }
            }
            match o.adm {
                Adm::Fast => self.lun.ranges.fast_done(&self.counter),
                Adm::Grant(g) => self.lun.ranges.release(g),
                Adm::None if o.begun_exclusive => self.lun.ranges.cancel_exclusive(),
                Adm::None => {}
            }
        }
        self.lun.ranges.unregister_counter(&self.counter);
    }
}

fn bdev_error(kind: IoKind, e: &BdevError) -> CmdError {
    match e {
        BdevError::OutOfRange { .. } => CmdError::lba_out_of_range(),
        BdevError::Unsupported(_) => CmdError::invalid_opcode(),
        BdevError::Miscompare { offset } => CmdError::miscompare(*offset),
        // A backing store that cannot be reached: a path error (SPC LOGICAL UNIT COMMUNICATION FAILURE).
        BdevError::Unavailable(_) => CmdError::check(SenseKey::HardwareError, Asc::new(0x08, 0x00)),
        // This gateway was fenced by the others (issue 23): NOT READY, LOGICAL UNIT NOT
        // ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE, which multipath takes for a path
        // failure and retries through another gateway (HARDWARE ERROR it would fail upward).
        BdevError::Fenced(_) => CmdError::check(SenseKey::NotReady, Asc::new(0x04, 0x0C)),
        BdevError::Io(_) => match kind {
            IoKind::Read => CmdError::check(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR),
            _ => CmdError::check(SenseKey::MediumError, Asc::WRITE_ERROR),
        },
        _ => CmdError::internal(),
    }
}

impl Op {
    /// Counts a bdev completion: one I/O fewer in flight, its error kept if it is the first.
    fn count_completion(&mut self, c: &IoCompletion) {
        self.inflight = self.inflight.saturating_sub(1);
        if let Err(e) = &c.result {
            if self.err.is_none() {
                self.err = Some(bdev_error(c.kind, e));
            }
        }
    }
}

/// Index of the first differing byte.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b.iter()).position(|(x, y)| x != y)
}

impl LunChannel {
    /// Opens the LUN's bdev on the calling reactor.
    pub fn new(lun: Arc<Lun>) -> LunChannel {
        LunChannel::with_allocator(lun, default_alloc())
    }

    /// Like [`new`](Self::new), with the buffers for data-in and bdev I/O coming from
    /// `alloc` (e.g. registered memory for iSER).
    /// Takes read buffers from `pool` instead of the global one (tests).
    pub fn set_pool(&mut self, pool: &'static Pool) {
        self.pool = pool;
    }

    /// Charges read buffers to `account` (the connection's): a connection that holds
    /// budgeted memory takes at most its share of the budget (riser-buf, "Fair shares"), so
    /// a streamed read's pieces the initiator does not take pin no more than that.
    pub fn set_account(&mut self, account: Account) {
        self.account = account;
    }

    pub fn with_allocator(lun: Arc<Lun>, alloc: BufAlloc) -> LunChannel {
        let io = riser_bdev::SharedChannel::open(lun.bdev());
        let counter = lun.ranges.register_counter();
        LunChannel {
            lun,
            io,
            ops: Vec::new(),
            free: Vec::new(),
            waiting: VecDeque::new(),
            done: Vec::new(),
            comps: Vec::new(),
            counter,
            seen: IdSet::default(),
            last_seen: None,
            alloc,
            active: 0,
            pool: Pool::global(),
            account: Account::new(),
            deferred: Vec::new(),
            stream_chunk: 0,
            pumping: Vec::new(),
            write_streams: 0,
            qos: None,
            qos_generation: 0,
            throttle: Default::default(),
        }
    }

    /// Streams READs larger than `bytes` (rounded down to whole blocks, at least one) in
    /// pieces of that size: each piece comes out of [`poll`](Self::poll) as a
    /// [`TaskEvent::Data`] as soon as it (and every piece before it) is read, and the last
    /// one in the task's [`TaskEvent::Done`]. `None` (the default): every READ returns its
    /// data whole, in one buffer.
    ///
    /// The same size cuts streamed WRITEs ([`DataOut::Streamed`]) into the pieces their
    /// data is asked for in ([`TaskEvent::Want`]).
    pub fn set_stream_chunk(&mut self, bytes: Option<usize>) {
        self.stream_chunk = bytes.unwrap_or(0);
    }

    /// Moves the events already queued into `out`, without polling the device (tests).
    #[cfg(test)]
    pub(crate) fn take_events(&mut self, out: &mut Vec<TaskEvent>) {
        out.append(&mut self.done);
    }

    /// Data for a streamed write: the command's bytes from `offset`, as asked for by a
    /// [`TaskEvent::Want`]. Data for a task that is gone (aborted, failed) or not asked for is
    /// dropped.
    pub fn write_data(&mut self, tag: u64, offset: u32, buf: IoBuf) {
        let bs = self.lun.block_size() as u64;
        let Some(slot) = self.stream_slot(tag) else {
            log::debug!("data for task {tag:#x}, which waits for none: dropped");
            return;
        };
        let Some(o) = self.ops[slot].as_mut() else { return };
        let Job::WriteStream(j) = &mut o.job else { return };
        let piece = j.asked.wrapping_sub(1);
        let want_off = piece * j.chunk_blocks * bs;
        if o.err.is_some() {
            return;
        }
        if j.asked == 0 || j.pending.is_some() || j.written > piece || offset as u64 != want_off {
            // Not what was asked for: the command cannot complete as sent; fail it rather
            // than wait forever for the piece it needs.
            log::error!("task {tag:#x}: write data at offset {offset} not asked for (piece {piece} at {want_off} is): the command fails");
            o.err = Some(CmdError::internal());
            if o.inflight == 0 {
                self.pumping.retain(|s| *s != slot);
                self.finish(slot);
            }
            return;
        }
        j.pending = Some((piece, buf));
        self.stream_write_next(slot);
    }

    /// The slot of task `tag` when it is a streamed write still taking data.
    fn stream_slot(&self, tag: u64) -> Option<usize> {
        self.ops.iter().position(|o| matches!(o, Some(o) if o.tag == tag && !o.aborted && !o.detached && matches!(o.job, Job::WriteStream(_))))
    }

    /// Whether task `tag` is a streamed write of this channel still taking data (see
    /// [`write_data`](Self::write_data)).
    pub(crate) fn takes_data(&self, tag: u64) -> bool {
        self.stream_slot(tag).is_some()
    }

    /// Asks for the next piece of a streamed write's data.
    pub(super) fn ask_piece(&mut self, slot: usize) {
        let bs = self.lun.block_size() as u64;
        let lun = self.lun.id();
        let Some(Op { job: Job::WriteStream(j), tag, .. }) = self.ops[slot].as_mut() else { return };
        let first = j.asked * j.chunk_blocks;
        let n = (j.blocks - first).min(j.chunk_blocks);
        j.asked += 1;
        self.done.push(TaskEvent::Want(DataWant { tag: *tag, lun, offset: (first * bs) as u32, len: (n * bs) as u32 }));
    }

    /// Writes a streamed write's pending piece if none is being written and the range lock
    /// admits it (else it waits in `pumping`).
    pub(super) fn stream_write_next(&mut self, slot: usize) {
        let Some(Op { job: Job::WriteStream(j), .. }) = self.ops[slot].as_mut() else { return };
        if j.writing {
            return;
        }
        let Some((piece, _)) = &j.pending else { return };
        let first = piece * j.chunk_blocks;
        let n = (j.blocks - first).min(j.chunk_blocks);
        let lba = j.lba + first;
        let adm = match self.lun.ranges.admit_write(&self.counter, &[(lba, n)]) {
            WriteAdmission::Fast => Adm::Fast,
            WriteAdmission::Registered(g) => Adm::Grant(g),
            WriteAdmission::Wait => {
                if !self.pumping.contains(&slot) {
                    self.pumping.push(slot);
                }
                return;
            }
        };
        let Some(Op { job: Job::WriteStream(j), .. }) = self.ops[slot].as_mut() else { return };
        let Some((piece, buf)) = j.pending.take() else { return };
        j.adm = adm;
        j.writing = true;
        // While this piece is written the next one is fetched: one piece writing, one
        // coming in (then pending until this one is done).
        let more = j.asked < j.pieces();
        self.submit_tagged(slot, op_tag(slot, piece + 1), IoKind::Write, lba, n, Some(buf));
        if more {
            self.ask_piece(slot);
        }
    }

    /// A streamed write's piece is written: release its admission, then the next piece, or
    /// the end.
    pub(super) fn stream_write_done(&mut self, slot: usize, c: IoCompletion) {
        let Some(o) = self.ops.get_mut(slot).and_then(|o| o.as_mut()) else { return };
        o.count_completion(&c);
        let Job::WriteStream(j) = &mut o.job else { return };
        j.writing = false;
        j.written += 1;
        match std::mem::replace(&mut j.adm, Adm::None) {
            Adm::Fast => self.lun.ranges.fast_done(&self.counter),
            Adm::Grant(g) => self.lun.ranges.release(g),
            Adm::None => {}
        }
        let Some(o) = self.ops.get_mut(slot).and_then(|o| o.as_mut()) else { return };
        let Job::WriteStream(j) = &o.job else { return };
        if o.aborted || o.err.is_some() || j.written == j.pieces() {
            // A piece still being fetched is the iSCSI layer's to drop.
            self.pumping.retain(|s| *s != slot);
            return self.finish(slot);
        }
        self.stream_write_next(slot);
    }

    pub fn lun(&self) -> &Arc<Lun> {
        &self.lun
    }

    /// Tasks in flight, plus the events waiting for `poll` (results, and a streamed read's
    /// pieces and a streamed write's wants not taken yet).
    pub fn outstanding(&self) -> usize {
        self.active + self.done.len()
    }

    /// Whether `poll` has work to do (results to return, I/O in flight, or tasks waiting
    /// for a range lock): a reactor in adaptive mode should keep polling while true.
    pub fn busy(&self) -> bool {
        if !self.done.is_empty() {
            return true;
        }
        if self.active == 0 {
            return false;
        }
        // Every task left waits for device I/O whose completion wakes the reactor by itself
        // (RBD: librbd's eventfd) or for the initiator's data: nothing to poll for. A reactor
        // spinning through a Ceph write's milliseconds took the CPU the cluster needed.
        if self.waiting.is_empty() && self.pumping.is_empty() && self.deferred.is_empty() && !self.io.needs_poll() {
            return false;
        }
        // Wants not yet taken are among the events counted by `outstanding`.
        let work = self.outstanding();
        if self.write_streams == 0 {
            return work > 0;
        }
        // Streamed writes waiting for the initiator's data are not work (looked for only
        // while there are streamed writes: busy is asked every pass).
        let waiting_on_initiator = self
            .ops
            .iter()
            .filter(|o| matches!(o, Some(Op { job: Job::WriteStream(j), .. }) if j.idle()))
            .count();
        work > waiting_on_initiator
    }

    /// Forgets a nexus whose session ended (frees the per-nexus cache entry).
    pub fn forget_nexus(&mut self, nexus: &Nexus) {
        self.seen.remove(&nexus.id);
        if self.last_seen == Some(nexus.id) {
            self.last_seen = None;
        }
    }

    /// Starts a task. Its result comes from a later [`poll`](Self::poll). REPORT LUNS is
    /// answered at target level (by a [`DeviceChannel`](crate::DeviceChannel)); a LUN
    /// channel refuses it as an invalid operation code.
    pub fn submit(&mut self, task: ScsiTask) {
        if self.lun.initiator_qos.generation() != self.qos_generation {
            self.find_qos(&task.nexus.initiator_name);
        }
        let lun = self.lun.clone();
        let dsense = lun.mode_bits() & MODE_DSENSE != 0;
        let tag = task.tag;
        let edtl = task.edtl;
        let nexus_id = task.nexus.id;
        let mut ctx = Ctx {
            lun: &lun,
            nexus: task.nexus,
            cdb: task.cdb,
            edtl,
            xfer: 0,
            data_later: task.data_out.is_streamed(),
        };
        let data_out = match task.data_out {
            DataOut::Whole(b) => Some(b),
            DataOut::None | DataOut::Streamed => None,
        };
        let action = self.dispatch(&mut ctx, data_out);
        let xfer = ctx.xfer;
        match action {
            Ok(Action::Data(mut v, alloc_len)) => {
                v.truncate(alloc_len);
                let n = v.len().min(edtl as usize);
                let residual = Residual::compute(v.len() as u64, edtl);
                v.truncate(n);
                let buf = Self::vec_buf(v);
                self.done.push(TaskEvent::Done(ScsiResult {
                    data_in: if n > 0 { Some(buf) } else { None },
                    data_len: n,
                    ..ScsiResult::new(tag, Status::Good, residual)
                }));
            }
            Ok(Action::Good) => self.finish_now(tag, edtl, xfer, Ok(Status::Good), dsense),
            Err(e) => self.finish_now(tag, edtl, xfer, Err(e), dsense),
            Ok(Action::Job(need, job)) => {
                let immed = matches!(&job, Job::Sanitize(j) if j.immed);
                if immed {
                    // SANITIZE with IMMED: GOOD once the operation is validated and begun;
                    // its progress is reported by REQUEST SENSE (SBC-3 4.11).
                    self.finish_now(tag, edtl, xfer, Ok(Status::Good), dsense);
                }
                // Made in its slot (an op is large: not built here and moved there).
                self.add_op_with(|| Op {
                    tag,
                    nexus_id,
                    edtl,
                    xfer,
                    dsense,
                    aborted: false,
                    inflight: 0,
                    err: None,
                    need,
                    adm: Adm::None,
                    begun_exclusive: false,
                    started: false,
                    detached: immed,
                    job,
                });
            }
        }
    }

    /// Stores a new op and tries to start it.
    fn add_op(&mut self, opr: Op) {
        self.add_op_with(|| opr)
    }

    /// [`add_op`](Self::add_op) of the op `make` makes, made where it is stored.
    #[inline(always)]
    fn add_op_with(&mut self, make: impl FnOnce() -> Op) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.ops[s] = Some(make());
                s
            }
            None => {
                self.ops.push(Some(make()));
                self.ops.len() - 1
            }
        };
        if matches!(self.ops[slot], Some(Op { job: Job::WriteStream(_), .. })) {
            self.write_streams += 1;
        }
        self.active += 1;
        if !self.try_start(slot) {
            self.waiting.push_back(slot);
        }
    }

    /// Takes over a sanitize operation whose channel went away (see [`Lun::sanitize_orphan`]).
    fn adopt_sanitize(&mut self) {
        let lun = self.lun.clone();
        let job = {
            let mut st = lun.lock();
            lun.sanitize_orphan
                .store(false, std::sync::atomic::Ordering::Release);
            match &mut st.sanitize {
                SanitizeState::Running {
                    op,
                    ause,
                    pass,
                    next,
                    owned,
                } if !*owned => {
                    *owned = true;
                    SanitizeJob {
                        op: op.clone(),
                        ause: *ause,
                        immed: true,
                        pass: *pass,
                        next: *next,
                        done_to: *next,
                        rng: sanitize::Rng::new(),
                        buf: None,
                        buf_pass: None,
                    }
                }
                _ => return,
            }
        };
        let n = lun.num_blocks();
        self.add_op(Op {
            tag: u64::MAX,
            nexus_id: 0,
            edtl: 0,
            xfer: 0,
            dsense: false,
            aborted: false,
            inflight: 0,
            err: None,
            need: Need::Exclusive(Lba::ZERO, n),
            adm: Adm::None,
            begun_exclusive: false,
            started: false,
            detached: true,
            job: Job::Sanitize(job),
        });
    }

    /// Moves the events of the tasks (pieces, wants, ends) into `out`; returns how many.
    pub fn poll(&mut self, out: &mut Vec<TaskEvent>) -> usize {
        if self
            .lun
            .sanitize_orphan
            .load(std::sync::atomic::Ordering::Acquire)
        {
            self.adopt_sanitize();
        }
        if self.active > 0 {
            if self.throttle.queued() > 0 {
                self.release_throttled();
            }
            let mut comps = std::mem::take(&mut self.comps);
            self.io.poll(&mut comps);
            for c in comps.drain(..) {
                let slot = OP_TAG.decode(c.tag).slot as usize;
                self.on_completion(slot, c);
            }
            self.comps = comps;
            if !self.pumping.is_empty() {
                for slot in std::mem::take(&mut self.pumping) {
                    if matches!(self.ops.get(slot), Some(Some(Op { job: Job::WriteStream(_), .. }))) {
                        self.stream_write_next(slot);
                    } else {
                        self.stream_pump(slot);
                    }
                }
            }
            if !self.deferred.is_empty() {
                self.poll_deferred();
            }
            let n = self.waiting.len();
            for _ in 0..n {
                let Some(slot) = self.waiting.pop_front() else {
                    break;
                };
                if !self.try_start(slot) {
                    self.waiting.push_back(slot);
                }
            }
        }
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }

    /// ABORT TASK: aborts the task `tag` of `nexus`. Returns whether it was found. A task
    /// whose bdev I/O is in flight is reported ([`TaskEvent::Aborted`]) once the I/O
    /// completes; one not started yet is reported at the next poll.
    pub fn abort_task(&mut self, nexus: &Nexus, tag: u64) -> bool {
        self.abort_where(|o| o.nexus_id == nexus.id && o.tag == tag) > 0
    }

    /// ABORT TASK SET / CLEAR TASK SET / I_T nexus loss: aborts every task of `nexus`.
    pub fn abort_nexus(&mut self, nexus: &Nexus) -> usize {
        self.abort_where(|o| o.nexus_id == nexus.id)
    }

    /// LOGICAL UNIT RESET (on every reactor) or CLEAR TASK SET for all: aborts every task.
    pub fn abort_all(&mut self) -> usize {
        self.abort_where(|_| true)
    }

    fn abort_where(&mut self, f: impl Fn(&Op) -> bool) -> usize {
        let mut n = 0;
        // Tasks that already completed (results waiting for the next poll) are not
        // touched: they are reported normally, as tasks that finished before the abort.
        for slot in 0..self.ops.len() {
            // A detached op has no task any more (its tag may already name a new one).
            let hit = matches!(&self.ops[slot], Some(o) if !o.aborted && !o.detached && f(o));
            if !hit {
                continue;
            }
            n += 1;
            if let Some(o) = self.ops[slot].as_mut() {
                if matches!(o.job, Job::Sanitize(_)) {
                    // The task goes, the sanitize operation does not (SBC-3 4.11: it
                    // continues through aborts and resets).
                    o.detached = true;
                    self.done.push(TaskEvent::Aborted { tag: o.tag });
                    continue;
                }
                o.aborted = true;
                if o.inflight == 0 {
                    self.waiting.retain(|s| *s != slot);
                    self.pumping.retain(|s| *s != slot);
                    self.finish(slot);
                }
            }
        }
        n
    }

    // ----------------------------------------------------------------------------
    // Results

    fn vec_buf(v: Vec<u8>) -> IoBuf {
        IoBuf::from(v)
    }

    fn finish_now(&mut self, tag: u64, edtl: u32, xfer: u64, r: CmdResult<Status>, dsense: bool) {
        let (status, sense) = match r {
            Ok(s) => (s, None),
            Err(e) => (e.status, e.sense.map(|s| s.encode(dsense))),
        };
        self.done.push(TaskEvent::Done(ScsiResult {
            sense,
            ..ScsiResult::new(tag, status, Residual::compute(xfer, edtl))
        }));
    }

    /// Completes the op in `slot` (releasing its range admission) with its error, its
    /// abort, or `data`.
    fn complete(&mut self, slot: usize, data: Option<(IoBuf, usize)>) {
        self.complete_at(slot, data, 0)
    }

    /// [`complete`](Self::complete) with the data's place in the task's data (a streamed
    /// read's last piece).
    fn complete_at(&mut self, slot: usize, data: Option<(IoBuf, usize)>, data_offset: usize) {
        // What the end needs is read in place, then the op is dropped where it lies (not
        // moved out of the table whole).
        let Some(o) = self.ops[slot].as_mut() else {
            return;
        };
        let (tag, xfer, edtl, dsense) = (o.tag, o.xfer, o.edtl, o.dsense);
        let (detached, aborted, begun_exclusive) = (o.detached, o.aborted, o.begun_exclusive);
        // Usually no error and no admission (a read): nothing to move out then.
        let mut err = if o.err.is_some() { o.err.take() } else { None };
        let adm = if matches!(o.adm, Adm::None) { Adm::None } else { std::mem::replace(&mut o.adm, Adm::None) };
        let stream_gap = match &o.job {
            Job::WriteStream(j) => Some(j.asked > j.written + u64::from(j.writing) + u64::from(j.pending.is_some())),
            _ => None,
        };
        let sanitize_ause = match &o.job {
            Job::Sanitize(j) => Some(j.ause),
            _ => None,
        };
        self.ops[slot] = None;
        if let Some(gap) = stream_gap {
            self.write_streams -= 1;
            if gap {
                // It ends with a piece asked for and not in (an error, an abort): a want
                // still waiting for the next poll goes with it (one already taken is the
                // iSCSI layer's to drop when the end comes).
                self.done.retain(|e| !matches!(e, TaskEvent::Want(w) if w.tag == tag));
            }
        }
        if let Some(ause) = sanitize_ause {
            self.sanitize_ended(ause, err.is_some());
            if err.is_some() {
                err = Some(CmdError::sanitize_failed());
            }
        }
        self.free.push(slot);
        self.active -= 1;
        match adm {
            Adm::Fast => self.lun.ranges.fast_done(&self.counter),
            Adm::Grant(g) => self.lun.ranges.release(g),
            Adm::None => {
                if begun_exclusive {
                    self.lun.ranges.cancel_exclusive();
                }
            }
        }
        if detached {
            return;
        }
        if aborted {
            self.done.push(TaskEvent::Aborted { tag });
            return;
        }
        // Made in its place in the queue, then filled in (a result is large: not built here
        // and moved there).
        self.done.push(TaskEvent::Done(ScsiResult::new(tag, Status::Good, Residual::compute(xfer, edtl))));
        let Some(TaskEvent::Done(r)) = self.done.last_mut() else { return };
        if let Some(e) = err {
            r.status = e.status;
            r.sense = e.sense.map(|s| s.encode(dsense));
        } else if let Some((buf, len)) = data {
            let n = len.min((edtl as usize).saturating_sub(data_offset)).min(buf.as_slice().len());
            r.data_len = n;
            r.data_in = Some(buf);
            r.data_offset = data_offset;
        }
    }

    fn finish(&mut self, slot: usize) {
        self.complete(slot, None);
    }

    /// Finishes the [`Job::Deferred`] ops whose work is done.
    fn poll_deferred(&mut self) {
        let mut i = 0;
        while i < self.deferred.len() {
            let slot = self.deferred[i];
            let r = match self.ops.get(slot).and_then(|o| o.as_ref()) {
                Some(Op { job: Job::Deferred(d), .. }) => d.take(),
                // The op went (its channel state was reset): nothing to wait for.
                _ => Some(Ok(())),
            };
            let Some(r) = r else {
                i += 1;
                continue;
            };
            self.deferred.swap_remove(i);
            if let Some(Some(o)) = self.ops.get_mut(slot) {
                if !matches!(o.job, Job::Deferred(_)) {
                    continue;
                }
                o.inflight = 0;
                if let Err(e) = r {
                    o.err.get_or_insert(e);
                }
                self.finish(slot);
            }
        }
    }

    fn fail(&mut self, slot: usize, e: CmdError) {
        if let Some(o) = self.ops[slot].as_mut() {
            if o.err.is_none() {
                o.err = Some(e);
            }
            if o.inflight == 0 {
                self.finish(slot);
            }
        }
    }

    // ----------------------------------------------------------------------------
    // Bdev I/O

    fn submit_io(&mut self, slot: usize, kind: IoKind, lba: Lba, blocks: u64, buf: Option<IoBuf>) {
        self.submit_tagged(slot, slot as u64, kind, lba, blocks, buf)
    }

    /// Submits a bdev I/O for the op in `slot` under `tag` (the slot in its low 32 bits).
    fn submit_tagged(&mut self, slot: usize, tag: u64, kind: IoKind, lba: Lba, blocks: u64, buf: Option<IoBuf>) {
        // FUA: asked for by the CDB (WRITE with FUA, WRITE AND VERIFY), or every change to
        // the medium while the write cache is off (MODE SELECT WCE=0).
        let mut fua = false;
        if let Some(o) = self.ops[slot].as_mut() {
            o.inflight += 1;
            fua = matches!(kind, IoKind::Write | IoKind::Unmap | IoKind::WriteZeroes)
                && (self.lun.mode_bits() & MODE_WCE == 0
                    || matches!(o.job, Job::Write { fua: true, .. } | Job::WriteVerify { .. })
                    || matches!(&o.job, Job::WriteStream(j) if j.fua));
        }
        let io = BdevIo { kind, offset_blocks: lba, num_blocks: blocks, buf, tag, fua };
        match &self.qos {
            None => self.io.submit(io),
            Some(q) => {
                let bytes = blocks.saturating_mul(self.lun.block_size() as u64);
                let io_ch = &mut self.io;
                self.throttle.submit(q, io, bytes, riser_bdev::qos::now_ns(), &mut |io| io_ch.submit(io));
            }
        }
    }

    /// Looks the initiator's rate limits up again (the LUN's table changed); the I/Os
    /// waiting on limits that were removed go now.
    #[cold]
    fn find_qos(&mut self, initiator: &str) {
        self.qos_generation = self.lun.initiator_qos.generation();
        let found = self.lun.initiator_qos.find(initiator);
        if found.is_none() {
            self.release_throttled();
        }
        self.qos = found;
    }

    /// Submits the I/Os waiting on the initiator's limits that may go now (all of them once
    /// the limits are gone).
    fn release_throttled(&mut self) {
        if self.throttle.queued() == 0 {
            return;
        }
        let io_ch = &mut self.io;
        let now = riser_bdev::qos::now_ns();
        match &self.qos {
            Some(q) => self.throttle.release(q, now, &mut |io| io_ch.submit(io)),
            None => self.throttle.release(&riser_bdev::qos::Qos::default(), now, &mut |io| io_ch.submit(io)),
        }
    }

    fn buf(&mut self, len: usize) -> IoBuf {
        (self.alloc)(len)
    }
}
