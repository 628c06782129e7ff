//! The Datamover Interface of RFC 5047 as a Rust trait.
//!
//! The iSCSI layer ([`super::Ffp`]) never touches a socket or a queue pair: the connection
//! driver hands what it asks for to a `Datamover` (TCP: PDUs on a byte stream; iSER: SENDs
//! and RDMA operations) and feeds the datamover's events back. Both datamovers implement
//! this trait and the iSCSI layer is the same for both.

use riser_buf::{Account, IoBuf, Pool};

use crate::pdu::{Bhs, Lun, Op, Pdu, RejectReason};
use crate::serial::{Itt, Sn};

/// The sequence numbers the target puts in every PDU it sends (RFC 7143 §11.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SnState {
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
}

/// Put_Data (RFC 5047 §3.2): move `len` bytes of `buf` to the initiator for task `itt`,
/// then deliver `response` (the SCSI Response). TCP sends Data-In PDUs and may fold a GOOD
/// status without sense into the final Data-In (RFC 7143 §11.7.3); iSER RDMA-Writes to the
/// Read STag and chains the response SEND.
///
/// A large read may come in pieces: several Put_Data of one task in increasing, contiguous
/// `offset` order (each starts where the last ended), all but the last with `response: None`.
/// A read sent whole is one Put_Data with `offset: 0` and `response: Some`.
pub struct PutData {
    pub itt: Itt,
    pub lun: Lun,
    pub buf: IoBuf,
    /// Bytes of `buf` to transfer (the residual is in the final piece's `response`).
    pub len: u32,
    /// The command's buffer offset of `buf[0]`: 0 for a read sent whole; a streamed read's
    /// later pieces start further on.
    pub offset: u32,
    /// `Some` (its StatSN already assigned): this is the task's last (or only) piece, the SCSI
    /// Response follows the data. `None`: more Put_Data of this task follow; no status here.
    pub response: Option<Pdu>,
    /// Sequence numbers for Data-In PDUs that do not carry status.
    pub sn: SnState,
}

/// Get_Data (RFC 5047 §3.3): fetch solicited write data `[offset, offset+len)` of task `itt`
/// into `buf[offset-base .. offset-base+len]`. TCP sends R2Ts and collects Data-Out PDUs;
/// iSER issues RDMA Reads from the Write STag. One Get_Data per task at a time: a large write
/// may be fetched piece by piece, the next Get_Data after the last one's DataReady.
pub struct GetData {
    pub itt: Itt,
    pub lun: Lun,
    pub buf: IoBuf,
    /// Solicit the command's bytes `[offset, offset+len)` ...
    pub offset: u32,
    pub len: u32,
    /// ... into `buf[offset-base ..]`: `base` is the command offset of `buf[0]` (0: the
    /// buffer holds the whole command's data).
    pub base: u32,
    /// More Get_Data of this task follow after this one's DataReady: TCP keeps the task's
    /// R2TSN going across them (RFC 7143 §11.8.2: R2TSN numbers every R2T of the task).
    pub more: bool,
    pub sn: SnState,
}

/// What a datamover reports (RFC 5047's notifications).
pub enum DmEvent {
    /// Control_Notify: a control-type PDU arrived (everything but solicited Data-Out).
    Control(Pdu),
    /// Control_Notify of a SCSI Command (a write) whose immediate data the datamover copied
    /// straight into `buf`, the task's write buffer of EDTL bytes (or its first piece's)
    /// taken with [`WriteBuffers::take_now`]: the data is `buf[..DataSegmentLength]`,
    /// `pdu.data` is empty.
    Command { pdu: Pdu, buf: IoBuf },
    /// Data_Completion_Notify: the data asked for with Get_Data is in `buf`.
    DataReady { itt: Itt, buf: IoBuf },
    /// Solicited data could not be obtained (bad DataSN or offset, digest error, RDMA error):
    /// the command fails with CHECK CONDITION; the connection goes on.
    DataFailed { itt: Itt, buf: IoBuf, reason: &'static str },
    /// Send a Reject quoting this header (a datamover-level protocol error on a data PDU).
    Reject { header: [u8; 48], reason: RejectReason },
    /// Connection_Terminate_Notify: the connection is gone (peer closed, fatal error).
    Terminated(String),
}

/// Negotiated values a datamover needs (Notice_Key_Values, RFC 5047 §3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatamoverParams {
    /// Largest data segment the initiator accepts (its MaxRecvDataSegmentLength, or
    /// InitiatorRecvDataSegmentLength on iSER).
    pub initiator_max_recv_data_segment_length: u32,
    /// Largest data segment the target accepts.
    pub target_max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_outstanding_r2t: u32,
    pub header_digest: bool,
    pub data_digest: bool,
    /// iSER, TaggedBufferForSolicitedDataOnly (RFC 7145 §6.9) as negotiated: true, the Write
    /// STag's buffer holds the solicited data only (the first RDMA Read starts at its Base
    /// Offset); false (the default), it holds all the command's data, the unsolicited part
    /// (immediate data, unsolicited Data-Out) included.
    pub tagged_buffer_for_solicited_data_only: bool,
    /// iSER, iSERHelloRequired (RFC 7145 §6.10) as negotiated: true, the Hello / HelloReply
    /// exchange is required, the initiator's first message in full-feature phase is a Hello.
    pub iser_hello_required: bool,
}

