//! The Data-Out timeout: write data the initiator was asked for (Get_Data: R2Ts on TCP,
//! RDMA Reads on iSER, a streamed write's pieces included) or promised (unsolicited Data-Out
//! still due) that has not all come within `data_out_timeout` fails its command, and the
//! buffer it pins goes back to the budget. An initiator that never answers its R2Ts holds at
//! most its fair share of the budget (riser-buf), and only this long.
//!
//! What the command gets: CHECK CONDITION, ABORTED COMMAND, INITIATOR RESPONSE TIMEOUT
//! (4Bh/06h, SPC-4: "the initiator did not send the data in time"), after the datamover is
//! told to forget the task (Deallocate_Task_Resources, which hands the buffer back). RFC 7143
//! leaves the reaction to the target; at ErrorRecoveryLevel 0 there is no recovery R2T, and
//! riser ends a broken Data-Out sequence the same way (CHECK CONDITION, the connection lives
//! on). LIO closes the connection on its Data-Out timeout at ERL 0, SPDK has none; failing
//! only the command keeps the initiator's other commands going and is what SCSI initiators
//! retry (Linux retries ABORTED COMMAND), while a late Data-Out for the failed task is
//! dropped quietly (its tag is unknown by then). A peer that stopped answering altogether is
//! the NOP-In timeout's.
//!
//! The clock of a task starts at the first timer tick ([`Ffp::on_timer`], every 100 ms in
//! the server) that sees it waiting for data, and restarts with each Get_Data.

use std::time::Instant;

use riser_scsi::{Asc, Sense, SenseKey};

use super::{Ffp, TaskState};
use crate::serial::Itt;

/// ABORTED COMMAND, INITIATOR RESPONSE TIMEOUT (SPC-4).
const SENSE_INITIATOR_RESPONSE_TIMEOUT: Sense = Sense::new(SenseKey::AbortedCommand, Asc::new(0x4B, 0x06));

impl Ffp {
    /// Fails the commands whose write data is overdue (see the module docs). Called from
    /// [`Ffp::on_timer`]; cheap: one pass over the connection's tasks, allocating only when
    /// one expires.
    pub(super) fn check_data_out(&mut self, now: Instant) {
        let limit = self.cfg.data_out_timeout;
        if limit.is_zero() {
            return;
        }
        let mut expired: Vec<Itt> = Vec::new();
        for (itt, t) in self.tasks.iter_mut() {
            let Some(since) = t.state.data_out_clock() else {
                continue;
            };
            match *since {
                None => *since = Some(now),
                Some(since) if now.duration_since(since) >= limit => expired.push(*itt),
                Some(_) => {}
            }
        }
        for itt in expired {
            self.data_out_timed_out(itt);
        }
    }

