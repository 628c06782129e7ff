//! The per-reactor executor: [`LunChannel`] runs SCSI tasks against one LUN through the
//! reactor's own bdev channel.
//!
//! `submit` never blocks and never completes a task by itself: emulated commands are
//! answered at the next [`poll`](LunChannel::poll), block commands when their bdev I/Os
//! complete. Multi-step commands (COMPARE AND WRITE, ORWRITE, WRITE AND VERIFY, WRITE
//! SAME, UNMAP with several descriptors, ...) are small state machines advanced by bdev
//! completions.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use riser_bdev::{BdevError, BdevIo, IoBuf, IoChannel, IoCompletion, IoKind};

use crate::cdb::{get_be16, get_be32, get_be64, op, put_be16, put_be32, put_be64, Cdb};
use crate::inquiry::{self, MAX_CAW_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_UNMAP_LBA_COUNT,
    MAX_WRITE_SAME_BLOCKS, WRITE_SAME_CHUNK_BYTES};
use crate::lock::{FastCounter, RangeGrant, WriteAdmission};
use crate::lun::{Lun, ATTN_RESERVED, ATTN_UA, MODE_DSENSE, MODE_NO_MEDIUM};
use crate::opcodes::{self, CmdDesc, F_MEDIUM, F_WRITE};
use crate::pr::{self, PrClass};
use crate::rw;
use crate::sense::{Asc, CmdError, CmdResult, Sense, SenseKey, Status};
use crate::task::{Nexus, Residual, ScsiResult, ScsiTask};
use crate::xcopy::{self, CopyStatus, Segment};

/// Allocates data buffers of exactly the requested length.
pub type BufAlloc = Box<dyn FnMut(usize) -> IoBuf + Send>;

fn default_alloc() -> BufAlloc {
    Box::new(|n| Box::new(vec![0u8; n]) as IoBuf)
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
enum Need {
    None,
    /// A write of these `(lba, blocks)` ranges.
    Shared(Vec<(u64, u64)>),
    /// An atomic read-modify-write of `[lba, lba+blocks)`.
    Exclusive(u64, u64),
}

#[derive(Debug)]
enum Adm {
    None,
    Fast,
    Grant(RangeGrant),
}

/// The block-level work of a command.
enum Job {
    Read { lba: u64, blocks: u64, ret_len: usize },
    Write { lba: u64, blocks: u64, buf: Option<IoBuf> },
    /// WRITE AND VERIFY: write, then read back and compare (`check` when BYTCHK=1).
    WriteVerify { lba: u64, blocks: u64, buf: Option<IoBuf>, written: Option<IoBuf>, check: bool },
    Flush { lba: u64, blocks: u64 },
    /// UNMAP descriptors, or WRITE SAME of zeros with UNMAP (deallocate, reads zeros).
    Unmap { ranges: Vec<(u64, u64)> },
    WriteZeroes { lba: u64, blocks: u64 },
    WriteSame { next: u64, end: u64, pattern: Vec<u8>, buf: Option<IoBuf> },
    /// VERIFY with BYTCHK 01b (`expect` is the whole range) or 11b (one block repeated).
    Compare { lba: u64, blocks: u64, expect: IoBuf, repeat_block: bool },
    /// COMPARE AND WRITE: `data` holds the verify then the write instance.
    CompareAndWrite { lba: u64, blocks: u64, data: IoBuf, writing: bool },
    OrWrite { lba: u64, blocks: u64, data: IoBuf, writing: bool },
    /// GET LBA STATUS: read a window and report runs of zeroed (deallocated) blocks.
    LbaStatus { lba: u64, blocks: u64, alloc: usize },
    /// EXTENDED COPY: segments copied one chunk at a time (read, then write).
    Copy(CopyJob),
}

struct CopyJob {
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
    job: Job,
}

/// How a command handler answers.
enum Action {
    /// Data-in produced by emulation, before truncation to the allocation length.
    Data(Vec<u8>, usize),
    Good,
    Status(Status),
    Job(Need, Job),
}

/// Per-task facts a handler fills in.
struct Ctx<'a> {
    lun: &'a Arc<Lun>,
    nexus: &'a Arc<Nexus>,
    cdb: Cdb,
    edtl: u32,
    /// The command's SCSI transfer length in bytes (for the residual).
    xfer: u64,
}

/// Runs SCSI tasks for one LUN on one reactor. Not shared between threads.
pub struct LunChannel {
    lun: Arc<Lun>,
    io: Box<dyn IoChannel>,
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    waiting: VecDeque<usize>,
    done: Vec<ScsiResult>,
    comps: Vec<IoCompletion>,
    counter: Arc<FastCounter>,
    seen: IdSet,
    alloc: BufAlloc,
    active: usize,
}

impl Drop for LunChannel {
    fn drop(&mut self) {
        self.lun.ranges.unregister_counter(&self.counter);
    }
}

