//! Command handlers of the executor, each named by its row of [`crate::opcodes::COMMANDS`]
//! (shape [`crate::opcodes::Handler`]): decode and validate a CDB and its data, then answer
//! directly (emulated commands, in `spc`) or describe the block-level job (the SBC-3
//! commands, here; the read/write ones open with [`rw::open`]).

use riser_bdev::{IoBuf, IoKind, Lba};

use super::rmw::{self, Rmw};
use super::*;
use crate::rw::Limit;

mod spc;

impl LunChannel {
    /// READ (6/10/12/16) (SBC-3 5.8-5.11).
    pub(crate) fn read(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let b = rw::open_transfer(lun, &ctx.cdb, &mut ctx.xfer)?;
        let bs = lun.block_size() as u64;
        // Only what fits in EDTL is transferred (RFC 7143 11.4.5.2: the rest is residual).
        let want = (ctx.edtl as u64).min(b.blocks * bs);
        let blocks = want.div_ceil(bs);
        if blocks == 0 {
            return Ok(Action::Good);
        }
        let chunk_blocks = self.stream_chunk as u64 / bs;
        if chunk_blocks > 0 && blocks > chunk_blocks {
            return Ok(Action::Job(
                Need::None,
                Job::ReadStream(Box::new(StreamRead {
                    lba: b.lba,
                    ret_len: want as usize,
                    blocks,
                    chunk_blocks,
                    next: 0,
                    delivered: 0,
                    ready: Default::default(),
                    waiter: None,
                })),
            ));
        }
        Ok(Action::Job(
            Need::None,
            Job::Read {
                lba: b.lba,
                blocks,
                ret_len: want as usize,
                buf: None,
                waiter: None,
            },
        ))
    }

    /// WRITE (6/10/12/16) (SBC-3 5.32-5.35), its data whole or asked for piece by piece.
    pub(crate) fn write(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let b = rw::open_transfer(lun, &ctx.cdb, &mut ctx.xfer)?;
        let bs = lun.block_size() as u64;
        rw::check_writable(lun)?;
        // FUA (SBC-3 5.35: byte 1 bit 3; WRITE (6) has none).
        let fua = b.flags & 0x08 != 0;
        if ctx.data_later {
            // The data is asked for piece by piece; only plain WRITEs are sent that way.
            let chunk_blocks = (self.stream_chunk as u64 / bs).max(1);
            let blocks = b.blocks.min(ctx.edtl as u64 / bs);
            if blocks == 0 {
                return Ok(Action::Good);
            }
            return Ok(Action::Job(
                Need::None,
                Job::WriteStream(Box::new(StreamWrite {
                    lba: b.lba,
                    blocks,
                    chunk_blocks,
                    fua,
                    asked: 0,
                    written: 0,
                    pending: None,
                    adm: Adm::None,
                    writing: false,
                })),
            ));
        }
        let Some((buf, blocks)) = self.whole_blocks(ctx, data_out, &b) else {
            return Ok(Action::Good);
        };
        let job = Job::Write { lba: b.lba, blocks, buf: Some(buf), fua };
        Ok(Action::Job(Need::One(b.lba, blocks), job))
    }

    /// WRITE ATOMIC (16) (SBC-4 5.48): a WRITE that holds its range exclusively, so that no
    /// other write lands in the middle of it.
    pub(crate) fn write_atomic(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let b = rw::open_transfer(lun, &ctx.cdb, &mut ctx.xfer)?;
        rw::check_writable(lun)?;
        not_streamed(ctx)?;
        let Some((buf, blocks)) = self.whole_blocks(ctx, data_out, &b) else {
            return Ok(Action::Good);
        };
        let fua = b.flags & 0x08 != 0;
        let job = Job::Write { lba: b.lba, blocks, buf: Some(buf), fua };
        Ok(Action::Job(Need::Exclusive(b.lba, blocks), job))
    }

