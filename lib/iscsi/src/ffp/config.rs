//! What a connection runs with in full-feature phase, in one place: [`connection_config`]
//! turns a completed login ([`LoginOutcome`]: the negotiated keys) and what the target's
//! configuration adds ([`TargetLimits`]) into the iSCSI layer's [`FfpConfig`] and the
//! datamover's [`DatamoverParams`] (Notice_Key_Values, RFC 5047 §3.5).

use std::time::Duration;

use super::datamover::DatamoverParams;
use crate::login::LoginOutcome;
use crate::negotiate::Transport;
use crate::params::SessionType;

/// Negotiated and configured values the full-feature phase runs with.
#[derive(Clone, Debug)]
pub struct FfpConfig {
    pub cid: u16,
    /// Commands the target accepts at once (the CmdSN window).
    pub queue_depth: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    /// Largest data segment the initiator accepts.
    pub initiator_mrdsl: u32,
    /// Largest data segment the target accepts (the datamover enforces it on receive).
    pub target_mrdsl: u32,
    /// Send a NOP-In ping after this much silence (zero: never).
    pub nop_in_interval: Duration,
    /// Drop the connection when a ping stays unanswered this long.
    pub nop_timeout: Duration,
    /// Discovery sessions accept only Text (SendTargets), NOP and Logout.
    pub discovery: bool,
    /// Largest write (EDTL) accepted; larger ones get CHECK CONDITION.
    pub largest_write: u32,
    /// A Get_Data (R2Ts, RDMA Reads) not completed in this long fails its command: the
    /// buffer it pins goes back to the budget (see [`super::Ffp::on_timer`]). Zero: never.
    pub data_out_timeout: Duration,
    /// The initiator's name, for log lines.
    pub initiator_name: String,
}

/// The default Data-Out timeout (`iscsi_set_options`' `data_out_timeout`, seconds): longer
/// than a healthy initiator needs for the largest burst on a slow link, shorter than the
/// 30 s Linux's SCSI layer waits before it aborts the command itself.
pub const DEFAULT_DATA_OUT_TIMEOUT: Duration = Duration::from_secs(20);

impl Default for FfpConfig {
    fn default() -> Self {
        FfpConfig {
            cid: 0,
            queue_depth: 64,
            immediate_data: true,
            initial_r2t: true,
            first_burst_length: 65536,
            max_burst_length: 262144,
            initiator_mrdsl: 8192,
            target_mrdsl: 8192,
            nop_in_interval: Duration::from_secs(30),
            nop_timeout: Duration::from_secs(60),
            discovery: false,
            largest_write: 16 << 20,
            data_out_timeout: DEFAULT_DATA_OUT_TIMEOUT,
            initiator_name: String::new(),
        }
    }
}

/// The largest write a command may carry: the SCSI layer's MAXIMUM TRANSFER LENGTH (Block
/// Limits VPD page), so the iSCSI layer never buffers a write the SCSI layer would refuse.
pub const LARGEST_WRITE: u32 = riser_scsi::MAX_TRANSFER_BYTES as u32;
const _: () = assert!(riser_scsi::MAX_TRANSFER_BYTES <= u32::MAX as u64);

/// The most data the target puts in one full-feature PDU of its own (a NOP-In echo) on an
/// iSER connection, whatever InitiatorRecvDataSegmentLength says.
///
/// iSER initiators receive full-feature control PDUs into small buffers: the Linux
/// initiator (`ib_iser`) and libiscsi post receive buffers with room for 128 bytes of data
/// segment after the iSER header and the BHS (`ISER_RECV_DATA_SEG_LEN`; login PDUs have
/// larger ones), whatever InitiatorRecvDataSegmentLength was negotiated. A larger SEND
/// overruns the posted receive and breaks the connection, so the iSCSI layer keeps what it
/// sends within 128 bytes. The datamover still gets the negotiated value (its
/// [`DatamoverParams::initiator_max_recv_data_segment_length`]).
pub const ISER_INITIATOR_RECV_DATA_SEGMENT: u32 = 128;

/// What the target's configuration contributes to a connection's full-feature phase; all
/// else comes from the keys the login negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetLimits {
    /// The CmdSN window: the target node's queue depth (for a discovery session, which has no
    /// node, the server's discovery depth).
    pub queue_depth: u32,
    /// Send a NOP-In ping after this much silence (zero: never).
    pub nop_in_interval: Duration,
    /// Drop the connection when a ping stays unanswered this long.
    pub nop_timeout: Duration,
    /// Largest write (EDTL) accepted: normally [`LARGEST_WRITE`].
    pub largest_write: u32,
    /// Fail a command whose solicited data has not all come in this long (zero: never).
    pub data_out_timeout: Duration,
}