fn bdev_error(kind: IoKind, e: &BdevError) -> CmdError {
    match e {
        BdevError::OutOfRange { .. } => CmdError::lba_out_of_range(),
        BdevError::Unsupported(_) => CmdError::invalid_opcode(),
        BdevError::Io(_) => match kind {
            IoKind::Read => CmdError::check(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR),
            _ => CmdError::check(SenseKey::MediumError, Asc::WRITE_ERROR),
        },
        _ => CmdError::internal(),
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
    pub fn with_allocator(lun: Arc<Lun>, alloc: BufAlloc) -> LunChannel {
        let io = lun.bdev().clone().open_channel();
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
            alloc,
            active: 0,
        }
    }

    pub fn lun(&self) -> &Arc<Lun> {
        &self.lun
    }

    /// Tasks submitted whose result has not been returned by `poll` yet.
    pub fn outstanding(&self) -> usize {
        self.active + self.done.len()
    }

    /// Whether `poll` has work to do (results to return, I/O in flight, or tasks waiting
    /// for a range lock): a reactor in adaptive mode should keep polling while true.
    pub fn busy(&self) -> bool {
        self.outstanding() > 0
    }

    /// Forgets a nexus whose session ended (frees the per-nexus cache entry).
    pub fn forget_nexus(&mut self, nexus: &Nexus) {
        self.seen.remove(&nexus.id);
    }

    /// Starts a task. Its result comes from a later [`poll`](Self::poll).
    pub fn submit(&mut self, task: ScsiTask) {
        let lun = self.lun.clone();
        let dsense = lun.mode_bits() & MODE_DSENSE != 0;
        let tag = task.tag;
        let edtl = task.edtl;
        let nexus_id = task.nexus.id;
        let mut ctx = Ctx { lun: &lun, nexus: &task.nexus, cdb: task.cdb, edtl, xfer: 0 };
        let action = self.dispatch(&mut ctx, task.data_out);
        let xfer = ctx.xfer;
        match action {
            Ok(Action::Data(mut v, alloc_len)) => {
                v.truncate(alloc_len);
                let n = v.len().min(edtl as usize);
                let residual = Residual::compute(v.len() as u64, edtl);
                v.truncate(n);
                let buf = self.into_buf(v);
                self.done.push(ScsiResult {
                    tag,
                    status: Status::Good,
                    sense: None,
                    data_in: if n > 0 { Some(buf) } else { None },
                    data_len: n,
                    residual,
                    aborted: false,
                });
            }
            Ok(Action::Good) => self.finish_now(tag, edtl, xfer, Ok(Status::Good), dsense),
            Ok(Action::Status(s)) => self.finish_now(tag, edtl, xfer, Ok(s), dsense),
            Err(e) => self.finish_now(tag, edtl, xfer, Err(e), dsense),
            Ok(Action::Job(need, job)) => {
                let opr = Op {
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
                    job,
                };
                let slot = match self.free.pop() {
                    Some(s) => {
                        self.ops[s] = Some(opr);
                        s
                    }
                    None => {
                        self.ops.push(Some(opr));
                        self.ops.len() - 1
                    }
                };
                self.active += 1;
                if !self.try_start(slot) {
                    self.waiting.push_back(slot);
                }
            }
        }
    }

    /// Moves finished tasks into `out`; returns how many.
    pub fn poll(&mut self, out: &mut Vec<ScsiResult>) -> usize {
        if self.active > 0 {
            let mut comps = std::mem::take(&mut self.comps);
            self.io.poll(&mut comps);
            for c in comps.drain(..) {
                let slot = c.tag as usize;
                self.on_completion(slot, c);
            }
            self.comps = comps;
            let n = self.waiting.len();
            for _ in 0..n {
                let Some(slot) = self.waiting.pop_front() else { break };
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
    /// whose bdev I/O is in flight is reported (with `aborted` set) once the I/O
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
        // Results not yet returned are withdrawn too... except they belong to tasks that
        // already completed: those are left to be reported normally.
        for slot in 0..self.ops.len() {
            let hit = matches!(&self.ops[slot], Some(o) if !o.aborted && f(o));
            if !hit {
                continue;
            }
            n += 1;
            if let Some(o) = self.ops[slot].as_mut() {
                o.aborted = true;
                if o.inflight == 0 {
                    self.waiting.retain(|s| *s != slot);
                    self.finish(slot);
                }
            }
        }
        n
    }

    // ----------------------------------------------------------------------------
    // Results

    fn into_buf(&mut self, v: Vec<u8>) -> IoBuf {
        Box::new(v)
    }

    fn finish_now(&mut self, tag: u64, edtl: u32, xfer: u64, r: CmdResult<Status>, dsense: bool) {
        let (status, sense) = match r {
            Ok(s) => (s, None),
            Err(e) => (e.status, e.sense.map(|s| s.encode(dsense))),
        };
        self.done.push(ScsiResult {
            tag,
            status,
            sense,
            data_in: None,
            data_len: 0,
            residual: Residual::compute(xfer, edtl),
            aborted: false,
        });
    }

    /// Completes the op in `slot` (releasing its range admission) with its error, its
    /// abort, or `data`.
    fn complete(&mut self, slot: usize, data: Option<(IoBuf, usize)>) {
        let Some(o) = self.ops[slot].take() else { return };
        self.free.push(slot);
        self.active -= 1;
        match o.adm {
            Adm::Fast => self.lun.ranges.fast_done(&self.counter),
            Adm::Grant(g) => self.lun.ranges.release(g),
            Adm::None => {
                if o.begun_exclusive {
                    self.lun.ranges.cancel_exclusive();
                }
            }
        }
        let mut r = ScsiResult {
            tag: o.tag,
            status: Status::Good,
            sense: None,
            data_in: None,
            data_len: 0,
            residual: Residual::compute(o.xfer, o.edtl),
            aborted: o.aborted,
        };
        if let Some(e) = o.err.filter(|_| !o.aborted) {
            r.status = e.status;
            r.sense = e.sense.map(|s| s.encode(o.dsense));
        } else if !o.aborted {
            if let Some((buf, len)) = data {
                let n = len.min(o.edtl as usize).min(buf.as_slice().len());
                r.data_len = n;
                r.data_in = Some(buf);
            }
        }
        self.done.push(r);
    }

    fn finish(&mut self, slot: usize) {
        self.complete(slot, None);
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

    fn submit_io(&mut self, slot: usize, kind: IoKind, lba: u64, blocks: u64, buf: Option<IoBuf>) {
        if let Some(o) = self.ops[slot].as_mut() {
            o.inflight += 1;
        }
        self.io.submit(BdevIo { kind, offset_blocks: lba, num_blocks: blocks, buf, tag: slot as u64 });
    }

    fn buf(&mut self, len: usize) -> IoBuf {
        (self.alloc)(len)
    }

    /// Tries to admit and start the op; false if it must wait for the range lock.
    fn try_start(&mut self, slot: usize) -> bool {
        let lun = self.lun.clone();
        let Some(o) = self.ops[slot].as_mut() else { return true };
        if o.started {
            return true;
        }
        match &o.need {
            Need::None => {}
            Need::Shared(ranges) => match lun.ranges.admit_write(&self.counter, ranges) {
                WriteAdmission::Fast => o.adm = Adm::Fast,
                WriteAdmission::Registered(g) => o.adm = Adm::Grant(g),
                WriteAdmission::Wait => return false,
            },
            Need::Exclusive(lba, n) => {
                if !o.begun_exclusive {
                    lun.ranges.begin_exclusive();
                    o.begun_exclusive = true;
                }
                match lun.ranges.try_exclusive(*lba, *n) {
                    Some(g) => o.adm = Adm::Grant(g),
                    None => return false,
                }
            }
        }
        o.started = true;
        self.start(slot);
        true
    }

    fn start(&mut self, slot: usize) {
        let bs = self.lun.block_size() as usize;
        let Some(o) = self.ops[slot].as_mut() else { return };
        match &mut o.job {
            Job::Read { lba, blocks, .. } => {
                let (lba, blocks) = (*lba, *blocks);
                let b = self.buf(blocks as usize * bs);
                self.submit_io(slot, IoKind::Read, lba, blocks, Some(b));
            }
            Job::Write { lba, blocks, buf } | Job::WriteVerify { lba, blocks, buf, .. } => {
                let (lba, blocks, b) = (*lba, *blocks, buf.take());
                self.submit_io(slot, IoKind::Write, lba, blocks, b);
            }
            Job::Flush { lba, blocks } => {
                let (lba, blocks) = (*lba, *blocks);
                self.submit_io(slot, IoKind::Flush, lba, blocks, None);
            }
            Job::Unmap { ranges } => {
                let ranges = std::mem::take(ranges);
                if ranges.is_empty() {
                    self.finish(slot);
                    return;
                }
                for (lba, n) in ranges {
                    self.submit_io(slot, IoKind::Unmap, lba, n, None);
                }
            }
            Job::WriteZeroes { lba, blocks } => {
                let (lba, blocks) = (*lba, *blocks);
                self.submit_io(slot, IoKind::WriteZeroes, lba, blocks, None);
            }
            Job::WriteSame { .. } => self.write_same_next(slot),
            Job::Copy(_) => self.copy_next(slot, None),
            Job::Compare { lba, blocks, .. }
            | Job::CompareAndWrite { lba, blocks, .. }
            | Job::OrWrite { lba, blocks, .. }
            | Job::LbaStatus { lba, blocks, .. } => {
                let (lba, blocks) = (*lba, *blocks);
                let b = self.buf(blocks as usize * bs);
                self.submit_io(slot, IoKind::Read, lba, blocks, Some(b));
            }
        }
    }

    /// Submits the next chunk of a WRITE SAME, or finishes it.
    fn write_same_next(&mut self, slot: usize) {
        let bs = self.lun.block_size() as u64;
        let chunk_blocks = (WRITE_SAME_CHUNK_BYTES / bs).max(1);
        let Some(o) = self.ops[slot].as_mut() else { return };
        let Job::WriteSame { next, end, pattern, buf } = &mut o.job else { return };
        if *next >= *end {
            self.finish(slot);
            return;
        }
        let n = (*end - *next).min(chunk_blocks);
        let lba = *next;
        *next += n;
        let want = (n * bs) as usize;
        let b = match buf.take() {
            Some(b) if b.as_slice().len() == want => b,
            _ => {
                let pattern = pattern.clone();
                let mut b = self.buf(want);
                for chunk in b.as_mut_slice().chunks_exact_mut(bs as usize) {
                    chunk.copy_from_slice(&pattern);
                }
                b
            }
        };
        self.submit_io(slot, IoKind::Write, lba, n, Some(b));
    }

    /// Advances an EXTENDED COPY: after a read, write the chunk to the destination; after
    /// a write (or at the start), read the next chunk.
    fn copy_next(&mut self, slot: usize, buf: Option<IoBuf>) {
        let bs = self.lun.block_size() as u64;
        let max_chunk = (inquiry::MAX_TRANSFER_BYTES / bs).max(1);
        let Some(o) = self.ops[slot].as_mut() else { return };
        let Job::Copy(j) = &mut o.job else { return };
        if let (false, Some(b)) = (j.writing, buf.as_ref()) {
            // The chunk was read: write it.
            let _ = b;
            let seg = j.segments[j.idx];
            let (lba, n) = (seg.dst + j.pos, j.chunk);
            j.writing = true;
            self.submit_io(slot, IoKind::Write, lba, n, buf);
            return;
        }
        if j.writing {
            j.writing = false;
            j.pos += j.chunk;
            j.copied += j.chunk;
            j.chunk = 0;
            if j.pos >= j.segments[j.idx].blocks {
                j.idx += 1;
                j.pos = 0;
            }
        }
        if j.idx >= j.segments.len() {
            if let Some(key) = j.record.take() {
                let status = CopyStatus { ok: true, segments_processed: j.idx as u16, blocks: j.copied };
                self.lun.lock().copies.by_list.insert(key, status);
            }
            self.finish(slot);
            return;
        }
        let seg = j.segments[j.idx];
        let n = (seg.blocks - j.pos).min(max_chunk);
        j.chunk = n;
        let lba = seg.src + j.pos;
        let b = self.buf((n * bs) as usize);
        self.submit_io(slot, IoKind::Read, lba, n, Some(b));
    }

    fn on_completion(&mut self, slot: usize, c: IoCompletion) {
        let Some(o) = self.ops.get_mut(slot).and_then(|o| o.as_mut()) else { return };
        o.inflight = o.inflight.saturating_sub(1);
        if let Err(e) = &c.result {
            if o.err.is_none() {
                o.err = Some(bdev_error(c.kind, e));
            }
        }
        if o.inflight > 0 {
            return;
        }
        if o.aborted || o.err.is_some() {
            self.finish(slot);
            return;
        }
        self.advance(slot, c.buf);
    }

    /// The op's outstanding I/O finished successfully: next step.
    fn advance(&mut self, slot: usize, buf: Option<IoBuf>) {
        let bs = self.lun.block_size() as usize;
        let Some(o) = self.ops[slot].as_mut() else { return };
        match &mut o.job {
            Job::Read { ret_len, .. } => {
                let n = *ret_len;
                match buf {
                    Some(b) => self.complete(slot, Some((b, n))),
                    None => self.fail(slot, CmdError::internal()),
                }
            }
            Job::Write { .. } | Job::Flush { .. } | Job::Unmap { .. } | Job::WriteZeroes { .. } => {
                self.finish(slot)
            }
            Job::WriteVerify { lba, blocks, written, check, .. } => {
                if written.is_none() && *check {
                    // Written: read back and compare (SBC-3 5.40 BYTCHK=1).
                    *written = buf;
                    let (lba, blocks) = (*lba, *blocks);
                    let b = self.buf(blocks as usize * bs);
                    self.submit_io(slot, IoKind::Read, lba, blocks, Some(b));
                } else if let (Some(w), Some(r)) = (written.as_ref(), buf.as_ref()) {
                    match first_difference(w.as_slice(), r.as_slice()) {
                        Some(off) => self.fail(slot, CmdError::miscompare(off as u64)),
                        None => self.finish(slot),
                    }
                } else {
                    self.finish(slot)
                }
            }
            Job::WriteSame { buf: keep, .. } => {
                *keep = buf;
                self.write_same_next(slot);
            }
            Job::Compare { expect, repeat_block, .. } => {
                let Some(r) = buf else { return self.fail(slot, CmdError::internal()) };
                let got = r.as_slice();
                let want = expect.as_slice();
                let diff = if *repeat_block {
                    got.chunks(bs)
                        .enumerate()
                        .find_map(|(i, blk)| first_difference(blk, want).map(|d| i * bs + d))
                } else {
                    first_difference(got, want)
                };
                match diff {
                    Some(off) => self.fail(slot, CmdError::miscompare(off as u64)),
                    None => self.finish(slot),
                }
            }
            Job::CompareAndWrite { lba, blocks, data, writing } => {
                if *writing {
                    return self.finish(slot);
                }
                let Some(mut r) = buf else { return self.fail(slot, CmdError::internal()) };
                let n = *blocks as usize * bs;
                let d = data.as_slice();
                // SBC-3 5.2: the INFORMATION field is the offset of the first differing
                // byte in the Data-Out buffer.
                if let Some(off) = first_difference(r.as_slice(), &d[..n]) {
                    return self.fail(slot, CmdError::miscompare(off as u64));
                }
                r.as_mut_slice().copy_from_slice(&d[n..2 * n]);
                *writing = true;
                let (lba, blocks) = (*lba, *blocks);
                self.submit_io(slot, IoKind::Write, lba, blocks, Some(r));
            }
            Job::OrWrite { lba, blocks, data, writing } => {
                if *writing {
                    return self.finish(slot);
                }
                let Some(mut r) = buf else { return self.fail(slot, CmdError::internal()) };
                for (x, y) in r.as_mut_slice().iter_mut().zip(data.as_slice()) {
                    *x |= *y;
                }
                *writing = true;
                let (lba, blocks) = (*lba, *blocks);
                self.submit_io(slot, IoKind::Write, lba, blocks, Some(r));
            }
            Job::Copy(_) => self.copy_next(slot, buf),
            Job::LbaStatus { lba, alloc, .. } => {
                let Some(r) = buf else { return self.fail(slot, CmdError::internal()) };
                let v = lba_status_data(*lba, r.as_slice(), bs);
                let alloc = *alloc;
                let mut v = v;
                v.truncate(alloc);
                let n = v.len();
                if let Some(o) = self.ops[slot].as_mut() {
                    o.xfer = n as u64;
                }
                let b = self.into_buf(v);
                self.complete(slot, Some((b, n)));
            }
        }
    }

    // ----------------------------------------------------------------------------
    // Dispatch

    /// Runs the checks every command goes through (unit attentions, reservations,
    /// medium) and the command's handler.
    fn dispatch(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let desc = opcodes::lookup(&ctx.cdb);
        let attn = lun.attn.load(std::sync::atomic::Ordering::Acquire);
        if attn != 0 || !self.seen.contains(&ctx.nexus.id) {
            self.slow_checks(ctx, &desc, attn)?;
        }
        let desc = desc?;
        if desc.flags & F_MEDIUM != 0 && lun.mode_bits() & MODE_NO_MEDIUM != 0 {
            return Err(CmdError::check(SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT));
        }
        self.handle(ctx, desc, data_out)
    }

    /// Unit attention and reservation checks, under the LUN lock (SAM-5 5.14, SPC-4 5.12).
    fn slow_checks(&mut self, ctx: &mut Ctx<'_>, desc: &CmdResult<&'static CmdDesc>, attn: u32) -> CmdResult<()> {
        let lun = ctx.lun;
        let key = ctx.nexus.key();
        let mut st = lun.lock();
        st.nexus(key);
        self.seen.insert(ctx.nexus.id);
        let opc = ctx.cdb.opcode();
        let exempt = matches!(opc, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE);
        if attn & ATTN_UA != 0 || !exempt {
            if !exempt {
                let n = st.nexus(key);
                if !n.ua.is_empty() {
                    let asc = n.ua.remove(0);
                    lun.refresh_attn(&st);
                    return Err(CmdError::check(SenseKey::UnitAttention, asc));
                }
            } else if opc == op::REPORT_LUNS {
                // Reporting the LUN inventory clears its change notice (SPC-4 6.33).
                st.nexus(key).ua.retain(|a| *a != Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
            }
            lun.refresh_attn(&st);
        }
        if attn & ATTN_RESERVED != 0 {
            if let Ok(d) = desc {
                if pr::conflicts(&st, key, class_of(d, &ctx.cdb)) {
                    return Err(CmdError::reservation_conflict());
                }
            }
        }
        Ok(())
    }

    fn handle(&mut self, ctx: &mut Ctx<'_>, desc: &'static CmdDesc, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun.clone();
        let cdb = ctx.cdb;
        let write_protected = desc.flags & F_WRITE != 0 && lun.write_protected();
        match cdb.opcode() {
            op::TEST_UNIT_READY => Ok(Action::Good),
            op::REQUEST_SENSE => self.request_sense(ctx),
            op::INQUIRY => {
                let v = inquiry::inquiry(&lun, ctx.nexus, &cdb)?;
                Ok(Action::Data(v, cdb.be16(3) as usize))
            }
            op::READ_CAPACITY10 => Ok(Action::Data(inquiry::read_capacity10(&lun, &cdb)?, 8)),
            op::SERVICE_ACTION_IN16 => match cdb.service_action() {
                op::SAI_READ_CAPACITY16 => {
                    Ok(Action::Data(inquiry::read_capacity16(&lun, &cdb)?, cdb.be32(10) as usize))
                }
                _ => self.get_lba_status(ctx),
            },
            op::MODE_SENSE6 => Ok(Action::Data(crate::mode::mode_sense(&lun, &cdb)?, cdb.u8(4) as usize)),
            op::MODE_SENSE10 => Ok(Action::Data(crate::mode::mode_sense(&lun, &cdb)?, cdb.be16(7) as usize)),
            op::MODE_SELECT6 | op::MODE_SELECT10 => {
                let len = if cdb.opcode() == op::MODE_SELECT6 { cdb.u8(4) as u64 } else { cdb.be16(7) as u64 };
                ctx.xfer = len;
                let p = param(&data_out, len, ctx.edtl);
                crate::mode::mode_select(&lun, ctx.nexus, &cdb, p)?;
                Ok(Action::Good)
            }
            op::REPORT_LUNS => {
                let v = crate::target::report_luns_data(&cdb, &[lun.id()])?;
                Ok(Action::Data(v, cdb.be32(6) as usize))
            }
            op::MAINTENANCE_IN => match cdb.service_action() {
                op::MI_REPORT_SUPPORTED_OPCODES => {
                    Ok(Action::Data(opcodes::report_supported_opcodes(&cdb)?, cdb.be32(6) as usize))
                }
                _ => Ok(Action::Data(report_target_port_groups(ctx.nexus, &cdb)?, cdb.be32(6) as usize)),
            },
            op::PERSISTENT_RESERVE_IN => Ok(Action::Data(pr::pr_in(&lun, &cdb)?, cdb.be16(7) as usize)),
            op::PERSISTENT_RESERVE_OUT => {
                let len = cdb.be32(5) as u64;
                ctx.xfer = len;
                let p = param(&data_out, len, ctx.edtl);
                pr::pr_out(&lun, ctx.nexus, &cdb, p)?;
                Ok(Action::Good)
            }
            op::RESERVE6 | op::RESERVE10 => {
                pr::reserve(&lun, ctx.nexus, &cdb)?;
                Ok(Action::Good)
            }
            op::RELEASE6 | op::RELEASE10 => {
                pr::release(&lun, ctx.nexus, &cdb)?;
                Ok(Action::Good)
            }
            op::START_STOP_UNIT => self.start_stop(ctx),
            op::PREVENT_ALLOW => {
                let prevent = cdb.u8(4) & 0x03;
                if prevent & 0x02 != 0 {
                    // Medium changer prevention is not applicable (SBC-3 5.13? / SPC-4 6.13).
                    return Err(CmdError::invalid_cdb(4, Some(1)));
                }
                let mut st = lun.lock();
                st.nexus(ctx.nexus.key()).prevent = prevent != 0 && lun.config().removable;
                Ok(Action::Good)
            }
            op::READ_DEFECT_DATA10 | op::READ_DEFECT_DATA12 => Ok(read_defect_data(&cdb)),
            op::READ6 | op::READ10 | op::READ12 | op::READ16 => self.read(ctx),
            op::WRITE6 | op::WRITE10 | op::WRITE12 | op::WRITE16 | op::WRITE_ATOMIC16 => {
                self.write(ctx, data_out, write_protected)
            }
            op::WRITE_VERIFY10 | op::WRITE_VERIFY12 | op::WRITE_VERIFY16 => {
                self.write(ctx, data_out, write_protected)
            }
            op::VERIFY10 | op::VERIFY12 | op::VERIFY16 => self.verify(ctx, data_out),
            op::PRE_FETCH10 | op::PRE_FETCH16 => {
                let b = rw::decode(&cdb);
                rw::check_range(&lun, b.lba, b.blocks)?;
                // Nothing to stage: the data is as close as it gets. SBC-3 5.9: CONDITION
                // MET when the range fits the cache.
                Ok(Action::Status(Status::ConditionMet))
            }
            op::SYNCHRONIZE_CACHE10 | op::SYNCHRONIZE_CACHE16 => {
                let b = rw::decode(&cdb);
                rw::check_range(&lun, b.lba, b.blocks)?;
                let (lba, blocks) = if b.lba == 0 && b.blocks == 0 { (0, 0) } else { (b.lba, b.blocks) };
                let blocks = if blocks == 0 && lba != 0 { lun.num_blocks() - lba } else { blocks };
                Ok(Action::Job(Need::None, Job::Flush { lba, blocks }))
            }
            op::WRITE_SAME10 | op::WRITE_SAME16 => self.write_same(ctx, data_out, write_protected),
            op::UNMAP => self.unmap(ctx, data_out, write_protected),
            op::COMPARE_AND_WRITE => self.compare_and_write(ctx, data_out, write_protected),
            op::EXTENDED_COPY => {
                let len = cdb.be32(10) as u64;
                ctx.xfer = len;
                let p = param(&data_out, len, ctx.edtl);
                let Some(plan) = xcopy::parse(&lun, &cdb, p)? else { return Ok(Action::Good) };
                if write_protected {
                    return Err(CmdError::write_protected());
                }
                let record = if plan.discard { None } else { Some((ctx.nexus.key().clone(), plan.list_id)) };
                if let Some(k) = &record {
                    // A new copy with this list identifier replaces older results.
                    lun.lock().copies.by_list.remove(k);
                }
                if plan.segments.is_empty() {
                    if let Some(k) = record {
                        let st = CopyStatus { ok: true, segments_processed: 0, blocks: 0 };
                        lun.lock().copies.by_list.insert(k, st);
                    }
                    return Ok(Action::Good);
                }
                let ranges = plan.segments.iter().map(|s| (s.dst, s.blocks)).collect();
                Ok(Action::Job(
                    Need::Shared(ranges),
                    Job::Copy(CopyJob {
                        segments: plan.segments,
                        idx: 0,
                        pos: 0,
                        chunk: 0,
                        writing: false,
                        copied: 0,
                        record,
                    }),
                ))
            }
            op::RECEIVE_COPY_RESULTS => {
                let v = xcopy::receive_copy_results(&lun, ctx.nexus.key(), &cdb)?;
                Ok(Action::Data(v, cdb.be32(10) as usize))
            }
            op::ORWRITE16 => self.orwrite(ctx, data_out, write_protected),
            _ => Err(CmdError::invalid_opcode()),
        }
    }

    // ----------------------------------------------------------------------------
    // Handlers

    /// REQUEST SENSE (SPC-4 6.29): reports (and clears) a pending unit attention, or
    /// NO SENSE; a removable LUN without medium reports NOT READY.
    fn request_sense(&mut self, ctx: &mut Ctx<'_>) -> CmdResult<Action> {
        let desc = ctx.cdb.u8(1) & 0x01 != 0;
        let lun = ctx.lun;
        let mut sense = Sense::new(SenseKey::NoSense, Asc::NO_ADDITIONAL_SENSE);
        {
            let mut st = lun.lock();
            let n = st.nexus(ctx.nexus.key());
            if !n.ua.is_empty() {
                let asc = n.ua.remove(0);
                sense = Sense::new(SenseKey::UnitAttention, asc);
            } else if lun.mode_bits() & MODE_NO_MEDIUM != 0 {
                sense = Sense::new(SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT);
            }
            lun.refresh_attn(&st);
        }
        let b = sense.encode(desc);
        Ok(Action::Data(b.as_slice().to_vec(), ctx.cdb.u8(4) as usize))
    }

    /// START STOP UNIT (SBC-3 5.25): riser's medium is always spinning. A power condition
    /// other than 0 is accepted and changes nothing (START and LOEJ are then ignored).
    /// LOEJ ejects (START=0) or loads (START=1) a removable medium unless an I_T nexus
    /// prevents removal (SBC-3 5.13); a fixed medium cannot be ejected.
    fn start_stop(&mut self, ctx: &mut Ctx<'_>) -> CmdResult<Action> {
        let cdb = ctx.cdb;
        let lun = ctx.lun;
        let pc = cdb.u8(4) >> 4;
        let loej = cdb.u8(4) & 0x02 != 0;
        let start = cdb.u8(4) & 0x01 != 0;
        if pc != 0 || !loej {
            return Ok(Action::Good);
        }
        if !lun.config().removable {
            return Err(CmdError::invalid_cdb(4, Some(1)));
        }
        let st = lun.lock();
        if Lun::removal_prevented(&st) {
            return Err(CmdError::illegal(Asc::MEDIUM_REMOVAL_PREVENTED));
        }
        lun.set_mode_bit(MODE_NO_MEDIUM, !start);
        Ok(Action::Good)
    }

    fn read(&mut self, ctx: &mut Ctx<'_>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let b = rw::decode(&cdb);
        let bs = lun.block_size() as u64;
        ctx.xfer = b.blocks * bs;
        rw::check_protect(&b)?;
        rw::check_transfer(lun, &cdb, b.blocks)?;
        rw::check_range(lun, b.lba, b.blocks)?;
        // Only what fits in EDTL is transferred (RFC 7143 11.4.5.2: the rest is residual).
        let want = (ctx.edtl as u64).min(b.blocks * bs);
        let blocks = want.div_ceil(bs);
        if blocks == 0 {
            return Ok(Action::Good);
        }
        Ok(Action::Job(Need::None, Job::Read { lba: b.lba, blocks, ret_len: want as usize }))
    }

    /// WRITE (6/10/12/16), WRITE ATOMIC (16) and WRITE AND VERIFY (10/12/16).
    fn write(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>, wp: bool) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let b = rw::decode(&cdb);
        let bs = lun.block_size() as u64;
        ctx.xfer = b.blocks * bs;
        rw::check_protect(&b)?;
        rw::check_transfer(lun, &cdb, b.blocks)?;
        rw::check_range(lun, b.lba, b.blocks)?;
        let verify = matches!(cdb.opcode(), op::WRITE_VERIFY10 | op::WRITE_VERIFY12 | op::WRITE_VERIFY16);
        if wp {
            return Err(CmdError::write_protected());
        }
        // Whole blocks of data received (EDTL may be shorter than the transfer length).
        let avail = data_out.as_ref().map_or(0, |d| d.as_slice().len() as u64).min(ctx.edtl as u64);
        let blocks = b.blocks.min(avail / bs);
        if blocks == 0 {
            return Ok(Action::Good);
        }
        let buf = self.exact(data_out, (blocks * bs) as usize);
        let atomic = cdb.opcode() == op::WRITE_ATOMIC16;
        let need = if atomic { Need::Exclusive(b.lba, blocks) } else { Need::Shared(vec![(b.lba, blocks)]) };
        if verify {
            let check = b.flags & 0x02 != 0;
            return Ok(Action::Job(need, Job::WriteVerify { lba: b.lba, blocks, buf: Some(buf), written: None, check }));
        }
        Ok(Action::Job(need, Job::Write { lba: b.lba, blocks, buf: Some(buf) }))
    }

    /// A buffer of exactly `len` bytes holding the start of `data` (zero-copy when the
    /// initiator's buffer already has that size).
    fn exact(&mut self, data: Option<IoBuf>, len: usize) -> IoBuf {
        match data {
            Some(d) if d.as_slice().len() == len => d,
            Some(d) => {
                let mut b = self.buf(len);
                let n = len.min(d.as_slice().len());
                b.as_mut_slice()[..n].copy_from_slice(&d.as_slice()[..n]);
                b
            }
            None => self.buf(len),
        }
    }

    /// VERIFY (10/12/16) (SBC-3 5.26-5.28).
    fn verify(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let b = rw::decode(&cdb);
        let bs = lun.block_size() as u64;
        let bytchk = (b.flags >> 1) & 0x03;
        ctx.xfer = match bytchk {
            0 => 0,
            1 => b.blocks * bs,
            3 => if b.blocks > 0 { bs } else { 0 },
            _ => 0,
        };
        rw::check_protect(&b)?;
        if bytchk == 2 {
            return Err(CmdError::invalid_cdb(1, Some(1)));
        }
        rw::check_transfer(lun, &cdb, b.blocks)?;
        rw::check_range(lun, b.lba, b.blocks)?;
        if bytchk == 0 || b.blocks == 0 {
            // Medium verification: RAM has nothing to verify.
            return Ok(Action::Good);
        }
        let need_len = ctx.xfer as usize;
        let have = data_out.as_ref().map_or(0, |d| d.as_slice().len()).min(ctx.edtl as usize);
        if have < need_len {
            // The data to compare with did not all arrive.
            return Err(CmdError::param_list_length());
        }
        let expect = self.exact(data_out, need_len);
        Ok(Action::Job(
            Need::None,
            Job::Compare { lba: b.lba, blocks: b.blocks, expect, repeat_block: bytchk == 3 },
        ))
    }

    /// WRITE SAME (10/16) (SBC-3 5.41, 5.42). NUMBER OF LOGICAL BLOCKS 0 means "to the end
    /// of the medium" (WSNZ=0); with UNMAP set the blocks are deallocated (and read back
    /// as zeros, LBPRZ) whatever the data block holds.
    fn write_same(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>, wp: bool) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let b = rw::decode(&cdb);
        let bs = lun.block_size() as u64;
        let unmap = b.flags & 0x08 != 0;
        let anchor = b.flags & 0x10 != 0;
        let ndob = cdb.opcode() == op::WRITE_SAME16 && b.flags & 0x01 != 0;
        let len_byte = if cdb.opcode() == op::WRITE_SAME10 { 7 } else { 10 };
        ctx.xfer = if ndob { 0 } else { bs };
        rw::check_protect(&b)?;
        if anchor {
            // ANCHOR requires ANC_SUP, which riser does not report (SBC-3 5.41).
            return Err(CmdError::invalid_cdb(1, Some(4)));
        }
        if unmap && !lun.thin_provisioned() {
            return Err(CmdError::invalid_cdb(1, Some(3)));
        }
        rw::check_range(lun, b.lba, b.blocks)?;
        let blocks = if b.blocks == 0 { lun.num_blocks() - b.lba } else { b.blocks };
        if blocks > MAX_WRITE_SAME_BLOCKS {
            return Err(CmdError::invalid_cdb(len_byte, None));
        }
        // Exactly one logical block of data (none with NDOB).
        let got = data_out.as_ref().map_or(0, |d| d.as_slice().len() as u64).min(ctx.edtl as u64);
        if !ndob && (ctx.edtl as u64 != bs || got < bs) {
            return Err(CmdError::param_list_length());
        }
        if wp {
            return Err(CmdError::write_protected());
        }
        if blocks == 0 {
            return Ok(Action::Good);
        }
        let need = Need::Shared(vec![(b.lba, blocks)]);
        if unmap {
            return Ok(Action::Job(need, Job::Unmap { ranges: vec![(b.lba, blocks)] }));
        }
        let pattern: Vec<u8> = match &data_out {
            Some(d) if !ndob => d.as_slice()[..bs as usize].to_vec(),
            _ => vec![0u8; bs as usize],
        };
        if pattern.iter().all(|&x| x == 0) && lun.bdev().supports(IoKind::WriteZeroes) {
            return Ok(Action::Job(need, Job::WriteZeroes { lba: b.lba, blocks }));
        }
        Ok(Action::Job(need, Job::WriteSame { next: b.lba, end: b.lba + blocks, pattern, buf: None }))
    }

    /// UNMAP (SBC-3 5.28) with its parameter list.
    fn unmap(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>, wp: bool) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let len = cdb.be16(7) as usize;
        ctx.xfer = len as u64;
        if !lun.thin_provisioned() {
            return Err(CmdError::invalid_opcode());
        }
        if cdb.u8(1) & 0x01 != 0 {
            return Err(CmdError::invalid_cdb(1, Some(0))); // ANCHOR without ANC_SUP
        }
        if len == 0 {
            return Ok(Action::Good);
        }
        if len < 8 {
            return Err(CmdError::param_list_length());
        }
        let p = param(&data_out, len as u64, ctx.edtl);
        if p.len() < len {
            return Err(CmdError::param_list_length());
        }
        let data_len = get_be16(p, 0) as usize;
        let bd_len = get_be16(p, 2) as usize;
        if data_len + 2 > len || bd_len + 8 > len || (bd_len > 0 && data_len < bd_len + 6) {
            return Err(CmdError::param_list_length());
        }
        let n = bd_len / 16;
        if n > MAX_UNMAP_DESCRIPTORS {
            return Err(CmdError::invalid_param(2, None));
        }
        let mut ranges = Vec::with_capacity(n);
        for i in 0..n {
            let d = &p[8 + 16 * i..];
            let lba = get_be64(d, 0);
            let cnt = get_be32(d, 8) as u64;
            if cnt > MAX_UNMAP_LBA_COUNT {
                return Err(CmdError::invalid_param((8 + 16 * i + 8) as u16, None));
            }
            rw::check_range(lun, lba, cnt)?;
            if cnt > 0 {
                ranges.push((lba, cnt));
            }
        }
        if wp {
            return Err(CmdError::write_protected());
        }
        if ranges.is_empty() {
            return Ok(Action::Good);
        }
        Ok(Action::Job(Need::Shared(ranges.clone()), Job::Unmap { ranges }))
    }

    /// COMPARE AND WRITE (SBC-3 5.2): atomic against every other write to the range.
    fn compare_and_write(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>, wp: bool) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let b = rw::decode(&cdb);
        let bs = lun.block_size() as u64;
        ctx.xfer = 2 * b.blocks * bs;
        rw::check_protect(&b)?;
        if b.blocks > MAX_CAW_BLOCKS {
            return Err(CmdError::invalid_cdb(13, None));
        }
        rw::check_range(lun, b.lba, b.blocks)?;
        if b.blocks == 0 {
            return Ok(Action::Good);
        }
        if wp {
            return Err(CmdError::write_protected());
        }
        let need_len = (2 * b.blocks * bs) as usize;
        let have = data_out.as_ref().map_or(0, |d| d.as_slice().len()).min(ctx.edtl as usize);
        if have < need_len || (ctx.edtl as usize) != need_len {
            // SBC-3 5.2: the Data-Out buffer holds exactly 2 x NUMBER OF LOGICAL BLOCKS.
            return Err(CmdError::invalid_cdb(13, None));
        }
        let data = self.exact(data_out, need_len);
        Ok(Action::Job(
            Need::Exclusive(b.lba, b.blocks),
            Job::CompareAndWrite { lba: b.lba, blocks: b.blocks, data, writing: false },
        ))
    }

    /// ORWRITE (16) (SBC-3 5.9): read, OR the data in, write; atomic like COMPARE AND WRITE.
    fn orwrite(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>, wp: bool) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let b = rw::decode(&cdb);
        let bs = lun.block_size() as u64;
        ctx.xfer = b.blocks * bs;
        rw::check_protect(&b)?;
        rw::check_transfer(lun, &cdb, b.blocks)?;
        rw::check_range(lun, b.lba, b.blocks)?;
        if wp {
            return Err(CmdError::write_protected());
        }
        let avail = data_out.as_ref().map_or(0, |d| d.as_slice().len() as u64).min(ctx.edtl as u64);
        let blocks = b.blocks.min(avail / bs);
        if blocks == 0 {
            return Ok(Action::Good);
        }
        let data = self.exact(data_out, (blocks * bs) as usize);
        Ok(Action::Job(
            Need::Exclusive(b.lba, blocks),
            Job::OrWrite { lba: b.lba, blocks, data, writing: false },
        ))
    }

    /// GET LBA STATUS (SBC-3 5.5): blocks that read as zeros are reported deallocated
    /// (LBPRZ: an unmapped block reads as zeros, and a zeroed block is as good as
    /// unmapped).
    fn get_lba_status(&mut self, ctx: &mut Ctx<'_>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let lba = cdb.be64(2);
        let alloc = cdb.be32(10) as usize;
        if lba >= lun.num_blocks() {
            return Err(CmdError::lba_out_of_range());
        }
        // Examine a bounded window from the starting LBA.
        let window = (inquiry::MAX_TRANSFER_BYTES / lun.block_size() as u64).min(lun.num_blocks() - lba);
        ctx.xfer = alloc as u64;
        Ok(Action::Job(Need::None, Job::LbaStatus { lba, blocks: window, alloc }))
    }
}

