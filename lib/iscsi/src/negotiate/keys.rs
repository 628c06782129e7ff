//! One key's answer (RFC 7143 §6.2, §13): when it may be sent, whether it is relevant to
//! this connection, and its result function applied against the target's limits (the key
//! table itself is [`crate::params::KEYS`]).

use super::{Answer, DigestPolicy, KeyPhase, NegotiationError, Negotiator, Transport};
use crate::params::{KeyDef, ResultFn, SessionType, TaskReporting, Use, ValueType};
use crate::text::{encode_bool, parse_bool, parse_list, parse_number, special, Special};

impl Negotiator {
    pub(super) fn answer(
        &mut self,
        phase: KeyPhase,
        def: &'static KeyDef,
        value: &str,
    ) -> Result<Answer, NegotiationError> {
        // When the key may be sent (RFC 7143 §13 "Use").
        match def.use_ {
            Use::Security if phase != KeyPhase::Security => {
                return Err(NegotiationError::SecurityKeyOutOfStage(
                    def.name.to_string(),
                ));
            }
            Use::FullFeatureOnly if phase != KeyPhase::FullFeature => {
                return Ok(Answer::Special(Special::Reject))
            }
            Use::LeadingOnly | Use::InitializeOnly if phase == KeyPhase::FullFeature => {
                return Ok(Answer::Special(Special::Reject));
            }
            _ => {}
        }
        if def.result == ResultFn::External {
            return Ok(Answer::Silent);
        }
        // Keys only a target may send (TargetAlias, TargetAddress, TargetPortalGroupTag).
        if def.senders == crate::params::Senders::Target {
            return Ok(Answer::Special(Special::Reject));
        }
        // The constants are answers, never offers: nothing to negotiate.
        if special(value).is_some() {
            return Ok(Answer::Silent);
        }
        if (def.irrelevant_in_discovery && self.session.session_type == SessionType::Discovery)
            || (def.iser_only && self.transport == Transport::Tcp)
            || (def.use_ == Use::LeadingOnly && !self.leading)
        {
            return Ok(Answer::Special(Special::Irrelevant));
        }
        if let ResultFn::Obsolete(v) = def.result {
            return Ok(Answer::Value(v.to_string()));
        }
        let reject = Answer::Special(Special::Reject);
        let answer = match def.name {
            "HeaderDigest" | "DataDigest" => {
                let policy = if def.name == "HeaderDigest" {
                    self.config.header_digest
                } else {
                    self.config.data_digest
                };
                // RFC 7145 §6.1: no digests with iSER.
                let crc_ok = self.transport == Transport::Tcp && policy != DigestPolicy::Off;
                let none_ok = self.transport == Transport::Iser || policy != DigestPolicy::Required;
                // RFC 7143 §6.2.1: the first offered value we support; unknown ones ignored.
                match parse_list(value)
                    .find(|v| (*v == "CRC32C" && crc_ok) || (*v == "None" && none_ok))
                {
                    Some(v) => {
                        let on = v == "CRC32C";
                        if def.name == "HeaderDigest" {
                            self.conn.header_digest = on;
                        } else {
                            self.conn.data_digest = on;
                        }
                        Answer::Value(v.to_string())
                    }
                    None => reject,
                }
            }
            "AuthMethod" => {
                match parse_list(value).find(|v| self.auth_methods.iter().any(|m| m == v)) {
                    Some(v) => {
                        self.conn.auth_method = Some(v.to_string());
                        Answer::Value(v.to_string())
                    }
                    None => reject,
                }
            }
            "TaskReporting" => match parse_list(value).find(|v| *v == "RFC3720") {
                Some(v) => {
                    self.session.task_reporting = TaskReporting::Rfc3720;
                    Answer::Value(v.to_string())
                }
                None => reject,
            },
            "SessionType" => {
                // Read by the login state machine before negotiation starts; a value it
                // did not accept never gets here.
                if SessionType::parse(value).is_none() {
                    reject
                } else {
                    Answer::Silent
                }
            }
            "InitiatorName" => {
                self.session.initiator_name = value.to_string();
                Answer::Silent
            }
            "InitiatorAlias" => {
                self.session.initiator_alias = Some(value.to_string());
                Answer::Silent
            }
            "TargetName" => {
                self.session.target_name = Some(value.to_string());
                Answer::Silent
            }
            "MaxRecvDataSegmentLength" => match number(def, value) {
                Some(v) => {
                    self.conn.max_send_data_segment_length = v as u32;
                    Answer::Silent
                }
                None => reject,
            },
            _ => match def.value {
                ValueType::Boolean => match parse_bool(value) {
                    Ok(offered) => {
                        Answer::Value(encode_bool(self.boolean(def, offered)).to_string())
                    }
                    Err(_) => reject,
                },
                ValueType::Numeric { .. } | ValueType::NumericOrZero { .. } => {
                    match number(def, value) {
                        Some(offered) => Answer::Value(self.numeric(def, offered).to_string()),
                        None => reject,
                    }
                }
                _ => reject,
            },
        };
        Ok(answer)
    }

