//! Dispatch: the checks every command goes through (unit attentions, reservations,
//! sanitize, medium), then the handler its row of [`opcodes::COMMANDS`] names.

use riser_bdev::IoBuf;

use super::*;
use crate::opcodes::F_NO_UA;

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
        if attn != 0 || !self.has_seen(ctx.nexus.id) {
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
        (desc.handler)(self, ctx, data_out)
    }

    /// Whether nexus `id` has been through [`slow_checks`](Self::slow_checks) here.
    #[inline]
    fn has_seen(&mut self, id: u64) -> bool {
        if self.last_seen == Some(id) {
            return true;
        }
        let seen = self.seen.contains(&id);
        if seen {
            self.last_seen = Some(id);
        }
        seen
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
        st.nexus_seen(ctx.nexus);
        self.seen.insert(ctx.nexus.id);
        let opc = ctx.cdb.opcode();
        // INQUIRY, REPORT LUNS and REQUEST SENSE (F_NO_UA) are not held up by a unit
        // attention (SAM-5 5.14); every other command reports the oldest one and clears it.
        let exempt = desc.as_ref().is_ok_and(|d| d.flags & F_NO_UA != 0);
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
}