/// The parameter list of a command: the data-out bytes, cut to the CDB's parameter list
/// length and to EDTL.
fn param(data_out: &Option<IoBuf>, len: u64, edtl: u32) -> &[u8] {
    let d = data_out.as_ref().map_or(&[][..], |d| d.as_slice());
    let n = (d.len() as u64).min(len).min(edtl as u64) as usize;
    &d[..n]
}

/// How `d` interacts with reservations, refined by CDB fields where SPC/SBC say so.
fn class_of(d: &CmdDesc, cdb: &Cdb) -> PrClass {
    match cdb.opcode() {
        // PREVENT ALLOW MEDIUM REMOVAL with PREVENT=0 is allowed (SBC-3 table 13).
        op::PREVENT_ALLOW if cdb.u8(4) & 0x03 == 0 => PrClass::AllowedPr,
        // START STOP UNIT with START=1 and no power condition is allowed.
        op::START_STOP_UNIT if cdb.u8(4) & 0xF1 == 0x01 => PrClass::AllowedPr,
        _ => d.pr,
    }
}

/// GET LBA STATUS parameter data (SBC-3 5.5.2) for the blocks in `data` from `lba`.
fn lba_status_data(lba: u64, data: &[u8], bs: usize) -> Vec<u8> {
    let mut v = vec![0u8; 8];
    let mut runs: Vec<(u64, u64, u8)> = Vec::new();
    for (i, blk) in data.chunks(bs).enumerate() {
        // Provisioning status: 0 mapped, 1 deallocated.
        let st = if blk.iter().all(|&b| b == 0) { 1 } else { 0 };
        match runs.last_mut() {
            Some(r) if r.2 == st => r.1 += 1,
            _ => runs.push((lba + i as u64, 1, st)),
        }
    }
    for (start, n, st) in runs {
        let mut d = [0u8; 16];
        put_be64(&mut d, 0, start);
        put_be32(&mut d, 8, n.min(u32::MAX as u64) as u32);
        d[12] = st;
        v.extend_from_slice(&d);
    }
    let n = (v.len() - 4) as u32;
    put_be32(&mut v, 0, n);
    v
}

