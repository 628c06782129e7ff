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

use crate::cdb::{get_be16, get_be32, get_be64, op, Cdb};
use crate::inquiry::{
    self, MAX_CAW_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_UNMAP_LBA_COUNT, MAX_WRITE_SAME_BLOCKS,
    WRITE_SAME_CHUNK_BYTES,
};
use crate::lock::{FastCounter, RangeGrant, WriteAdmission};
use crate::lun::{Lun, ATTN_RESERVED, ATTN_SANITIZE, MODE_DSENSE, MODE_NO_MEDIUM};
use crate::opcodes::{self, CmdDesc, F_MEDIUM, F_WRITE};
use crate::pr;
use crate::rw;
use crate::sanitize::{self, SanitizeOp, SanitizeState};
use crate::sense::{Asc, CmdError, CmdResult, Sense, SenseKey, Status};
use crate::task::{Nexus, Residual, ScsiResult, ScsiTask};
use crate::xcopy::{self, CopyStatus, Segment};

mod handlers;
mod util;
use util::*;

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
    Read {
        lba: u64,
        blocks: u64,
        ret_len: usize,
    },
    Write {
        lba: u64,
        blocks: u64,
        buf: Option<IoBuf>,
    },
    /// WRITE AND VERIFY: write, then read back and compare (`check` when BYTCHK=1).
    WriteVerify {
        lba: u64,
        blocks: u64,
        buf: Option<IoBuf>,
        written: Option<IoBuf>,
        check: bool,
    },
    Flush {
        lba: u64,
        blocks: u64,
    },
    /// UNMAP descriptors, or WRITE SAME of zeros with UNMAP (deallocate, reads zeros).
    Unmap {
        ranges: Vec<(u64, u64)>,
    },
    WriteZeroes {
        lba: u64,
        blocks: u64,
    },
    WriteSame {
        next: u64,
        end: u64,
        pattern: Vec<u8>,
        buf: Option<IoBuf>,
    },
    /// VERIFY with BYTCHK 01b (`expect` is the whole range) or 11b (one block repeated).
    Compare {
        lba: u64,
        blocks: u64,
        expect: IoBuf,
        repeat_block: bool,
    },
    /// COMPARE AND WRITE: `data` holds the verify then the write instance.
    CompareAndWrite {
        lba: u64,
        blocks: u64,
        data: IoBuf,
        writing: bool,
    },
    OrWrite {
        lba: u64,
        blocks: u64,
        data: IoBuf,
        writing: bool,
    },
    /// GET LBA STATUS: read window after window from the starting LBA and report runs of
    /// zeroed (deallocated) blocks; `lba`/`blocks` is the window being read.
    LbaStatus {
        lba: u64,
        blocks: u64,
        alloc: usize,
        runs: LbaRuns,
        scanned: u64,
    },
    /// EXTENDED COPY: segments copied one chunk at a time (read, then write).
    Copy(CopyJob),
    /// SANITIZE: the whole medium, one chunk at a time.
    Sanitize(SanitizeJob),
}

struct SanitizeJob {
    op: SanitizeOp,
    ause: bool,
    /// IMMED: GOOD was returned when the operation started.
    immed: bool,
    /// Current pass, and the first block not yet submitted in it.
    pass: u8,
    next: u64,
    /// Where the chunk in flight ends (recorded in the LUN state once it is written).
    done_to: u64,
    rng: sanitize::Rng,
    /// The chunk buffer, reused while its size fits, and the pass it holds data for
    /// (overwrite patterns differ between passes with INVERT).
    buf: Option<IoBuf>,
    buf_pass: Option<u8>,
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
    /// The task's result was already reported (a SANITIZE with IMMED, or one whose task was
    /// aborted): the operation goes on and reports nothing when it ends.
    detached: bool,
    job: Job,
}