    /// WRITE AND VERIFY (10/12/16) (SBC-3 5.36-5.38): write, then read back and compare
    /// when BYTCHK is set.
    pub(crate) fn write_verify(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let b = rw::open_transfer(lun, &ctx.cdb, &mut ctx.xfer)?;
        rw::check_writable(lun)?;
        not_streamed(ctx)?;
        let Some((buf, blocks)) = self.whole_blocks(ctx, data_out, &b) else {
            return Ok(Action::Good);
        };
        let check = b.flags & 0x02 != 0;
        Ok(Action::Job(
            Need::One(b.lba, blocks),
            Job::WriteVerify {
                lba: b.lba,
                blocks,
                buf: Some(buf),
                written: None,
                check,
            },
        ))
    }

    /// The whole blocks of data received for `b`, in a buffer of exactly their size (EDTL
    /// may be shorter than the transfer length); `None` when there are none.
    fn whole_blocks(
        &mut self,
        ctx: &Ctx<'_>,
        data_out: Option<IoBuf>,
        b: &rw::BlockCmd,
    ) -> Option<(IoBuf, u64)> {
        let bs = ctx.lun.block_size() as u64;
        let avail = data_out
            .as_ref()
            .map_or(0, |d| d.as_slice().len() as u64)
            .min(ctx.edtl as u64);
        let blocks = b.blocks.min(avail / bs);
        if blocks == 0 {
            return None;
        }
        Some((self.exact(data_out, (blocks * bs) as usize), blocks))
    }