    fn data_out_timed_out(&mut self, itt: Itt) {
        let Some(t) = self.tasks.remove(&itt) else { return };
        let edtl = t.cmd.expected_data_transfer_length;
        let (what, outstanding) = match &t.state {
            TaskState::Unsolicited { .. } => ("unsolicited Data-Out", t.data.expected),
            TaskState::Streaming { want } => {
                let (offset, len) = want.as_ref().map_or((0, 0), |w| (w.offset, w.len));
                ("solicited data", (offset + len).saturating_sub(offset.max(t.data.received)))
            }
            _ => ("solicited data", edtl.saturating_sub(t.data.received)),
        };
        log::warn!(
            "initiator {}: task {:#x} (EDTL {edtl}): {outstanding} bytes of {what} not in after {} s (data_out_timeout): \
             the command ends with CHECK CONDITION (ABORTED COMMAND, INITIATOR RESPONSE TIMEOUT) and its buffers go back",
            self.cfg.initiator_name,
            itt.0,
            self.cfg.data_out_timeout.as_secs_f32(),
        );
        // The datamover forgets its Get_Data and gives the buffer back; a streamed write's
        // command, in the SCSI layer waiting for this piece, ends without a completion.
        // Through abort_action: the ITT stays in use until the abort is taken, and a task in
        // the SCSI layer keeps its place under the task cap until its result comes back.
        self.abort_action(itt, t.lun, t.state.in_scsi());
        self.respond_check(itt, t.cmd.immediate, SENSE_INITIATOR_RESPONSE_TIMEOUT, edtl, false);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use riser_buf::Pool;

    use super::super::{Action, Ffp, FfpConfig};
    use crate::pdu::{Op, Pdu};
    use crate::serial::{Itt, Sn};
    use crate::testing::{read10, scsi_command};

    const TIMEOUT: Duration = Duration::from_secs(2);

    fn write_cmd(itt: u32, cmd_sn: u32, edtl: u32, final_bit: bool) -> Pdu {
        let mut c = scsi_command(Itt(itt), Sn(cmd_sn), false, true, edtl, &read10(0, 1));
        c.final_bit = final_bit;
        Pdu::new(Op::ScsiCommand(c))
    }

    fn ffp(cfg: FfpConfig) -> (Ffp, std::time::Instant, &'static Pool) {
        let now = std::time::Instant::now();
        let mut f = Ffp::new(cfg, Sn(10), Sn(100), now);
        let pool: &'static Pool = Box::leak(Box::new(Pool::new(riser_buf::MIN_MAX_BYTES)));
        f.set_pool(pool);
        (f, now, pool)
    }

    fn drain(f: &mut Ffp) -> Vec<Action> {
        std::iter::from_fn(|| f.poll_action()).collect()
    }

    /// (ITT, status, sense key, ASC, ASCQ) of a SCSI Response among `a`.
    fn check_condition(a: &[Action]) -> Option<(Itt, u8, u8, u8, u8)> {
        a.iter().find_map(|x| match x {
            Action::Send(p) => match p.op() {
                Op::ScsiResponse(r) => {
                    let s = p.data.get(2..).unwrap_or_default();
                    Some((r.itt, r.status, s.get(2)? & 0x0f, *s.get(12)?, *s.get(13)?))
                }
                _ => None,
            },
            _ => None,
        })
    }

    #[test]
    fn an_unanswered_get_data_fails_its_command_after_the_timeout_and_the_buffer_comes_back() {
        let cfg = FfpConfig {
            data_out_timeout: TIMEOUT,
            nop_in_interval: Duration::ZERO,
            largest_write: 32 << 20,
            initiator_name: "iqn.x:silent".into(),
            ..Default::default()
        };
        let (mut f, now, pool) = ffp(cfg);
        f.on_pdu(write_cmd(1, 10, 1 << 20, true), now);
        let Some(Action::GetData(g)) = drain(&mut f).into_iter().next() else { panic!("expected GetData") };
        assert_eq!(pool.stats().in_use_bytes, 1 << 20);
        let max_before = f.window().get().max_cmd_sn;
        // The first tick starts the clock; nothing happens before the timeout.
        f.on_timer(now + Duration::from_millis(100));
        f.on_timer(now + Duration::from_millis(2000));
        assert!(drain(&mut f).is_empty());
        f.on_timer(now + Duration::from_millis(2100));
        let a = drain(&mut f);
        assert!(matches!(a.first(), Some(Action::Abort { itt: Itt(1), .. })), "the datamover forgets the task first");
        assert_eq!(check_condition(&a), Some((Itt(1), 2, 0x0b, 0x4b, 0x06)));
        assert_eq!(f.active_tasks(), 0);
        assert_eq!(f.window().get().max_cmd_sn, max_before.next(), "the command's slot is free again");
        // The datamover's Deallocate_Task_Resources hands the buffer back: dropped, it is
        // back in the budget.
        drop(g);
        assert_eq!(pool.stats().in_use_bytes, 0);
        // Data arriving late for the failed task changes nothing.
        f.on_data_ready(Itt(1), riser_buf::IoBuf::empty());
        assert!(drain(&mut f).is_empty());
    }

    #[test]
    fn each_get_data_restarts_the_clock_and_answered_data_never_times_out() {
        let cfg = FfpConfig { data_out_timeout: TIMEOUT, nop_in_interval: Duration::ZERO, largest_write: 32 << 20, ..Default::default() };
        let (mut f, now, _) = ffp(cfg);
        f.on_pdu(write_cmd(1, 10, 8192, true), now);
        let Some(Action::GetData(g)) = drain(&mut f).into_iter().next() else { panic!("expected GetData") };
        f.on_timer(now + Duration::from_millis(100));
        f.on_data_ready(g.itt, g.buf);
        assert!(matches!(&drain(&mut f)[..], [Action::Execute(_)]));
        // Executing in the SCSI layer: no Data-Out is due, however long it takes.
        f.on_timer(now + Duration::from_secs(60));
        assert!(drain(&mut f).is_empty());
    }

    #[test]
    fn promised_unsolicited_data_out_that_never_comes_fails_the_command() {
        let cfg = FfpConfig { data_out_timeout: TIMEOUT, nop_in_interval: Duration::ZERO, initial_r2t: false, ..Default::default() };
        let (mut f, now, _) = ffp(cfg);
        // F=0 without immediate data: a first burst of unsolicited Data-Out is due.
        f.on_pdu(write_cmd(1, 10, 65536, false), now);
        assert!(drain(&mut f).is_empty());
        f.on_timer(now + Duration::from_millis(100));
        f.on_timer(now + Duration::from_millis(2200));
        assert_eq!(check_condition(&drain(&mut f)), Some((Itt(1), 2, 0x0b, 0x4b, 0x06)));
    }

    #[test]
    fn a_zero_timeout_never_fires() {
        let cfg = FfpConfig { data_out_timeout: Duration::ZERO, nop_in_interval: Duration::ZERO, ..Default::default() };
        let (mut f, now, _) = ffp(cfg);
        f.on_pdu(write_cmd(1, 10, 8192, true), now);
        drain(&mut f);
        f.on_timer(now + Duration::from_secs(1));
        f.on_timer(now + Duration::from_secs(3600));
        assert!(!drain(&mut f).iter().any(|a| matches!(a, Action::Abort { .. })));
        assert_eq!(f.active_tasks(), 1);
    }
}
