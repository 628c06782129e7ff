//! Sizes of a connection's resources ([`IserConfig`]), from the negotiated keys, and the
//! margins the receive ring and the send slots keep beside the commands.

/// Unexpected PDUs (RFC 7145 §6.7) an initiator may have in flight beside the commands of
/// its CmdSN window: what RFC 7143 delivers immediately, outside the window (NOP-Out pings,
/// TMF requests such as ABORT TASK and LUN RESET, a Text request, a Logout, immediate SCSI
/// commands). Linux isert keeps 6 receives for the same list: NOP-Out (2), Text, TMF (2),
/// Logout. The negotiation declares MaxOutstandingUnexpectedPDUs with the same margin
/// ([`riser_iscsi::negotiate::iser_max_outstanding_unexpected_pdus`]): one constant for both.
pub const IMMEDIATE_PDU_ROOM: usize = riser_iscsi::negotiate::ISER_UNEXPECTED_PDU_MARGIN as usize;
/// Receives for expected PDUs: the NOP-Out answers to the target's own NOP-In pings.
pub const EXPECTED_PDU_ROOM: usize = 2;
/// Send slots beside one SCSI Response per command: NOP-In, Async Message, TMF / Text /
/// Logout responses, Reject.
pub const SEND_ROOM: usize = 8;
/// Data bytes a small send slot takes: a SCSI Response's sense data (2 + 252 bytes), a
/// Reject's quoted header, a short NOP-In echo. Larger PDUs (Text, Login and NOP-In
/// responses with more data) take one of the [`SEND_ROOM`] large slots.
pub const SMALL_SEND_DATA: usize = 512;

/// Sizes of a connection's resources, from the negotiated keys.
#[derive(Clone, Copy, Debug)]
pub struct IserConfig {
    /// Receive buffers: the CmdSN window plus room for immediate PDUs (NOP-Out, TMF,
    /// Logout, Text) and unsolicited Data-Out ([`IserConfig::for_queue_depth`]).
    pub recv_slots: usize,
    /// TargetRecvDataSegmentLength: the largest data segment a received PDU may carry.
    pub target_recv_data_segment_length: usize,
    pub send_slots: usize,
    /// Largest data segment of a PDU the target sends.
    pub initiator_recv_data_segment_length: usize,
    /// RDMA Reads outstanding at once (the initiator depth from the CM exchange).
    pub max_rdma_reads: u32,
    /// The most bytes one RDMA Read or Write moves: larger transfers are split. Well below
    /// any port's max_msg_sz (soft-RoCE: 8 MiB) and the initiators' registrations.
    pub max_rdma_len: usize,
    /// Work requests the send queue holds (the QP's max_send_wr): SENDs, RDMA Writes and
    /// RDMA Reads outstanding together never exceed it.
    pub send_queue_depth: usize,
    /// Both sides allowed Send with Invalidate (iSER CM private data): each SCSI Response
    /// invalidates the STag its command advertised, sparing the initiator a local
    /// invalidation per I/O.
    pub send_invalidate: bool,
    /// iSERHelloRequired=Yes was negotiated (RFC 7145 §6.10; iWARP): the first message of
    /// full-feature phase must be a Hello. No on IB/RoCE, where nobody sends one. Set from
    /// `DatamoverParams::iser_hello_required` by Notice_Key_Values.
    pub hello_required: bool,
    /// TaggedBufferForSolicitedDataOnly as the initiator declared it (RFC 7145 §6.9), None
    /// when it did not send the key (or when that is not known: see
    /// [`Datamover::notice_key_values`](riser_iscsi::ffp::Datamover::notice_key_values)). It says where the Write STag's buffer starts, so where
    /// the RDMA Reads of solicited data go:
    ///
    /// * `Some(false)`, the RFC's default: the buffer holds all the write data, immediate and
    ///   unsolicited included: solicited byte N (of the whole data) is at Write Base Offset + N.
    /// * `Some(true)`: it holds the solicited data only: byte N is at Write Base Offset +
    ///   N - (immediate and unsolicited bytes received).
    /// * `None`: as `Some(true)`. Linux ib_iser, libiscsi and riser-perf never send the key
    ///   yet advertise the solicited-only layout (write_va = buffer + unsolicited length);
    ///   reading their silence as the RFC's No would shift every write with immediate data.
    pub tagged_buffer_for_solicited_data_only: Option<bool>,
}

impl IserConfig {
    /// The resources of a connection whose session may have `queue_depth` commands
    /// outstanding (the CmdSN window MaxCmdSN - ExpCmdSN + 1 the target opens: the login's
    /// `ResourceKeys::queue_depth`), with `unsolicited_data_out` Data-Out PDUs each command
    /// may send unsolicited (0 with InitialR2T=Yes, which riser always negotiates; else
    /// ceil((FirstBurstLength - immediate data) / TargetRecvDataSegmentLength)). Every SEND
    /// of the initiator must find a posted receive (else RNR NAKs and stalls), so
    ///
    /// * receive ring = queue_depth × (1 + unsolicited_data_out) (a command's immediate data
    ///   rides in its own SEND) + [`IMMEDIATE_PDU_ROOM`] + [`EXPECTED_PDU_ROOM`];
    /// * send slots = queue_depth + [`SEND_ROOM`] (a response per command in one pass).
    ///
    /// The rest is [`IserConfig::default`]; the caller sets what the CM exchange decided
    /// (`max_rdma_reads`, `send_invalidate`, `send_queue_depth`).
    pub fn for_queue_depth(queue_depth: u32, unsolicited_data_out: u32) -> IserConfig {
        let qd = queue_depth.max(1) as usize;
        let unexpected = qd.saturating_mul(1 + unsolicited_data_out as usize).saturating_add(IMMEDIATE_PDU_ROOM);
        IserConfig { recv_slots: unexpected + EXPECTED_PDU_ROOM, send_slots: qd + SEND_ROOM, ..IserConfig::default() }
    }

    /// What the target can declare as MaxOutstandingUnexpectedPDUs (RFC 7145 §6.7) with this
    /// receive ring: every receive but those kept for expected PDUs. With
    /// [`IserConfig::for_queue_depth`] that is queue_depth × (1 + unsolicited_data_out) +
    /// [`IMMEDIATE_PDU_ROOM`].
    pub fn max_outstanding_unexpected_pdus(&self) -> u32 {
        u32::try_from(self.recv_slots.saturating_sub(EXPECTED_PDU_ROOM).max(2)).unwrap_or(u32::MAX)
    }

    /// Receive work requests the QP must allow: the ring, plus the login receive that may
    /// still be posted when the ring goes in (Allocate_Connection_Resources happens during
    /// login).
    pub fn recv_wr(&self) -> u32 {
        u32::try_from(self.recv_slots + 1).unwrap_or(u32::MAX)
    }
}

impl Default for IserConfig {
    fn default() -> Self {
        IserConfig {
            recv_slots: 160,
            target_recv_data_segment_length: 8192,
            send_slots: 160,
            initiator_recv_data_segment_length: 8192,
            max_rdma_reads: 16,
            max_rdma_len: 1 << 20,
            send_queue_depth: 1024,
            send_invalidate: false,
            hello_required: false,
            tagged_buffer_for_solicited_data_only: None,
        }
    }
}