    /// A buffer of exactly `len` bytes holding the start of `data` (zero-copy when the
    /// initiator's buffer already has that size).
    pub(super) fn exact(&mut self, data: Option<IoBuf>, len: usize) -> IoBuf {
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
    pub(crate) fn verify(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let bytes = |b: &rw::BlockCmd, bs| match b.bytchk() {
            0 => 0,
            1 => b.blocks * bs,
            3 if b.blocks > 0 => bs,
            _ => 0,
        };
        let own = |b: &rw::BlockCmd| match b.bytchk() {
            2 => Err(CmdError::invalid_cdb(1, Some(1))),
            _ => Ok(()),
        };
        let b = rw::open(lun, &ctx.cdb, &mut ctx.xfer, bytes, own, Limit::Transfer)?;
        let bytchk = b.bytchk();
        if bytchk == 0 || b.blocks == 0 {
            // Medium verification: RAM has nothing to verify.
            return Ok(Action::Good);
        }
        let need_len = ctx.xfer as usize;
        let have = data_out
            .as_ref()
            .map_or(0, |d| d.as_slice().len())
            .min(ctx.edtl as usize);
        if have < need_len {
            // The data to compare with did not all arrive.
            return Err(CmdError::param_list_length());
        }
        let expect = self.exact(data_out, need_len);
        Ok(Action::Job(
            Need::None,
            Job::Compare {
                lba: b.lba,
                blocks: b.blocks,
                expect,
                repeat_block: bytchk == 3,
            },
        ))
    }

    /// PRE-FETCH (10/16) (SBC-3 5.9): riser has no cache to stage blocks into, so the blocks
    /// are not "transferred to the cache" and the command completes with GOOD rather than
    /// CONDITION MET.
    pub(crate) fn pre_fetch(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let b = rw::decode(&ctx.cdb);
        rw::check_range(ctx.lun, b.lba, b.blocks)?;
        Ok(Action::Good)
    }

    /// SYNCHRONIZE CACHE (10/16) (SBC-3 5.22, 5.23): a flush of the range (0 blocks: from
    /// the LBA to the end of the medium; LBA 0 and 0 blocks: all of it).
    pub(crate) fn synchronize_cache(
        &mut self,
        ctx: &mut Ctx<'_>,
        _data_out: Option<IoBuf>,
    ) -> CmdResult<Action> {
        let lun = ctx.lun;
        let b = rw::decode(&ctx.cdb);
        rw::check_range(lun, b.lba, b.blocks)?;
        let (lba, blocks) = if b.lba == Lba::ZERO && b.blocks == 0 {
            (Lba::ZERO, 0)
        } else {
            (b.lba, b.blocks)
        };
        let blocks = if blocks == 0 && lba != Lba::ZERO {
            lun.end_lba() - lba
        } else {
            blocks
        };
        Ok(Action::Job(Need::None, Job::Flush { lba, blocks }))
    }

    /// WRITE SAME (10/16) (SBC-3 5.41, 5.42). NUMBER OF LOGICAL BLOCKS 0 means "to the end
    /// of the medium" (WSNZ=0); with UNMAP set the blocks are deallocated (and read back
    /// as zeros, LBPRZ) whatever the data block holds.
    pub(crate) fn write_same(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        // NDOB (no data-out buffer) exists in WRITE SAME (16) only.
        let ndob = cdb.opcode() == op::WRITE_SAME16 && cdb.u8(1) & 0x01 != 0;
        let own = |b: &rw::BlockCmd| {
            if b.flags & 0x10 != 0 {
                // ANCHOR requires ANC_SUP, which riser does not report (SBC-3 5.41).
                return Err(CmdError::invalid_cdb(1, Some(4)));
            }
            if b.flags & 0x08 != 0 && !lun.thin_provisioned() {
                return Err(CmdError::invalid_cdb(1, Some(3)));
            }
            Ok(())
        };
        let bytes = |_: &rw::BlockCmd, bs| if ndob { 0 } else { bs };
        let b = rw::open(lun, &cdb, &mut ctx.xfer, bytes, own, Limit::Handler)?;
        let bs = lun.block_size() as u64;
        let unmap = b.flags & 0x08 != 0;
        let blocks = if b.blocks == 0 {
            lun.end_lba() - b.lba
        } else {
            b.blocks
        };
        if blocks > MAX_WRITE_SAME_BLOCKS {
            return Err(CmdError::invalid_cdb(b.len_byte, None));
        }
        // A write-protected LUN refuses before the data is looked at (libiscsi's ReadOnly
        // test sends WRITE SAME with UNMAP and no data).
        rw::check_writable(lun)?;
        // Exactly one logical block of data (none with NDOB).
        let got = data_out
            .as_ref()
            .map_or(0, |d| d.as_slice().len() as u64)
            .min(ctx.edtl as u64);
        if !ndob && (ctx.edtl as u64 != bs || got < bs) {
            return Err(CmdError::param_list_length());
        }
        if blocks == 0 {
            return Ok(Action::Good);
        }
        let need = Need::One(b.lba, blocks);
        if unmap {
            return Ok(Action::Job(
                need,
                Job::Unmap {
                    ranges: vec![(b.lba, blocks)],
                },
            ));
        }
        let pattern: Vec<u8> = match &data_out {
            Some(d) if !ndob => d.as_slice()[..bs as usize].to_vec(),
            _ => vec![0u8; bs as usize],
        };
        if pattern.iter().all(|&x| x == 0) && lun.bdev().supports(IoKind::WriteZeroes) {
            return Ok(Action::Job(need, Job::WriteZeroes { lba: b.lba, blocks }));
        }
        Ok(Action::Job(
            need,
            Job::WriteSame {
                next: b.lba,
                end: b.lba + blocks,
                pattern,
                buf: None,
            },
        ))
    }

    /// UNMAP (SBC-3 5.28) with its parameter list.
    pub(crate) fn unmap(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
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
            let lba = Lba::new(get_be64(d, 0));
            let cnt = get_be32(d, 8) as u64;
            if cnt > MAX_UNMAP_LBA_COUNT {
                return Err(CmdError::invalid_param((8 + 16 * i + 8) as u16, None));
            }
            rw::check_range(lun, lba, cnt)?;
            if cnt > 0 {
                ranges.push((lba, cnt));
            }
        }
        rw::check_writable(lun)?;
        if ranges.is_empty() {
            return Ok(Action::Good);
        }
        Ok(Action::Job(
            Need::Shared(ranges.clone()),
            Job::Unmap { ranges },
        ))
    }