impl Default for DatamoverParams {
    fn default() -> Self {
        DatamoverParams {
            initiator_max_recv_data_segment_length: 8192,
            target_max_recv_data_segment_length: 8192,
            max_burst_length: 262144,
            first_burst_length: 65536,
            max_outstanding_r2t: 1,
            header_digest: false,
            data_digest: false,
            tagged_buffer_for_solicited_data_only: false,
            iser_hello_required: false,
        }
    }
}

/// Where a datamover takes a write's buffer for its immediate data (RFC 5047 leaves the
/// buffers to the datamover's side): the connection's pool and account, so that the buffer
/// is budgeted and charged as the iSCSI layer's own would be. Given by the connection driver
/// ([`Datamover::set_write_buffers`]); without it a datamover delivers immediate data in the
/// PDU's segment.
#[derive(Clone)]
pub struct WriteBuffers {
    pub pool: &'static Pool,
    pub account: Account,
    /// The largest write taken (larger ones are refused by the iSCSI layer).
    pub largest_write: u32,
    /// Writes with more than this many bytes after their immediate data are streamed in
    /// pieces of this size ([`super::Ffp::set_write_stream_chunk`]): their immediate data
    /// goes into the buffer of their first piece, not one of EDTL bytes. 0: none.
    pub stream_above: u32,
}

impl WriteBuffers {
    /// `(buffer length, immediate bytes)` of a SCSI Command whose immediate data should go
    /// straight into a write buffer: a write with some, not all, of its data immediate (a
    /// write that is all immediate data keeps its segment as its buffer, no copy at all
    /// there). The buffer is the task's (EDTL bytes), or its first piece's when the write
    /// streams ([`Self::stream_above`]).
    pub fn wants(&self, bhs: &Bhs) -> Option<(u32, u32)> {
        let Op::ScsiCommand(c) = &bhs.op else { return None };
        let (edtl, imm) = (c.expected_data_transfer_length, bhs.data_segment_length);
        if !(c.write && imm > 0 && imm < edtl && edtl <= self.largest_write) {
            return None;
        }
        let streams = self.stream_above > 0 && edtl - imm > self.stream_above && imm <= self.stream_above;
        Some((if streams { self.stream_above } else { edtl }, imm))
    }

    /// The write buffer of `len` bytes ([`Self::wants`]), taken now if the budget has room
    /// and nobody waits before it ([`Pool::try_alloc_now_for`]); else `None`: the immediate
    /// data waits in its segment while the iSCSI layer queues the task for its buffer.
    pub fn take_now(&self, len: u32) -> Option<IoBuf> {
        self.pool.try_alloc_now_for(len as usize, &self.account)
    }
}

