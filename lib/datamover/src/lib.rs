//! Datamovers: the transports below the iSCSI layer, each implementing
//! [`riser_iscsi::ffp::Datamover`] (RFC 5047).
//!
//! * [`tcp`]: traditional iSCSI on a byte stream: Data-In, R2T and Data-Out PDUs, digests.
//! * [`iser`]: iSCSI Extensions for RDMA (RFC 7145).
//! * `mem` (feature `test-util`): in memory, for tests of everything above the datamover.

pub mod iser;
#[cfg(any(test, feature = "test-util"))]
pub mod mem;
pub mod tcp;

pub use iser::portal::IserPortal;
pub use tcp::portal::TcpPortal;
pub use tcp::TcpDatamover;

use std::collections::VecDeque;

use riser_bdev::IoBuf;
use riser_iscsi::serial::Itt;

/// Get_Data outcomes waiting for the next poll: (task, its buffer, the failure if any).
pub(crate) type Settled = VecDeque<(Itt, IoBuf, Option<&'static str>)>;

/// Takes task `itt`'s outcomes out of `settled` (Deallocate_Task_Resources); returns its
/// buffer, if one was there.
pub(crate) fn take_settled(settled: &mut Settled, itt: Itt) -> Option<IoBuf> {
    if !settled.iter().any(|(i, ..)| *i == itt) {
        return None;
    }
    let mut buf = None;
    let mut kept = VecDeque::with_capacity(settled.len());
    for (i, b, reason) in settled.drain(..) {
        if i == itt {
            buf.get_or_insert(b);
        } else {
            kept.push_back((i, b, reason));
        }
    }
    *settled = kept;
    buf
}
