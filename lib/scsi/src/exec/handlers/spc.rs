//! The handlers of the emulated commands (SPC-4, and the SBC-3 ones answered from the LUN's
//! state): inquiry and capacity data, mode pages, sense, reservations, medium removal,
//! supported operation codes, port groups, EXTENDED COPY and its results.

use riser_bdev::IoBuf;

use crate::exec::*;

impl LunChannel {
    /// TEST UNIT READY (SPC-4 6.47): the medium checks of `dispatch` are all it does.
    pub(crate) fn test_unit_ready(&mut self, _: &mut Ctx<'_>, _: Option<IoBuf>) -> CmdResult<Action> {
        Ok(Action::Good)
    }

    /// REQUEST SENSE (SPC-4 6.29): reports (and clears) a pending unit attention, then a
    /// sanitize in progress (NOT READY with the PROGRESS INDICATION, which is how IMMED
    /// sanitize operations are followed) or failed, else NO SENSE; a removable LUN without
    /// medium reports NOT READY.
    pub(crate) fn request_sense(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let desc = ctx.cdb.u8(1) & 0x01 != 0;
        let lun = ctx.lun;
        let mut sense = Sense::new(SenseKey::NoSense, Asc::NO_ADDITIONAL_SENSE);
        {
            let mut st = lun.lock();
            let n = st.nexus(ctx.nexus.key());
            if !n.ua.is_empty() {
                let asc = n.ua.remove(0);
                sense = Sense::new(SenseKey::UnitAttention, asc);
            } else if st.sanitize.active() {
                // A sanitize in progress (with its progress) or failed (SBC-3 4.11).
                if let Err(e) = sanitize::gate(&st.sanitize, lun.num_blocks(), op::TEST_UNIT_READY, F_MEDIUM) {
                    if let Some(s) = e.sense {
                        sense = s;
                    }
                }
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
    pub(crate) fn start_stop(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
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

    /// INQUIRY (SPC-4 6.6): standard data or a VPD page.
    pub(crate) fn inquiry(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let v = inquiry::inquiry(ctx.lun, ctx.nexus, &ctx.cdb)?;
        Ok(Action::Data(v, ctx.cdb.be16(3) as usize))
    }

    /// READ CAPACITY (10) (SBC-3 5.15).
    pub(crate) fn read_capacity10(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        Ok(Action::Data(inquiry::read_capacity10(ctx.lun, &ctx.cdb)?, 8))
    }

    /// READ CAPACITY (16) (SBC-3 5.16).
    pub(crate) fn read_capacity16(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let v = inquiry::read_capacity16(ctx.lun, &ctx.cdb)?;
        Ok(Action::Data(v, ctx.cdb.be32(10) as usize))
    }

    /// MODE SENSE (6/10) (SPC-4 6.11, 6.12).
    pub(crate) fn mode_sense(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let cdb = ctx.cdb;
        let v = crate::mode::mode_sense(ctx.lun, &cdb)?;
        let alloc = if cdb.opcode() == op::MODE_SENSE6 { cdb.u8(4) as usize } else { cdb.be16(7) as usize };
        Ok(Action::Data(v, alloc))
    }

    /// MODE SELECT (6/10) (SPC-4 6.9, 6.10) with its parameter list.
    pub(crate) fn mode_select(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let cdb = ctx.cdb;
        let len = if cdb.opcode() == op::MODE_SELECT6 { cdb.u8(4) as u64 } else { cdb.be16(7) as u64 };
        ctx.xfer = len;
        let p = param(&data_out, len, ctx.edtl);
        Ok(match crate::mode::mode_select(ctx.lun, ctx.nexus, &cdb, p)? {
            None => Action::Good,
            // Shared mode parameters: changed on a pool worker, polled.
            Some(d) => Action::Job(Need::None, Job::Deferred(d)),
        })
    }

    /// REPORT LUNS (SPC-4 6.33): a target-level command, which the device answers (it
    /// knows the LUN map), so a LUN channel only sees it when used on its own, without a
    /// DeviceChannel.
    pub(crate) fn report_luns(&mut self, _: &mut Ctx<'_>, _: Option<IoBuf>) -> CmdResult<Action> {
        Err(CmdError::invalid_opcode())
    }

    /// REPORT SUPPORTED OPERATION CODES (SPC-4 6.35), from the command table.
    pub(crate) fn report_supported_opcodes(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let v = opcodes::report_supported_opcodes(ctx.lun, &ctx.cdb)?;
        Ok(Action::Data(v, ctx.cdb.be32(6) as usize))
    }

    /// REPORT TARGET PORT GROUPS (SPC-4 6.36).
    pub(crate) fn report_target_port_groups(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let v = report_target_port_groups(ctx.nexus, &ctx.cdb)?;
        Ok(Action::Data(v, ctx.cdb.be32(6) as usize))
    }

    /// PERSISTENT RESERVE IN (SPC-4 6.15).
    pub(crate) fn pr_in(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        Ok(Action::Data(pr::pr_in(ctx.lun, &ctx.cdb)?, ctx.cdb.be16(7) as usize))
    }

    /// PERSISTENT RESERVE OUT (SPC-4 6.16) with its parameter list.
    pub(crate) fn pr_out(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let len = ctx.cdb.be32(5) as u64;
        ctx.xfer = len;
        let p = param(&data_out, len, ctx.edtl);
        match pr::pr_out(ctx.lun, ctx.nexus, &ctx.cdb, p)? {
            pr::PrOutcome::Done => Ok(Action::Good),
            // APTPL file or shared state: finishes on a pool worker, polled.
            pr::PrOutcome::Deferred(d) => Ok(Action::Job(Need::None, Job::Deferred(d))),
        }
    }

    /// RESERVE (6/10) (SPC-2). On a LUN shared by several gateways it finishes on a pool
    /// worker, polled.
    pub(crate) fn reserve(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        Ok(match pr::reserve(ctx.lun, ctx.nexus, &ctx.cdb)? {
            None => Action::Good,
            Some(d) => Action::Job(Need::None, Job::Deferred(d)),
        })
    }

    /// RELEASE (6/10) (SPC-2), like RESERVE.
    pub(crate) fn release(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        Ok(match pr::release(ctx.lun, ctx.nexus, &ctx.cdb)? {
            None => Action::Good,
            Some(d) => Action::Job(Need::None, Job::Deferred(d)),
        })
    }

    /// PREVENT ALLOW MEDIUM REMOVAL (SBC-3 5.13): held per I_T nexus, on a removable
    /// medium only.
    pub(crate) fn prevent_allow(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let prevent = ctx.cdb.u8(4) & 0x03;
        if prevent & 0x02 != 0 {
            // Medium changer prevention is not applicable (SBC-3 PREVENT ALLOW MEDIUM REMOVAL; SPC-4 6.13).
            return Err(CmdError::invalid_cdb(4, Some(1)));
        }
        let mut st = lun.lock();
        st.nexus(ctx.nexus.key()).prevent = prevent != 0 && lun.config().removable;
        Ok(Action::Good)
    }

    /// READ DEFECT DATA (10/12) (SBC-3 5.11, 5.12): an empty list.
    pub(crate) fn read_defect_data(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        Ok(read_defect_data(&ctx.cdb))
    }

    /// EXTENDED COPY (LID1) (SPC-4 6.4): the segments are copied as one job, which holds
    /// their destination ranges like a write.
    pub(crate) fn extended_copy(&mut self, ctx: &mut Ctx<'_>, data_out: Option<IoBuf>) -> CmdResult<Action> {
        let lun = ctx.lun;
        let len = ctx.cdb.be32(10) as u64;
        ctx.xfer = len;
        let p = param(&data_out, len, ctx.edtl);
        let Some(plan) = xcopy::parse(lun, &ctx.cdb, p)? else {
            return Ok(Action::Good);
        };
        rw::check_writable(lun)?;
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
            Job::Copy(CopyJob { segments: plan.segments, idx: 0, pos: 0, chunk: 0, writing: false, copied: 0, record }),
        ))
    }

    /// RECEIVE COPY RESULTS (SPC-4 6.18): COPY STATUS or OPERATING PARAMETERS.
    pub(crate) fn receive_copy_results(&mut self, ctx: &mut Ctx<'_>, _data_out: Option<IoBuf>) -> CmdResult<Action> {
        let v = xcopy::receive_copy_results(ctx.lun, ctx.nexus.key(), &ctx.cdb)?;
        Ok(Action::Data(v, ctx.cdb.be32(10) as usize))
    }
}