/// Payload bytes a datamover copied with the CPU between the I/O buffers ([`IoBuf`]) and
/// the wire, by direction; what the NIC moves by DMA (RDMA Read/Write, SEND from or into the
/// buffer itself) and the kernel's own socket copies are not counted. `iscsi_get_stats`
/// shows the sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Read data (Put_Data) copied on its way out.
    pub read_bytes: u64,
    /// Solicited write data (Get_Data) copied on its way in.
    pub solicited_bytes: u64,
    /// Unsolicited write data (immediate data, unsolicited Data-Out) copied on its way in,
    /// once: out of the receive buffer (iSER) or the framer (TCP), into the task's write
    /// buffer when the budget had room for it, else into the PDU's segment.
    pub unsolicited_bytes: u64,
    /// Unsolicited write data copied a second time, out of the segment it waited in into the
    /// task's write buffer (counted by the iSCSI layer, [`super::Ffp::staged_bytes`]): the
    /// budget had no room for the buffer when the data came, or it came in several PDUs
    /// (unsolicited Data-Out).
    pub staged_bytes: u64,
}

impl std::ops::AddAssign for CopyStats {
    fn add_assign(&mut self, o: CopyStats) {
        self.read_bytes += o.read_bytes;
        self.solicited_bytes += o.solicited_bytes;
        self.unsolicited_bytes += o.unsolicited_bytes;
        self.staged_bytes += o.staged_bytes;
    }
}

/// What a datamover holds for the initiator that the transport has not taken yet
/// ([`Datamover::tx_backlog`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxBacklog {
    /// Queued bytes outside budgeted I/O buffers: headers, NOP-In echoes, Rejects, text
    /// responses, sense data (read data in the tasks' buffers is counted by the buffer budget).
    pub unbudgeted: usize,
    /// All queued bytes, read data in the tasks' buffers included.
    pub total: usize,
    /// Bytes handed to the transport since the connection started: while something is
    /// queued and this does not move, the initiator is taking nothing.
    pub sent: u64,
}

/// How much a datamover may queue for sending before it stops receiving
/// ([`Datamover::limit_tx_queue`]): an initiator that sends requests (NOP-Out pings, PDUs
/// that earn a Reject) and never reads the answers fills the kernel's socket buffers, not
/// riser's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxLimit {
    /// Receiving stops while more than this many unbudgeted bytes are queued
    /// ([`TxBacklog::unbudgeted`]).
    pub unbudgeted: usize,
    /// ... or more than this many bytes in all ([`TxBacklog::total`]): a backstop above
    /// any connection's share of the buffer budget.
    pub total: usize,
}

/// Default of `max_tx_queue_bytes` (`iscsi_set_options`): 1 MiB. That is 4 times the
/// largest PDU an initiator can make riser answer outside the buffer budget (the NOP-In echo
/// of a ping of riser's MaxRecvDataSegmentLength, 256 KiB); far more than a healthy
/// connection queues besides read data (the Data-In headers of 32 MiB of read data, a
/// connection's share of the default budget, are 192 KiB at a MaxRecvDataSegmentLength of
/// 8 KiB; a SCSI Response is 48 bytes); and small enough that a thousand connections that
/// stop reading hold about 1 GiB, not without bound.
pub const DEFAULT_MAX_TX_QUEUE_BYTES: usize = 1 << 20;

impl TxLimit {
    /// The limits for an unbudgeted bound of `bytes`: the total bound is 64 times that
    /// (64 MiB by default, above a connection's fair share of the default buffer budget, so
    /// it binds only if budgeted data were queued outside the budget).
    pub fn new(bytes: usize) -> TxLimit {
        TxLimit { unbudgeted: bytes, total: bytes.saturating_mul(64) }
    }

    /// Whether `b` is over these limits (receiving should wait).
    pub fn exceeded_by(&self, b: &TxBacklog) -> bool {
        b.unbudgeted > self.unbudgeted || b.total > self.total
    }
}

impl Default for TxLimit {
    fn default() -> Self {
        TxLimit::new(DEFAULT_MAX_TX_QUEUE_BYTES)
    }
}