/// How a command handler answers.
enum Action {
    /// Data-in produced by emulation, before truncation to the allocation length.
    Data(Vec<u8>, usize),
    Good,
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
        for o in self.ops.iter_mut().filter_map(|o| o.take()) {
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
        let mut ctx = Ctx {
            lun: &lun,
            nexus: &task.nexus,
            cdb: task.cdb,
            edtl,
            xfer: 0,
        };
        let action = self.dispatch(&mut ctx, task.data_out);
        let xfer = ctx.xfer;
        match action {
            Ok(Action::Data(mut v, alloc_len)) => {
                v.truncate(alloc_len);
                let n = v.len().min(edtl as usize);
                let residual = Residual::compute(v.len() as u64, edtl);
                v.truncate(n);
                let buf = Self::vec_buf(v);
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
            Err(e) => self.finish_now(tag, edtl, xfer, Err(e), dsense),
            Ok(Action::Job(need, job)) => {
                let immed = matches!(&job, Job::Sanitize(j) if j.immed);
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
                    detached: immed,
                    job,
                };
                if immed {
                    // SANITIZE with IMMED: GOOD once the operation is validated and begun;
                    // its progress is reported by REQUEST SENSE (SBC-3 4.11).
                    self.finish_now(tag, edtl, xfer, Ok(Status::Good), dsense);
                }
                self.add_op(opr);
            }
        }
    }