    /// COMPARE AND WRITE (SBC-3 5.2): atomic against every other write to the range.
    pub(crate) fn compare_and_write(
        &mut self,
        ctx: &mut Ctx<'_>,
        data_out: Option<IoBuf>,
    ) -> CmdResult<Action> {
        let lun = ctx.lun;
        let bytes = |b: &rw::BlockCmd, bs| 2 * b.blocks * bs;
        let limit = Limit::Blocks(MAX_CAW_BLOCKS);
        let b = rw::open(lun, &ctx.cdb, &mut ctx.xfer, bytes, |_| Ok(()), limit)?;
        let bs = lun.block_size() as u64;
        let need_len = (2 * b.blocks * bs) as usize;
        if (ctx.edtl as usize) != need_len {
            // SBC-3 5.2: the Data-Out buffer holds exactly the verify and the write instance
            // (2 x NUMBER OF LOGICAL BLOCKS). An expected transfer length that disagrees
            // means the CDB does not describe the data sent: typically a count above 255
            // that wrapped in the one-byte field, which must not be taken as "0 blocks, do
            // nothing". This is checked before the zero-length case for that reason.
            return Err(CmdError::invalid_cdb(13, None));
        }
        if b.blocks == 0 {
            return Ok(Action::Good);
        }
        rw::check_writable(lun)?;
        let have = data_out
            .as_ref()
            .map_or(0, |d| d.as_slice().len())
            .min(ctx.edtl as usize);
        if have < need_len {
            // The Data-Out did not all arrive (the iSCSI layer delivers EDTL bytes).
            return Err(CmdError::invalid_cdb(13, None));
        }
        let data = self.exact(data_out, need_len);
        // One block (what ATS-style locking sends): librbd compares within one 512-byte sector.
        if b.blocks == 1 && lun.bdev().supports(IoKind::CompareAndWrite) {
            let job = Job::DeviceCaw { lba: b.lba, blocks: b.blocks, buf: Some(data) };
            return Ok(Action::Job(Need::Exclusive(b.lba, b.blocks), job));
        }
        Ok(Action::Job(
            Need::Exclusive(b.lba, b.blocks),
            Job::Rmw(Rmw::new(b.lba, b.blocks, data, rmw::compare_and_write)),
        ))
    }

    /// ORWRITE (16) (SBC-3 5.9): read, OR the data in, write; atomic like COMPARE AND WRITE.
    pub(crate) fn orwrite(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let b = rw::open_transfer(lun, &ctx.cdb, &mut ctx.xfer)?;
        rw::check_writable(lun)?;
        let Some((data, blocks)) = self.whole_blocks(ctx, data_out, &b) else {
            return Ok(Action::Good);
        };
        Ok(Action::Job(
            Need::Exclusive(b.lba, blocks),
            Job::Rmw(Rmw::new(b.lba, blocks, data, rmw::or_write)),
        ))
    }