/// The RFC 5047 primitives riser uses. One instance per connection, owned by one reactor.
pub trait Datamover {
    /// Send_Control: a control-type PDU.
    fn send_control(&mut self, pdu: Pdu);
    /// Put_Data, then the response.
    fn put_data(&mut self, req: PutData);
    /// Get_Data.
    fn get_data(&mut self, req: GetData);
    /// Notice_Key_Values: called once at the switch to full-feature phase.
    fn notice_key_values(&mut self, params: DatamoverParams);
    /// Deallocate_Task_Resources: forget task `itt` (aborted); returns its buffer, if the
    /// datamover held one, so nothing leaks.
    fn deallocate_task_resources(&mut self, itt: Itt) -> Option<IoBuf>;
    /// Connection_Terminate: flush what is queued (best effort) and close.
    fn connection_terminate(&mut self);
    /// Makes progress (receive, send, complete); appends events; returns work done.
    fn poll(&mut self, events: &mut Vec<DmEvent>) -> usize;
    /// Pushes out what was queued since the last poll, at the end of a reactor pass; a
    /// datamover may leave receiving for the next [`poll`](Self::poll) (TCP does: one receive
    /// per connection and pass is enough, a second one mostly finds nothing). Appends events;
    /// returns work done.
    fn flush(&mut self, events: &mut Vec<DmEvent>) -> usize {
        self.poll(events)
    }
    /// Whether everything queued has been handed to the transport.
    fn idle(&self) -> bool;
    /// Where to take write buffers for immediate data (see [`WriteBuffers`]); called once,
    /// before full-feature phase. A datamover that ignores it delivers immediate data in
    /// the PDU's segment.
    fn set_write_buffers(&mut self, wb: WriteBuffers) {
        drop(wb);
    }
    /// Payload bytes copied so far (see [`CopyStats`]).
    fn copies(&self) -> CopyStats {
        CopyStats::default()
    }
    /// Takes back the data segment of a PDU this datamover delivered, its bytes used, for
    /// reuse (no allocation per PDU). Dropping it instead is always correct.
    fn recycle(&mut self, segment: Vec<u8>) {
        drop(segment);
    }
    /// What is queued for the initiator and not yet taken by the transport; the connection
    /// closes one whose queue has not moved for NOP-In timeout. A datamover whose queue is
    /// bounded otherwise reports nothing.
    fn tx_backlog(&self) -> TxBacklog {
        TxBacklog::default()
    }
    /// Stop receiving while more than `limit` is queued for sending, and go on once the
    /// initiator has taken enough of it (see [`TxLimit`]). A datamover whose queue is bounded
    /// otherwise ignores it.
    fn limit_tx_queue(&mut self, limit: TxLimit) {
        let _ = limit;
    }
    /// Whether [`poll`](Self::poll) would provably find nothing this pass: nothing to read
    /// (the reactor's readiness check found the socket unreadable), nothing held to
    /// deliver, nothing queued to send, no close in progress. The driver then skips the
    /// connection's pass. When in doubt, `false` (the default: always poll).
    fn quiet(&self) -> bool {
        false
    }
}

/// A boxed datamover (the server holds each transport's datamover as a trait object).
impl<T: Datamover + ?Sized> Datamover for Box<T> {
    fn send_control(&mut self, pdu: Pdu) {
        (**self).send_control(pdu)
    }
    fn put_data(&mut self, req: PutData) {
        (**self).put_data(req)
    }
    fn get_data(&mut self, req: GetData) {
        (**self).get_data(req)
    }
    fn notice_key_values(&mut self, params: DatamoverParams) {
        (**self).notice_key_values(params)
    }
    fn deallocate_task_resources(&mut self, itt: Itt) -> Option<IoBuf> {
        (**self).deallocate_task_resources(itt)
    }
    fn connection_terminate(&mut self) {
        (**self).connection_terminate()
    }
    fn poll(&mut self, events: &mut Vec<DmEvent>) -> usize {
        (**self).poll(events)
    }
    fn flush(&mut self, events: &mut Vec<DmEvent>) -> usize {
        (**self).flush(events)
    }
    fn idle(&self) -> bool {
        (**self).idle()
    }
    fn set_write_buffers(&mut self, wb: WriteBuffers) {
        (**self).set_write_buffers(wb)
    }
    fn copies(&self) -> CopyStats {
        (**self).copies()
    }
    fn recycle(&mut self, segment: Vec<u8>) {
        (**self).recycle(segment)
    }
    fn quiet(&self) -> bool {
        (**self).quiet()
    }
    fn tx_backlog(&self) -> TxBacklog {
        (**self).tx_backlog()
    }
    fn limit_tx_queue(&mut self, limit: TxLimit) {
        (**self).limit_tx_queue(limit)
    }
}
