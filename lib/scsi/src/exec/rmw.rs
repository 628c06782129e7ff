//! Read-modify-write jobs: COMPARE AND WRITE (SBC-3 5.2) and ORWRITE (16). Both read the
//! range, combine what was read with the Data-Out buffer, and write the result back,
//! holding the range exclusively (`Need::Exclusive`) so that no other write lands in
//! between. They differ only in the combine step.

use riser_bdev::{IoBuf, IoKind, Lba};

use super::{first_difference, Job, LunChannel, Op};
use crate::sense::{CmdError, CmdResult};

/// The combine step: turns the blocks read (`cur`) into the blocks to write, from the
/// command's Data-Out buffer (`data`). An error ends the command and nothing is written.
pub(crate) type Combine = fn(cur: &mut [u8], data: &[u8]) -> CmdResult<()>;

/// A read-modify-write of `[lba, lba + blocks)`.
pub(crate) struct Rmw {
    pub lba: Lba,
    pub blocks: u64,
    /// The Data-Out buffer, exactly as long as `combine` expects.
    pub data: IoBuf,
    /// The read is done and the write is in flight.
    pub writing: bool,
    pub combine: Combine,
}

impl Rmw {
    pub fn new(lba: Lba, blocks: u64, data: IoBuf, combine: Combine) -> Rmw {
        Rmw {
            lba,
            blocks,
            data,
            writing: false,
            combine,
        }
    }
}

/// COMPARE AND WRITE: `data` holds the verify instance then the write instance, each as
/// long as `cur`. A difference fails with MISCOMPARE, whose INFORMATION field is the
/// offset of the first differing byte in the Data-Out buffer (SBC-3 5.2).
pub(super) fn compare_and_write(cur: &mut [u8], data: &[u8]) -> CmdResult<()> {
    let n = cur.len();
    let (Some(verify), Some(write)) = (data.get(..n), data.get(n..2 * n)) else {
        return Err(CmdError::internal());
    };
    if let Some(off) = first_difference(cur, verify) {
        return Err(CmdError::miscompare(off as u64));
    }
    cur.copy_from_slice(write);
    Ok(())
}

/// ORWRITE: each byte read is ORed with the Data-Out byte at the same offset.
pub(super) fn or_write(cur: &mut [u8], data: &[u8]) -> CmdResult<()> {
    for (x, y) in cur.iter_mut().zip(data) {
        *x |= *y;
    }
    Ok(())
}

impl LunChannel {
    /// The read-modify-write in `slot` finished a step: after the read (`buf` holds the
    /// blocks), combine and write them back; after the write, the command is done.
    pub(super) fn rmw_next(&mut self, slot: usize, buf: Option<IoBuf>) {
        let Some(Op {
            job: Job::Rmw(j), ..
        }) = self.ops[slot].as_mut()
        else {
            return;
        };
        if j.writing {
            return self.finish(slot);
        }
        let Some(mut r) = buf else {
            return self.fail(slot, CmdError::internal());
        };
        if let Err(e) = (j.combine)(r.as_mut_slice(), j.data.as_slice()) {
            return self.fail(slot, e);
        }
        j.writing = true;
        let (lba, blocks) = (j.lba, j.blocks);
        self.submit_io(slot, IoKind::Write, lba, blocks, Some(r));
    }
}
