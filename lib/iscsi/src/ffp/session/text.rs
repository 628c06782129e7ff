//! Text requests in full-feature phase (RFC 7143 §11.10, §11.11): SendTargets answered by
//! the [`super::TextResponder`], everything else NotUnderstood, long requests and answers in
//! several PDUs.

use super::{Action, Ffp};
use crate::pdu::{Bhs, Lun, Op, Pdu, RejectReason, TextResponse};
use crate::serial::{Itt, Ttt};
use crate::text::{encode_pairs, Pairs};

impl Ffp {
    pub(super) fn on_text(&mut self, t: crate::pdu::TextRequest, data: Vec<u8>) {
        // A continuation of our own long answer (RFC 7143 §11.10.4): empty request, our TTT.
        if let Some((itt, rest)) = self.text_out.take() {
            if itt == t.itt && data.is_empty() {
                return self.send_text_segment(t.itt, t.lun, rest);
            }
        }
        match self.text.push(&data, t.continue_bit) {
            Ok(None) => {
                // More request text follows: answer with an empty response (F=0), and a TTT
                // that the initiator returns with the next part.
                let s = self.next_stat_sn();
                let ttt = self.alloc_ttt();
                self.actions.push_back(Action::Send(Pdu::new(Op::TextResponse(TextResponse {
                    final_bit: false,
                    continue_bit: false,
                    lun: t.lun,
                    itt: t.itt,
                    ttt,
                    stat_sn: s.stat_sn,
                    exp_cmd_sn: s.exp_cmd_sn,
                    max_cmd_sn: s.max_cmd_sn,
                }))));
            }
            Ok(Some(pairs)) => {
                self.text.reset();
                let answer = self.answer_text(&pairs);
                self.send_text_segment(t.itt, t.lun, encode_pairs(&answer));
            }
            Err(e) => {
                self.text.reset();
                log::warn!("bad Text request: {e}");
                self.reject_pdu(&Bhs { total_ahs_length: 0, data_segment_length: 0, op: Op::TextRequest(t) }, RejectReason::ProtocolError);
            }
        }
    }

    pub(super) fn answer_text(&mut self, pairs: &Pairs) -> Pairs {
        let (send_targets, others): (Pairs, Pairs) =
            pairs.iter().cloned().partition(|(k, _)| k == "SendTargets");
        let mut out = Pairs::new();
        if !send_targets.is_empty() {
            if let Some(r) = self.responder.as_mut() {
                out.extend(r.respond(&send_targets));
            }
        }
        // riser renegotiates nothing in full-feature phase (RFC 7143 §6.2: answer what we
        // do not take part in with NotUnderstood).
        out.extend(others.into_iter().map(|(k, _)| (k, "NotUnderstood".to_string())));
        out
    }

    /// Sends the next piece of a Text answer: at most what the initiator receives per PDU
    /// (128 bytes on iSER, see [`crate::ffp::config::ISER_INITIATOR_RECV_DATA_SEGMENT`]); the rest
    /// waits for the initiator's empty continuation request (C=1, RFC 7143 §11.11).
    pub(super) fn send_text_segment(&mut self, itt: Itt, lun: Lun, mut text: Vec<u8>) {
        let max = self.cfg.initiator_mrdsl.max(1) as usize;
        let more = text.len() > max;
        let rest = if more { text.split_off(max) } else { Vec::new() };
        let ttt = if more { self.alloc_ttt() } else { Ttt::RESERVED };
        if more {
            self.text_out = Some((itt, rest));
        }
        let s = self.next_stat_sn();
        self.actions.push_back(Action::Send(Pdu::with_data(
            Op::TextResponse(TextResponse {
                final_bit: !more,
                continue_bit: more,
                lun,
                itt,
                ttt,
                stat_sn: s.stat_sn,
                exp_cmd_sn: s.exp_cmd_sn,
                max_cmd_sn: s.max_cmd_sn,
            }),
            text,
        )));
    }
}