    /// Stores a new op and tries to start it.
    fn add_op(&mut self, opr: Op) {
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
            need: Need::Exclusive(0, n),
            adm: Adm::None,
            begun_exclusive: false,
            started: false,
            detached: true,
            job: Job::Sanitize(job),
        });
    }

    /// Moves finished tasks into `out`; returns how many.
    pub fn poll(&mut self, out: &mut Vec<ScsiResult>) -> usize {
        if self
            .lun
            .sanitize_orphan
            .load(std::sync::atomic::Ordering::Acquire)
        {
            self.adopt_sanitize();
        }
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
                    self.done.push(ScsiResult {
                        tag: o.tag,
                        status: Status::Good,
                        sense: None,
                        data_in: None,
                        data_len: 0,
                        residual: Residual::None,
                        aborted: true,
                    });
                    continue;
                }
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

    fn vec_buf(v: Vec<u8>) -> IoBuf {
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
        let Some(mut o) = self.ops[slot].take() else {
            return;
        };
        if let Job::Sanitize(j) = &o.job {
            self.sanitize_ended(j.ause, o.err.is_some());
            if o.err.is_some() {
                o.err = Some(CmdError::sanitize_failed());
            }
        }
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
        if o.detached {
            return;
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
        self.io.submit(BdevIo {
            kind,
            offset_blocks: lba,
            num_blocks: blocks,
            buf,
            tag: slot as u64,
        });
    }

    fn buf(&mut self, len: usize) -> IoBuf {
        (self.alloc)(len)
    }

    /// Tries to admit and start the op; false if it must wait for the range lock.
    fn try_start(&mut self, slot: usize) -> bool {
        let lun = self.lun.clone();
        let Some(o) = self.ops[slot].as_mut() else {
            return true;
        };
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
        let Some(o) = self.ops[slot].as_mut() else {
            return;
        };
        match &mut o.job {
            Job::Read { lba, blocks, .. } => {
                let (lba, blocks) = (*lba, *blocks);
                let b = self.buf(blocks as usize * bs);
                self.submit_io(slot, IoKind::Read, lba, blocks, Some(b));
            }
            Job::Write { lba, blocks, buf }
            | Job::WriteVerify {
                lba, blocks, buf, ..
            } => {
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
            Job::Sanitize(_) => self.sanitize_next(slot, None),
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
        let Some(o) = self.ops[slot].as_mut() else {
            return;
        };
        let Job::WriteSame {
            next,
            end,
            pattern,
            buf,
        } = &mut o.job
        else {
            return;
        };
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

    /// Submits the next chunk of a sanitize operation (the next pass when one is done), or
    /// finishes it. `buf` is the chunk buffer coming back from the last write.
    fn sanitize_next(&mut self, slot: usize, buf: Option<IoBuf>) {
        let bs = self.lun.block_size() as u64;
        let end = self.lun.num_blocks();
        let Some(o) = self.ops[slot].as_mut() else {
            return;
        };
        let Job::Sanitize(j) = &mut o.job else {
            return;
        };
        if buf.is_some() {
            j.buf = buf;
        }
        if j.next >= end {
            if j.pass + 1 >= j.op.passes() {
                self.finish(slot);
                return;
            }
            j.pass += 1;
            j.next = 0;
        }
        let lba = j.next;
        if j.op == SanitizeOp::BlockErase {
            let n = (end - lba).min((sanitize::SANITIZE_UNMAP_CHUNK_BYTES / bs).max(1));
            j.next += n;
            j.done_to = j.next;
            self.submit_io(slot, IoKind::Unmap, lba, n, None);
            return;
        }
        let n = (end - lba).min((sanitize::SANITIZE_WRITE_CHUNK_BYTES / bs).max(1));
        j.next += n;
        j.done_to = j.next;
        let want = (n * bs) as usize;
        let reuse = match j.buf.take() {
            Some(b) if b.as_slice().len() == want => Some(b),
            _ => None,
        };
        let mut b = match reuse {
            Some(b) => b,
            None => {
                j.buf_pass = None;
                self.buf(want)
            }
        };
        let Some(Op {
            job: Job::Sanitize(j),
            ..
        }) = self.ops[slot].as_mut()
        else {
            return;
        };
        match &j.op {
            SanitizeOp::Overwrite {
                pattern, invert, ..
            } => {
                // The buffer keeps its contents across writes: refill it only for a new
                // buffer or a new pass.
                if j.buf_pass != Some(j.pass) {
                    sanitize::fill_overwrite(b.as_mut_slice(), pattern, *invert, j.pass);
                    j.buf_pass = Some(j.pass);
                }
            }
            // Fresh unpredictable data for every chunk.
            _ => j.rng.fill(b.as_mut_slice()),
        }
        self.submit_io(slot, IoKind::Write, lba, n, Some(b));
    }

    /// A sanitize operation ended: the LU leaves the sanitize state, or enters the failure
    /// mode (SBC-3 4.11) if it did not complete.
    fn sanitize_ended(&self, ause: bool, failed: bool) {
        let mut st = self.lun.lock();
        if matches!(st.sanitize, SanitizeState::Running { .. }) {
            st.sanitize = if failed {
                SanitizeState::Failed { ause }
            } else {
                SanitizeState::Idle
            };
        }
        self.lun.refresh_attn(&st);
    }

    /// Advances an EXTENDED COPY: after a read, write the chunk to the destination; after
    /// a write (or at the start), read the next chunk.
    fn copy_next(&mut self, slot: usize, buf: Option<IoBuf>) {
        let bs = self.lun.block_size() as u64;
        let max_chunk = (xcopy::COPY_CHUNK_BYTES / bs).max(1);
        let Some(o) = self.ops[slot].as_mut() else {
            return;
        };
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
                let status = CopyStatus {
                    ok: true,
                    segments_processed: j.idx as u16,
                    blocks: j.copied,
                };
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
        let Some(o) = self.ops.get_mut(slot).and_then(|o| o.as_mut()) else {
            return;
        };
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
        let Some(o) = self.ops[slot].as_mut() else {
            return;
        };
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
            Job::WriteVerify {
                lba,
                blocks,
                written,
                check,
                ..
            } => {
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
            Job::Compare {
                expect,
                repeat_block,
                ..
            } => {
                let Some(r) = buf else {
                    return self.fail(slot, CmdError::internal());
                };
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
            Job::CompareAndWrite {
                lba,
                blocks,
                data,
                writing,
            } => {
                if *writing {
                    return self.finish(slot);
                }
                let Some(mut r) = buf else {
                    return self.fail(slot, CmdError::internal());
                };
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
            Job::OrWrite {
                lba,
                blocks,
                data,
                writing,
            } => {
                if *writing {
                    return self.finish(slot);
                }
                let Some(mut r) = buf else {
                    return self.fail(slot, CmdError::internal());
                };
                for (x, y) in r.as_mut_slice().iter_mut().zip(data.as_slice()) {
                    *x |= *y;
                }
                *writing = true;
                let (lba, blocks) = (*lba, *blocks);
                self.submit_io(slot, IoKind::Write, lba, blocks, Some(r));
            }
            Job::Copy(_) => self.copy_next(slot, buf),
            Job::Sanitize(j) => {
                // The chunk is on the medium: record how far the operation got, for the
                // progress indication and for a takeover.
                let (pass, done_to) = (j.pass, j.done_to);
                let mut st = self.lun.lock();
                if let SanitizeState::Running { pass: p, next, .. } = &mut st.sanitize {
                    *p = pass;
                    *next = done_to;
                }
                drop(st);
                self.sanitize_next(slot, buf)
            }
            Job::LbaStatus {
                lba,
                blocks,
                alloc,
                runs,
                scanned,
            } => {
                let Some(r) = buf else {
                    return self.fail(slot, CmdError::internal());
                };
                lba_status_scan(runs, *lba, r.as_slice(), bs);
                *scanned += *blocks;
                let next = *lba + *blocks;
                // Descriptors that fit in the allocation length (8-byte header, 16 each).
                let fit = (alloc.saturating_sub(8) / 16).max(1);
                let cap = (LBA_STATUS_MAX_SCAN_BYTES / bs as u64).max(1);
                let left = self.lun.num_blocks().saturating_sub(next);
                if left > 0 && runs.len() <= fit && *scanned < cap {
                    // Everything seen so far fits in what the initiator will get: the last
                    // run may go on, so look further.
                    let window = (LBA_STATUS_WINDOW_BYTES / bs as u64)
                        .max(1)
                        .min(left)
                        .min(cap - *scanned);
                    *lba = next;
                    *blocks = window;
                    let b = r;
                    let b = if b.as_slice().len() == window as usize * bs {
                        b
                    } else {
                        self.buf(window as usize * bs)
                    };
                    self.submit_io(slot, IoKind::Read, next, window, Some(b));
                    return;
                }
                let mut v = lba_status_data(runs);
                v.truncate(*alloc);
                let n = v.len();
                if let Some(o) = self.ops[slot].as_mut() {
                    o.xfer = n as u64;
                }
                let b = Self::vec_buf(v);
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
    fn slow_checks(
        &mut self,
        ctx: &mut Ctx<'_>,
        desc: &CmdResult<&'static CmdDesc>,
        attn: u32,
    ) -> CmdResult<()> {
        let lun = ctx.lun;
        let key = ctx.nexus.key();
        let mut st = lun.lock();
        st.nexus(key);
        self.seen.insert(ctx.nexus.id);
        let opc = ctx.cdb.opcode();
        // INQUIRY, REPORT LUNS and REQUEST SENSE are not held up by a unit attention
        // (SAM-5 5.14); every other command reports the oldest one and clears it.
        let exempt = matches!(opc, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE);
        let n = st.nexus(key);
        if !exempt && !n.ua.is_empty() {
            let asc = n.ua.remove(0);
            lun.refresh_attn(&st);
            return Err(CmdError::check(SenseKey::UnitAttention, asc));
        }
        if opc == op::REPORT_LUNS {
            // Reporting the LUN inventory clears its change notice (SPC-4 6.33).
            n.ua.retain(|a| *a != Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
        }
        // The nexus may be new (POWER ON queued above): keep the fast-path flags exact.
        lun.refresh_attn(&st);
        if attn & ATTN_SANITIZE != 0 {
            let flags = desc.as_ref().map_or(0, |d| d.flags);
            sanitize::gate(&st.sanitize, lun.num_blocks(), opc, flags)?;
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

    fn handle(
        &mut self,
        ctx: &mut Ctx<'_>,
        desc: &'static CmdDesc,
        data_out: Option<IoBuf>,
    ) -> CmdResult<Action> {
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
                op::SAI_READ_CAPACITY16 => Ok(Action::Data(
                    inquiry::read_capacity16(&lun, &cdb)?,
                    cdb.be32(10) as usize,
                )),
                _ => self.get_lba_status(ctx),
            },
            op::MODE_SENSE6 => Ok(Action::Data(
                crate::mode::mode_sense(&lun, &cdb)?,
                cdb.u8(4) as usize,
            )),
            op::MODE_SENSE10 => Ok(Action::Data(
                crate::mode::mode_sense(&lun, &cdb)?,
                cdb.be16(7) as usize,
            )),
            op::MODE_SELECT6 | op::MODE_SELECT10 => {
                let len = if cdb.opcode() == op::MODE_SELECT6 {
                    cdb.u8(4) as u64
                } else {
                    cdb.be16(7) as u64
                };
                ctx.xfer = len;
                let p = param(&data_out, len, ctx.edtl);
                crate::mode::mode_select(&lun, ctx.nexus, &cdb, p)?;
                Ok(Action::Good)
            }
            op::REPORT_LUNS => {
                let v = crate::target::report_luns_data(&cdb, &lun.target_luns())?;
                Ok(Action::Data(v, cdb.be32(6) as usize))
            }
            op::MAINTENANCE_IN => match cdb.service_action() {
                op::MI_REPORT_SUPPORTED_OPCODES => Ok(Action::Data(
                    opcodes::report_supported_opcodes(&lun, &cdb)?,
                    cdb.be32(6) as usize,
                )),
                _ => Ok(Action::Data(
                    report_target_port_groups(ctx.nexus, &cdb)?,
                    cdb.be32(6) as usize,
                )),
            },
            op::PERSISTENT_RESERVE_IN => {
                Ok(Action::Data(pr::pr_in(&lun, &cdb)?, cdb.be16(7) as usize))
            }
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
                    // Medium changer prevention is not applicable (SBC-3 PREVENT ALLOW MEDIUM REMOVAL; SPC-4 6.13).
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
                // riser has no cache to stage blocks into, so the blocks are not "transferred
                // to the cache" and the command completes with GOOD rather than CONDITION
                // MET (SBC-3 5.9).
                Ok(Action::Good)
            }
            op::SYNCHRONIZE_CACHE10 | op::SYNCHRONIZE_CACHE16 => {
                let b = rw::decode(&cdb);
                rw::check_range(&lun, b.lba, b.blocks)?;
                let (lba, blocks) = if b.lba == 0 && b.blocks == 0 {
                    (0, 0)
                } else {
                    (b.lba, b.blocks)
                };
                let blocks = if blocks == 0 && lba != 0 {
                    lun.num_blocks() - lba
                } else {
                    blocks
                };
                Ok(Action::Job(Need::None, Job::Flush { lba, blocks }))
            }
            op::WRITE_SAME10 | op::WRITE_SAME16 => self.write_same(ctx, data_out, write_protected),
            op::UNMAP => self.unmap(ctx, data_out, write_protected),
            op::COMPARE_AND_WRITE => self.compare_and_write(ctx, data_out, write_protected),
            op::EXTENDED_COPY => {
                let len = cdb.be32(10) as u64;
                ctx.xfer = len;
                let p = param(&data_out, len, ctx.edtl);
                let Some(plan) = xcopy::parse(&lun, &cdb, p)? else {
                    return Ok(Action::Good);
                };
                if write_protected {
                    return Err(CmdError::write_protected());
                }
                let record = if plan.discard {
                    None
                } else {
                    Some((ctx.nexus.key().clone(), plan.list_id))
                };
                if let Some(k) = &record {
                    // A new copy with this list identifier replaces older results.
                    lun.lock().copies.by_list.remove(k);
                }
                if plan.segments.is_empty() {
                    if let Some(k) = record {
                        let st = CopyStatus {
                            ok: true,
                            segments_processed: 0,
                            blocks: 0,
                        };
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
            op::SANITIZE => self.sanitize(ctx, data_out, write_protected),
            _ => Err(CmdError::invalid_opcode()),
        }
    }
}