    /// GET LBA STATUS (SBC-3 5.5): from the device's allocation map where it keeps one (a
    /// file's holes, RAM's zeroed blocks), each run of same-state blocks one descriptor,
    /// as many as the allocation length holds. Otherwise blocks that read as zeros are
    /// reported deallocated (LBPRZ: an unmapped block reads as zeros, and a zeroed block is
    /// as good as unmapped), read one window at a time.
    pub(crate) fn get_lba_status(
        &mut self,
        ctx: &mut Ctx<'_>,
        _data_out: Option<IoBuf>,
    ) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let lba = Lba::new(cdb.be64(2));
        let alloc = cdb.be32(10) as usize;
        if lba >= lun.end_lba() {
            return Err(CmdError::lba_out_of_range());
        }
        ctx.xfer = alloc as u64;
        // Descriptors that fit in the allocation length (8-byte header, 16 each).
        let fit = (alloc.saturating_sub(8) / 16).max(1);
        if let Some(map) = lun.bdev().provisioning(lba, lun.end_lba() - lba, fit) {
            let runs = map.map_err(|e| bdev_error(IoKind::Read, &e))?;
            // One more than fits (when the device found it) tells the initiator, through
            // the PARAMETER DATA LENGTH, that there is more.
            let runs: LbaRuns = runs
                .iter()
                .take(fit + 1)
                .map(|r| (r.start, r.blocks, r.deallocated as u8))
                .collect();
            return Ok(Action::Data(lba_status_data(&runs), alloc));
        }
        // Read one window at a time from the starting LBA (see LBA_STATUS_MAX_SCAN_BYTES
        // for how far the scan goes).
        let window = (LBA_STATUS_WINDOW_BYTES / lun.block_size() as u64)
            .max(1)
            .min(lun.end_lba() - lba);
        Ok(Action::Job(
            Need::None,
            Job::LbaStatus {
                lba,
                blocks: window,
                alloc,
                runs: Vec::new(),
                scanned: 0,
            },
        ))
    }

    /// SANITIZE (SBC-3; see the `sanitize` module): validates, then runs the operation over
    /// the whole medium as one job, exclusive of every write.
    pub(crate) fn sanitize(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let cdb = ctx.cdb;
        let len = cdb.be16(7) as u64;
        ctx.xfer = len;
        let p = param(&data_out, len, ctx.edtl);
        let (op, immed, ause) = match sanitize::parse(lun, &cdb, p)? {
            sanitize::Request::ExitFailureMode => {
                let mut st = lun.lock();
                return match st.sanitize {
                    SanitizeState::Failed { ause: true } => {
                        st.sanitize = SanitizeState::Idle;
                        lun.refresh_attn(&st);
                        Ok(Action::Good)
                    }
                    // Without AUSE, only a sanitize operation that completes ends the
                    // failure mode (SBC-3: AUSE "allow unrestricted sanitize exit").
                    SanitizeState::Failed { ause: false } => Err(CmdError::invalid_cdb(1, Some(4))),
                    SanitizeState::Running { .. } => Err(CmdError::sanitize_in_progress(
                        st.sanitize.progress(lun.num_blocks()),
                    )),
                    // No failed sanitize: nothing to exit.
                    SanitizeState::Idle => Ok(Action::Good),
                };
            }
            sanitize::Request::Start { op, immed, ause } => (op, immed, ause),
        };
        rw::check_writable(lun)?;
        {
            let mut st = lun.lock();
            if let SanitizeState::Running { .. } = st.sanitize {
                // Another channel started one since the gate let this command through.
                return Err(CmdError::sanitize_in_progress(
                    st.sanitize.progress(lun.num_blocks()),
                ));
            }
            // From here every other command is refused (the gate), and the failure mode of
            // an earlier sanitize is over once this one completes.
            st.sanitize = SanitizeState::Running {
                op: op.clone(),
                ause,
                pass: 0,
                next: Lba::ZERO,
                owned: true,
            };
            lun.refresh_attn(&st);
        }
        Ok(Action::Job(
            Need::Exclusive(Lba::ZERO, lun.num_blocks()),
            Job::Sanitize(SanitizeJob {
                op,
                ause,
                immed,
                pass: 0,
                next: Lba::ZERO,
                done_to: Lba::ZERO,
                rng: sanitize::Rng::new(),
                buf: None,
                buf_pass: None,
            }),
        ))
    }
}

/// INTERNAL error for a command whose data the iSCSI layer was to ask for piece by piece:
/// it streams plain WRITEs only, so this is a bug there, not the initiator's.
fn not_streamed(ctx: &Ctx<'_>) -> CmdResult<()> {
    if ctx.data_later {
        log::error!("{:?} with its data to be asked for later: not streamable", ctx.cdb.opcode());
        return Err(CmdError::internal());
    }
    Ok(())
}