    /// Boolean keys: compute, store and return the result.
    pub(super) fn boolean(&mut self, def: &KeyDef, offered: bool) -> bool {
        let (ours, slot): (bool, &mut bool) = match def.name {
            "InitialR2T" => (self.config.initial_r2t, &mut self.session.initial_r2t),
            "ImmediateData" => (self.config.immediate_data, &mut self.session.immediate_data),
            "DataPDUInOrder" => (
                self.config.data_pdu_in_order,
                &mut self.session.data_pdu_in_order,
            ),
            "DataSequenceInOrder" => (
                self.config.data_sequence_in_order,
                &mut self.session.data_sequence_in_order,
            ),
            "RDMAExtensions" => (
                self.transport == Transport::Iser,
                &mut self.session.rdma_extensions,
            ),
            "TaggedBufferForSolicitedDataOnly" => (
                false,
                &mut self.session.tagged_buffer_for_solicited_data_only,
            ),
            "iSERHelloRequired" => (false, &mut self.session.iser_hello_required),
            _ => return offered,
        };
        let result = match def.result {
            ResultFn::And => offered && ours,
            ResultFn::Or => offered || ours,
            _ => offered,
        };
        *slot = result;
        result
    }

    /// Numeric keys: compute, store and return the result.
    pub(super) fn numeric(&mut self, def: &KeyDef, offered: u64) -> u64 {
        let ours: u64 = match def.name {
            "MaxConnections" => self.config.max_connections.into(),
            "MaxBurstLength" => self.config.max_burst_length.into(),
            "FirstBurstLength" => self.config.first_burst_length.into(),
            "DefaultTime2Wait" => self.config.default_time2wait.into(),
            "DefaultTime2Retain" => self.config.default_time2retain.into(),
            "MaxOutstandingR2T" => self.config.max_outstanding_r2t.into(),
            "ErrorRecoveryLevel" => self.config.error_recovery_level.into(),
            "iSCSIProtocolLevel" => 1,
            "TargetRecvDataSegmentLength" => self.config.target_recv_data_segment_length.into(),
            // what the target may send: the initiator's limit is the only one
            "InitiatorRecvDataSegmentLength" => offered,
            "MaxOutstandingUnexpectedPDUs" => self.config.max_outstanding_unexpected_pdus.into(),
            "MaxAHSLength" => self.config.max_ahs_length.into(),
            _ => offered,
        };
        let result = match def.result {
            ResultFn::Min => offered.min(ours),
            ResultFn::Max => offered.max(ours),
            // RFC 7145 §6.5: 0 means no limit.
            ResultFn::MinOrZero => match (offered, ours) {
                (0, x) | (x, 0) => x,
                (a, b) => a.min(b),
            },
            _ => offered,
        };
        self.store_numeric(def.name, result);
        result
    }

    pub(super) fn store_numeric(&mut self, name: &str, v: u64) {
        let s = &mut self.session;
        let c = &mut self.conn;
        // Values were range-checked against the table, so these conversions cannot truncate.
        let v16 = u16::try_from(v).unwrap_or(u16::MAX);
        let v32 = u32::try_from(v).unwrap_or(u32::MAX);
        match name {
            "MaxConnections" => s.max_connections = v16,
            "MaxBurstLength" => s.max_burst_length = v32,
            "FirstBurstLength" => s.first_burst_length = v32,
            "DefaultTime2Wait" => s.default_time2wait = v16,
            "DefaultTime2Retain" => s.default_time2retain = v16,
            "MaxOutstandingR2T" => s.max_outstanding_r2t = v16,
            "ErrorRecoveryLevel" => s.error_recovery_level = u8::try_from(v).unwrap_or(0),
            "iSCSIProtocolLevel" => s.iscsi_protocol_level = u8::try_from(v).unwrap_or(1),
            "TargetRecvDataSegmentLength" => c.target_recv_data_segment_length = v32,
            "InitiatorRecvDataSegmentLength" => c.initiator_recv_data_segment_length = v32,
            "MaxOutstandingUnexpectedPDUs" => s.max_outstanding_unexpected_pdus = v32,
            "MaxAHSLength" => s.max_ahs_length = v16,
            _ => {}
        }
    }

    /// The initiator's answer to one of our offers.
    pub(super) fn take_answer(&mut self, def: &'static KeyDef, value: &str) {
        match def.name {
            "HeaderDigest" => self.conn.header_digest = value == "CRC32C",
            "DataDigest" => self.conn.data_digest = value == "CRC32C",
            "RDMAExtensions" => self.session.rdma_extensions = value == "Yes",
            _ => {
                // Min keys: the answer may only be lower than our offer; anything else
                // (Reject, garbage, higher) leaves our offered value in place.
                if let Some(v) = number(def, value) {
                    let current = match def.name {
                        "MaxBurstLength" => u64::from(self.session.max_burst_length),
                        "FirstBurstLength" => u64::from(self.session.first_burst_length),
                        _ => v,
                    };
                    self.store_numeric(def.name, v.min(current));
                }
            }
        }
    }
}

/// A number within the key's range, or None (answered Reject).
fn number(def: &KeyDef, value: &str) -> Option<u64> {
    let v = parse_number(value).ok()?;
    match def.value {
        ValueType::Numeric { min, max } => (min..=max).contains(&v).then_some(v),
        ValueType::NumericOrZero { min, max } => (v == 0 || (min..=max).contains(&v)).then_some(v),
        _ => None,
    }
}