/// READ DEFECT DATA (10/12) (SBC-3 5.11, 5.12): an empty list in the requested format.
fn read_defect_data(cdb: &Cdb) -> Action {
    let ten = cdb.opcode() == op::READ_DEFECT_DATA10;
    let (flags, alloc) = if ten { (cdb.u8(2), cdb.be16(7) as usize) } else { (cdb.u8(1), cdb.be32(6) as usize) };
    let v = if ten {
        vec![0, flags & 0x1F, 0, 0]
    } else {
        vec![0, flags & 0x1F, 0, 0, 0, 0, 0, 0]
    };
    Action::Data(v, alloc)
}

/// REPORT TARGET PORT GROUPS (SPC-4 6.36): one group, active/optimized, holding the
/// nexus's target port.
fn report_target_port_groups(nexus: &Nexus, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    let ext = cdb.u8(1) >> 5 == 0x01;
    let mut v = vec![0u8; if ext { 8 } else { 4 }];
    if ext {
        v[4] = 0x10; // FORMAT TYPE 001b
    }
    let mut g = [0u8; 12];
    g[0] = 0x80; // PREF, asymmetric access state 0: active/optimized
    g[1] = 0x01; // AO_SUP
    put_be16(&mut g, 2, nexus.target_port_group);
    g[7] = 1; // target port count

    put_be16(&mut g, 10, nexus.rel_target_port);
    v.extend_from_slice(&g);
    let n = (v.len() - 4) as u32;
    put_be32(&mut v, 0, n);
    Ok(v)
}