impl TargetLimits {
    /// Limits with the usual largest write ([`LARGEST_WRITE`]) and Data-Out timeout
    /// ([`DEFAULT_DATA_OUT_TIMEOUT`]).
    pub fn new(queue_depth: u32, nop_in_interval: Duration, nop_timeout: Duration) -> TargetLimits {
        TargetLimits { queue_depth, nop_in_interval, nop_timeout, largest_write: LARGEST_WRITE, data_out_timeout: DEFAULT_DATA_OUT_TIMEOUT }
    }
}

/// The full-feature configuration of a connection that completed `outcome` on `transport`.
///
/// The data segment limits depend on the transport: on TCP they are MaxRecvDataSegmentLength
/// (each side's own declaration), on iSER the iSER keys TargetRecvDataSegmentLength and
/// InitiatorRecvDataSegmentLength (RFC 7145 §6.2), and what the iSCSI layer itself sends on
/// iSER is capped at [`ISER_INITIATOR_RECV_DATA_SEGMENT`] (128 bytes, see there).
pub fn connection_config(outcome: &LoginOutcome, transport: Transport, limits: &TargetLimits) -> (FfpConfig, DatamoverParams) {
    let s = &outcome.session;
    let c = &outcome.connection;
    let iser = transport == Transport::Iser;
    let ffp = FfpConfig {
        cid: outcome.identity.cid,
        queue_depth: limits.queue_depth,
        immediate_data: s.immediate_data,
        initial_r2t: s.initial_r2t,
        first_burst_length: s.first_burst_length,
        max_burst_length: s.max_burst_length,
        initiator_mrdsl: if iser { c.send_limit(true).min(ISER_INITIATOR_RECV_DATA_SEGMENT) } else { c.send_limit(false) },
        target_mrdsl: c.recv_limit(iser),
        nop_in_interval: limits.nop_in_interval,
        nop_timeout: limits.nop_timeout,
        discovery: s.session_type == SessionType::Discovery,
        largest_write: limits.largest_write,
        data_out_timeout: limits.data_out_timeout,
        initiator_name: outcome.identity.initiator_name.clone(),
    };
    let dm = DatamoverParams {
        initiator_max_recv_data_segment_length: c.send_limit(iser),
        target_max_recv_data_segment_length: c.recv_limit(iser),
        max_burst_length: s.max_burst_length,
        first_burst_length: s.first_burst_length,
        max_outstanding_r2t: u32::from(s.max_outstanding_r2t),
        header_digest: c.header_digest,
        data_digest: c.data_digest,
        // RFC 7145 §6.9, §6.10: the datamover applies them (RDMA Read offsets, the Hello).
        tagged_buffer_for_solicited_data_only: iser && s.tagged_buffer_for_solicited_data_only,
        iser_hello_required: iser && s.iser_hello_required,
    };
    (ffp, dm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::login::{LoginIdentity, SessionDecision};
    use crate::negotiate::{Negotiator, TargetConfig};
    use crate::params::{ConnectionParams, SessionParams};
    use crate::pdu::Isid;
    use crate::serial::Sn;

    fn outcome(transport: Transport, session: SessionParams, connection: ConnectionParams) -> LoginOutcome {
        let session_type = session.session_type;
        LoginOutcome {
            identity: LoginIdentity {
                initiator_name: "iqn.2024-01.io.riser:init".into(),
                initiator_alias: None,
                target_name: session.target_name.clone(),
                session_type,
                isid: Isid([0x80, 0, 0, 0, 0, 1]),
                tsih: 0,
                cid: 7,
                initiator_address: None,
                portal_group_tag: 1,
                transport,
            },
            target_alias: None,
            decision: SessionDecision::New { tsih: 3 },
            session,
            connection,
            negotiator: Negotiator::new(TargetConfig::default(), transport, session_type, true, None),
            stat_sn: Sn(1),
            exp_cmd_sn: Sn(1),
            max_cmd_sn: Sn(64),
        }
    }

    fn limits() -> TargetLimits {
        TargetLimits::new(128, Duration::from_secs(30), Duration::from_secs(60))
    }

    #[test]
    fn tcp_session_uses_max_recv_data_segment_lengths() {
        let s = SessionParams {
            target_name: Some("iqn.2024-01.io.riser:disk".into()),
            initial_r2t: false,
            immediate_data: true,
            max_burst_length: 1 << 20,
            first_burst_length: 65536,
            max_outstanding_r2t: 4,
            ..SessionParams::default()
        };
        let c = ConnectionParams {
            header_digest: true,
            data_digest: false,
            max_recv_data_segment_length: 262144,
            max_send_data_segment_length: 65536,
            ..ConnectionParams::default()
        };
        let (f, d) = connection_config(&outcome(Transport::Tcp, s, c), Transport::Tcp, &limits());
        assert_eq!((f.cid, f.queue_depth, f.discovery), (7, 128, false));
        assert_eq!((f.immediate_data, f.initial_r2t, f.first_burst_length, f.max_burst_length), (true, false, 65536, 1 << 20));
        assert_eq!((f.initiator_mrdsl, f.target_mrdsl), (65536, 262144));
        assert_eq!((f.nop_in_interval, f.nop_timeout), (Duration::from_secs(30), Duration::from_secs(60)));
        assert_eq!(f.largest_write, riser_scsi::MAX_TRANSFER_BYTES as u32);
        assert_eq!((f.data_out_timeout, f.initiator_name.as_str()), (DEFAULT_DATA_OUT_TIMEOUT, "iqn.2024-01.io.riser:init"));
        assert_eq!(
            d,
            DatamoverParams {
                initiator_max_recv_data_segment_length: 65536,
                target_max_recv_data_segment_length: 262144,
                max_burst_length: 1 << 20,
                first_burst_length: 65536,
                max_outstanding_r2t: 4,
                header_digest: true,
                data_digest: false,
                tagged_buffer_for_solicited_data_only: false,
                iser_hello_required: false,
            }
        );
    }

    #[test]
    fn iser_session_uses_the_iser_keys_and_caps_what_the_target_sends_at_128() {
        let s = SessionParams {
            target_name: Some("iqn.2024-01.io.riser:disk".into()),
            rdma_extensions: true,
            max_burst_length: 1 << 20,
            first_burst_length: 65536,
            ..SessionParams::default()
        };
        let c = ConnectionParams {
            // MaxRecvDataSegmentLength means nothing on iSER (RFC 7145 §6.2).
            max_recv_data_segment_length: 262144,
            max_send_data_segment_length: 262144,
            target_recv_data_segment_length: 16384,
            initiator_recv_data_segment_length: 8192,
            ..ConnectionParams::default()
        };
        let (f, d) = connection_config(&outcome(Transport::Iser, s, c), Transport::Iser, &limits());
        assert_eq!((f.initiator_mrdsl, f.target_mrdsl), (128, 16384));
        assert_eq!((d.initiator_max_recv_data_segment_length, d.target_max_recv_data_segment_length), (8192, 16384));
        assert!(!f.discovery && !d.header_digest && !d.data_digest);
        assert_eq!((d.max_burst_length, d.first_burst_length, d.max_outstanding_r2t), (1 << 20, 65536, 1));
    }

    #[test]
    fn iser_keys_of_rfc_7145_reach_the_datamover() {
        let s = SessionParams {
            target_name: Some("iqn.2024-01.io.riser:disk".into()),
            rdma_extensions: true,
            tagged_buffer_for_solicited_data_only: true,
            iser_hello_required: true,
            ..SessionParams::default()
        };
        let (_, d) = connection_config(&outcome(Transport::Iser, s.clone(), ConnectionParams::default()), Transport::Iser, &limits());
        assert!(d.tagged_buffer_for_solicited_data_only && d.iser_hello_required);
        // the RFC defaults (No, No) when the initiator never sent the keys
        let plain = SessionParams { rdma_extensions: true, ..SessionParams::default() };
        let (_, d) = connection_config(&outcome(Transport::Iser, plain, ConnectionParams::default()), Transport::Iser, &limits());
        assert!(!d.tagged_buffer_for_solicited_data_only && !d.iser_hello_required);
        // iSER keys mean nothing on TCP
        let (_, d) = connection_config(&outcome(Transport::Tcp, s, ConnectionParams::default()), Transport::Tcp, &limits());
        assert!(!d.tagged_buffer_for_solicited_data_only && !d.iser_hello_required);
        // from the keys as an initiator sends them, through the negotiation
        let mut n = Negotiator::new(TargetConfig::default(), Transport::Iser, SessionType::Normal, true, None);
        let keys = [("RDMAExtensions", "Yes"), ("TaggedBufferForSolicitedDataOnly", "Yes"), ("iSERHelloRequired", "Yes")];
        let keys: Vec<(String, String)> = keys.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        n.respond(crate::negotiate::KeyPhase::Operational, &keys).unwrap();
        let o = outcome(Transport::Iser, n.session().clone(), n.connection().clone());
        let (_, d) = connection_config(&o, Transport::Iser, &limits());
        assert!(d.tagged_buffer_for_solicited_data_only && d.iser_hello_required);
    }

    #[test]
    fn discovery_session() {
        let s = SessionParams { session_type: SessionType::Discovery, ..SessionParams::default() };
        let c = ConnectionParams { max_send_data_segment_length: 32768, ..ConnectionParams::default() };
        let l = TargetLimits { queue_depth: 8, nop_in_interval: Duration::ZERO, ..limits() };
        let (f, d) = connection_config(&outcome(Transport::Tcp, s, c), Transport::Tcp, &l);
        assert!(f.discovery);
        assert_eq!((f.queue_depth, f.nop_in_interval, f.initiator_mrdsl), (8, Duration::ZERO, 32768));
        assert_eq!(d.initiator_max_recv_data_segment_length, 32768);
    }
}
