//! The block-level jobs of the executor: admission through the range lock, then the
//! bdev I/Os of each step, advanced by their completions.

use riser_bdev::{IoBuf, IoCompletion, IoKind, Lba};

use super::*;

impl LunChannel {
    /// Tries to admit and start the op; false if it must wait for the range lock.
    pub(super) fn try_start(&mut self, slot: usize) -> bool {
        // Borrowed, not cloned: no reference count touched per command.
        let lun = &self.lun;
        let pool = self.pool;
        let account = &self.account;
        let Some(o) = self.ops[slot].as_mut() else {
            return true;
        };
        if o.started {
            return true;
        }
        // A read waits for its buffer under the budget, in turn with everyone else's
        // (before taking the range lock, so a waiting read holds up no write).
        if let Job::Read { blocks, buf: buf @ None, waiter, .. } = &mut o.job {
            let len = *blocks as usize * lun.block_size() as usize;
            match pool.try_alloc_for(len, waiter, account) {
                Some(b) => *buf = Some(b),
                None => return false,
            }
        }
        match &o.need {
            Need::None => {}
            Need::Shared(ranges) => match lun.ranges.admit_write(&self.counter, ranges) {
                WriteAdmission::Fast => o.adm = Adm::Fast,
                WriteAdmission::Registered(g) => o.adm = Adm::Grant(g),
                WriteAdmission::Wait => return false,
            },
            Need::One(lba, n) => match lun.ranges.admit_write(&self.counter, &[(*lba, *n)]) {
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
            Job::Read { lba, blocks, buf, .. } => {
                let (lba, blocks, b) = (*lba, *blocks, buf.take());
                let b = b.unwrap_or_else(|| self.buf(blocks as usize * bs));
                self.submit_io(slot, IoKind::Read, lba, blocks, Some(b));
            }
            Job::ReadStream(_) => self.stream_pump(slot),
            Job::WriteStream(_) => self.ask_piece(slot),
            Job::Write { lba, blocks, buf, .. }
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
            Job::DeviceCaw { lba, blocks, buf } => {
                let (lba, blocks, b) = (*lba, *blocks, buf.take());
                self.submit_io(slot, IoKind::CompareAndWrite, lba, blocks, b);
            }
            Job::WriteSame { .. } => self.write_same_next(slot),
            Job::Copy(_) => self.copy_next(slot, None),
            Job::Sanitize(_) => self.sanitize_next(slot, None),
            Job::Deferred(_) => {
                o.inflight = 1;
                self.deferred.push(slot);
            }
            Job::Compare { lba, blocks, .. }
            | Job::Rmw(Rmw { lba, blocks, .. })
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
        let end = self.lun.end_lba();
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
            j.next = Lba::ZERO;
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
    pub(super) fn sanitize_ended(&self, ause: bool, failed: bool) {
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

    /// Submits a streamed read's next pieces while the window and the budget have room
    /// (else waits in `pumping` for the next poll), after an error or an abort nothing.
    pub(super) fn stream_pump(&mut self, slot: usize) {
        let bs = self.lun.block_size() as u64;
        let pool = self.pool;
        loop {
            let Some(o) = self.ops.get_mut(slot).and_then(|o| o.as_mut()) else {
                return;
            };
            if o.aborted || o.err.is_some() {
                return;
            }
            let Job::ReadStream(j) = &mut o.job else { return };
            if j.next >= j.pieces() || (j.next - j.delivered) as usize >= STREAM_WINDOW {
                return;
            }
            let first = j.next * j.chunk_blocks;
            let n = (j.blocks - first).min(j.chunk_blocks);
            let Some(b) = pool.try_alloc_for((n * bs) as usize, &mut j.waiter, &self.account) else {
                if !self.pumping.contains(&slot) {
                    self.pumping.push(slot);
                }
                return;
            };
            let (lba, piece) = (j.lba + first, j.next);
            j.next += 1;
            self.submit_tagged(slot, op_tag(slot, piece), IoKind::Read, lba, n, Some(b));
        }
    }

    /// A streamed read's piece is in: hand up every piece now in order, the last one with
    /// the task's result; then read further.
    fn stream_piece(&mut self, slot: usize, piece: u64, c: IoCompletion) {
        let Some(o) = self.ops.get_mut(slot).and_then(|o| o.as_mut()) else { return };
        o.count_completion(&c);
        if o.aborted || o.err.is_some() {
            if o.inflight == 0 {
                self.pumping.retain(|s| *s != slot);
                self.finish(slot);
            }
            return;
        }
        let tag = o.tag;
        let bs = self.lun.block_size() as usize;
        let Job::ReadStream(j) = &mut o.job else { return };
        match c.buf {
            Some(b) => j.ready[piece as usize % STREAM_WINDOW] = Some(b),
            None => {
                o.err = Some(CmdError::internal());
                if o.inflight == 0 {
                    self.finish(slot);
                }
                return;
            }
        }
        let chunk = j.chunk_blocks as usize * bs;
        while let Some(b) = j.ready[j.delivered as usize % STREAM_WINDOW].take() {
            let offset = j.delivered as usize * chunk;
            let len = chunk.min(j.ret_len - offset);
            j.delivered += 1;
            if j.delivered == j.pieces() {
                return self.complete_at(slot, Some((b, len)), offset);
            }
            self.done.push(TaskEvent::Data(DataPiece { tag, offset: offset as u32, buf: b, len: len as u32 }));
        }
        self.stream_pump(slot);
    }

    pub(super) fn on_completion(&mut self, slot: usize, c: IoCompletion) {
        match self.ops.get(slot) {
            Some(Some(Op { job: Job::ReadStream(_), .. })) => return self.stream_piece(slot, u64::from(OP_TAG.decode(c.tag).route), c),
            Some(Some(Op { job: Job::WriteStream(_), .. })) => return self.stream_write_done(slot, c),
            _ => {}
        }
        let Some(o) = self.ops.get_mut(slot).and_then(|o| o.as_mut()) else { return };
        o.count_completion(&c);
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
            // Their pieces are handled by stream_piece and stream_write_done.
            Job::ReadStream(_) | Job::WriteStream(_) => {}
            Job::Read { ret_len, .. } => {
                let n = *ret_len;
                match buf {
                    Some(b) => self.complete(slot, Some((b, n))),
                    None => self.fail(slot, CmdError::internal()),
                }
            }
            Job::Write { .. } | Job::Flush { .. } | Job::Unmap { .. } | Job::WriteZeroes { .. } | Job::DeviceCaw { .. } => {
                self.finish(slot)
            }
            // No bdev I/O of its own: finished by poll_deferred.
            Job::Deferred(_) => {}
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
            Job::Rmw(_) => self.rmw_next(slot, buf),
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
                let left = self.lun.end_lba().checked_sub(next).unwrap_or(0);
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
}
