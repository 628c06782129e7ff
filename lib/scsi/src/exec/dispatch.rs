//! Dispatch: the checks every command goes through (unit attentions, reservations,
//! sanitize, medium), then the handler of its operation code.

use riser_bdev::{IoBuf, Lba};

use super::*;

impl LunChannel {
    /// Runs the checks every command goes through (unit attentions, reservations,
    /// medium) and the command's handler.
    pub(super) fn dispatch(
        &mut self,
        ctx: &mut Ctx<'_>,
        data_out: Option<IoBuf>,
    ) -> CmdResult<Action> {
        let lun = ctx.lun;
        lun.check_capacity();
        let desc = opcodes::lookup(&ctx.cdb);
        let attn = lun.attn.load(std::sync::atomic::Ordering::Acquire);
        if attn != 0 || !self.seen.contains(&ctx.nexus.id) {
            self.slow_checks(ctx, &desc, attn)?;
        }
        let desc = desc?;
        // Asymmetric access state of the port the command came through (SPC-4 5.15.2.4),
        // after unit attentions so ASYMMETRIC ACCESS STATE CHANGED is seen first.
        if let Some(alua) = &ctx.nexus.alua {
            alua.check(ctx.nexus.target_port_group, &ctx.cdb)?;
        }
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
                Ok(match crate::mode::mode_select(&lun, ctx.nexus, &cdb, p)? {
                    None => Action::Good,
                    // Shared mode parameters: changed on a pool worker, polled.
                    Some(d) => Action::Job(Need::None, Job::Deferred(d)),
                })
            }
            // A target-level command: the device answers it (it knows the LUN map), so a
            // LUN channel only sees it when used on its own, without a DeviceChannel.
            op::REPORT_LUNS => Err(CmdError::invalid_opcode()),
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
                match pr::pr_out(&lun, ctx.nexus, &cdb, p)? {
                    pr::PrOutcome::Done => Ok(Action::Good),
                    // APTPL file or shared state: finishes on a pool worker, polled.
                    pr::PrOutcome::Deferred(d) => Ok(Action::Job(Need::None, Job::Deferred(d))),
                }
            }
            // On a LUN shared by several gateways these finish on a pool worker, polled.
            op::RESERVE6 | op::RESERVE10 => Ok(match pr::reserve(&lun, ctx.nexus, &cdb)? {
                None => Action::Good,
                Some(d) => Action::Job(Need::None, Job::Deferred(d)),
            }),
            op::RELEASE6 | op::RELEASE10 => Ok(match pr::release(&lun, ctx.nexus, &cdb)? {
                None => Action::Good,
                Some(d) => Action::Job(Need::None, Job::Deferred(d)),
            }),
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
