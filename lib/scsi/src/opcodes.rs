//! The table of implemented commands. Dispatch and REPORT SUPPORTED OPERATION CODES
//! (SPC-4 6.35) both read it, so what is reported is exactly what is accepted.
//!
//! # Adding a command
//!
//! One row in [`COMMANDS`] and one handler. The row (kept sorted by opcode and service
//! action) gives the opcode, the service action, the name, the CDB usage data, the
//! reservation class, the flags and the handler: a method of `LunChannel` of shape
//! [`Handler`], in `exec/handlers.rs` (block commands) or `exec/handlers/spc.rs` (emulated
//! ones). Dispatch runs the checks every command shares (unit attentions unless
//! [`F_NO_UA`], reservations by the class, sanitize, ALUA, medium with [`F_MEDIUM`]) and
//! calls the handler through the row, without a match on the opcode. A handler of a READ-
//! or WRITE-like command opens with `rw::open` (decode, transfer length, protection field,
//! its own CDB checks, length limit, range); one that writes the medium has [`F_WRITE`] and
//! calls `rw::check_writable` where the command's sense order puts it. A new CDB layout
//! goes in `rw::decode`, a new opcode in `cdb::op`; `offered` says when an LU does not
//! offer a command it implements.

use riser_bdev::IoBuf;

use crate::cdb::{op, put_be16, put_be32, Cdb};
use crate::exec::{Action, Ctx, LunChannel};
use crate::lun::Lun;
use crate::pr::PrClass;
use crate::sense::{CmdError, CmdResult};

/// Needs the medium (NOT READY, MEDIUM NOT PRESENT when a removable medium is ejected).
pub(crate) const F_MEDIUM: u8 = 1;
/// Writes the medium: its handler refuses it when the LUN is write protected
/// (`rw::check_writable`).
pub(crate) const F_WRITE: u8 = 2;
/// Reported without a pending unit attention getting in the way (SAM-5 5.14:
/// INQUIRY, REPORT LUNS, REQUEST SENSE).
pub(crate) const F_NO_UA: u8 = 4;

pub(crate) struct CmdDesc {
    pub opcode: u8,
    pub sa: Option<u8>,
    pub name: &'static str,
    /// CDB usage data (SPC-4 6.35.3) with the service action field left zero.
    pub usage: &'static [u8],
    pub pr: PrClass,
    pub flags: u8,
    /// What runs the command once `dispatch`'s common checks passed.
    pub handler: Handler,
}

/// A command handler (a method of [`LunChannel`], in `exec/handlers.rs` or
/// `exec/handlers/spc.rs`): validates the CDB and its data-out, sets the transfer length
/// in the context, and answers (data, GOOD) or describes the block-level job.
pub(crate) type Handler = fn(&mut LunChannel, &mut Ctx<'_>, Option<IoBuf>) -> CmdResult<Action>;

use PrClass::*;

macro_rules! cmd {
    ($op:expr, $sa:expr, $name:expr, $pr:expr, $flags:expr, $handler:ident, [$($u:expr),*]) => {
        CmdDesc {
            opcode: $op,
            sa: $sa,
            name: $name,
            usage: &[$($u),*],
            pr: $pr,
            flags: $flags,
            handler: LunChannel::$handler,
        }
    };
}

const M: u8 = F_MEDIUM;
const W: u8 = F_MEDIUM | F_WRITE;

/// Every implemented command, sorted by opcode and service action.
pub(crate) static COMMANDS: &[CmdDesc] = &[
    cmd!(
        op::TEST_UNIT_READY,
        None,
        "TEST UNIT READY",
        AllowedPr,
        M,
        test_unit_ready,
        [0x00, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::REQUEST_SENSE,
        None,
        "REQUEST SENSE",
        Allowed,
        F_NO_UA,
        request_sense,
        [0x03, 0x01, 0, 0, 0xFF, 0]
    ),
    cmd!(
        op::READ6,
        None,
        "READ(6)",
        Read,
        M,
        read,
        [0x08, 0x1F, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::WRITE6,
        None,
        "WRITE(6)",
        Write,
        W,
        write,
        [0x0A, 0x1F, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::INQUIRY,
        None,
        "INQUIRY",
        Allowed,
        F_NO_UA,
        inquiry,
        [0x12, 0x01, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::MODE_SELECT6,
        None,
        "MODE SELECT(6)",
        Write,
        0,
        mode_select,
        [0x15, 0x11, 0, 0, 0xFF, 0]
    ),
    cmd!(
        op::RESERVE6,
        None,
        "RESERVE(6)",
        Spc2,
        0,
        reserve,
        [0x16, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::RELEASE6,
        None,
        "RELEASE(6)",
        Spc2,
        0,
        release,
        [0x17, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::MODE_SENSE6,
        None,
        "MODE SENSE(6)",
        ReadState,
        0,
        mode_sense,
        [0x1A, 0x08, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::START_STOP_UNIT,
        None,
        "START STOP UNIT",
        Write,
        0,
        start_stop,
        [0x1B, 0x01, 0, 0x0F, 0xF7, 0]
    ),
    cmd!(
        op::PREVENT_ALLOW,
        None,
        "PREVENT ALLOW MEDIUM REMOVAL",
        Write,
        0,
        prevent_allow,
        [0x1E, 0, 0, 0, 0x03, 0]
    ),
    cmd!(
        op::READ_CAPACITY10,
        None,
        "READ CAPACITY(10)",
        Allowed,
        M,
        read_capacity10,
        [0x25, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0x01, 0]
    ),
    cmd!(
        op::READ10,
        None,
        "READ(10)",
        Read,
        M,
        read,
        [0x28, 0xFA, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::WRITE10,
        None,
        "WRITE(10)",
        Write,
        W,
        write,
        [0x2A, 0xFA, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::WRITE_VERIFY10,
        None,
        "WRITE AND VERIFY(10)",
        Write,
        W,
        write_verify,
        [0x2E, 0xF2, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::VERIFY10,
        None,
        "VERIFY(10)",
        Read,
        M,
        verify,
        [0x2F, 0xF6, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PRE_FETCH10,
        None,
        "PRE-FETCH(10)",
        Read,
        M,
        pre_fetch,
        [0x34, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::SYNCHRONIZE_CACHE10,
        None,
        "SYNCHRONIZE CACHE(10)",
        Write,
        M,
        synchronize_cache,
        [0x35, 0x06, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::READ_DEFECT_DATA10,
        None,
        "READ DEFECT DATA(10)",
        Read,
        M,
        read_defect_data,
        [0x37, 0, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::WRITE_SAME10,
        None,
        "WRITE SAME(10)",
        Write,
        W,
        write_same,
        [0x41, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::UNMAP,
        None,
        "UNMAP",
        Write,
        W,
        unmap,
        [0x42, 0x01, 0, 0, 0, 0, 0x1F, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::SANITIZE,
        Some(crate::sanitize::SA_OVERWRITE),
        "SANITIZE: OVERWRITE",
        Write,
        W,
        sanitize,
        [0x48, 0xA0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::SANITIZE,
        Some(crate::sanitize::SA_BLOCK_ERASE),
        "SANITIZE: BLOCK ERASE",
        Write,
        W,
        sanitize,
        [0x48, 0xA0, 0, 0, 0, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::SANITIZE,
        Some(crate::sanitize::SA_CRYPTO_ERASE),
        "SANITIZE: CRYPTOGRAPHIC ERASE",
        Write,
        W,
        sanitize,
        [0x48, 0xA0, 0, 0, 0, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::SANITIZE,
        Some(crate::sanitize::SA_EXIT_FAILURE_MODE),
        "SANITIZE: EXIT FAILURE MODE",
        Write,
        W,
        sanitize,
        [0x48, 0x80, 0, 0, 0, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::MODE_SELECT10,
        None,
        "MODE SELECT(10)",
        Write,
        0,
        mode_select,
        [0x55, 0x11, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::RESERVE10,
        None,
        "RESERVE(10)",
        Spc2,
        0,
        reserve,
        [0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::RELEASE10,
        None,
        "RELEASE(10)",
        Spc2,
        0,
        release,
        [0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::MODE_SENSE10,
        None,
        "MODE SENSE(10)",
        ReadState,
        0,
        mode_sense,
        [0x5A, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_IN,
        Some(0x00),
        "PERSISTENT RESERVE IN: READ KEYS",
        Pr,
        0,
        pr_in,
        [0x5E, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_IN,
        Some(0x01),
        "PERSISTENT RESERVE IN: READ RESERVATION",
        Pr,
        0,
        pr_in,
        [0x5E, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_IN,
        Some(0x02),
        "PERSISTENT RESERVE IN: REPORT CAPABILITIES",
        Pr,
        0,
        pr_in,
        [0x5E, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_IN,
        Some(0x03),
        "PERSISTENT RESERVE IN: READ FULL STATUS",
        Pr,
        0,
        pr_in,
        [0x5E, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x00),
        "PERSISTENT RESERVE OUT: REGISTER",
        Pr,
        0,
        pr_out,
        [0x5F, 0, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x01),
        "PERSISTENT RESERVE OUT: RESERVE",
        Pr,
        0,
        pr_out,
        [0x5F, 0, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x02),
        "PERSISTENT RESERVE OUT: RELEASE",
        Pr,
        0,
        pr_out,
        [0x5F, 0, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x03),
        "PERSISTENT RESERVE OUT: CLEAR",
        Pr,
        0,
        pr_out,
        [0x5F, 0, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x04),
        "PERSISTENT RESERVE OUT: PREEMPT",
        Pr,
        0,
        pr_out,
        [0x5F, 0, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x05),
        "PERSISTENT RESERVE OUT: PREEMPT AND ABORT",
        Pr,
        0,
        pr_out,
        [0x5F, 0, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x06),
        "PERSISTENT RESERVE OUT: REGISTER AND IGNORE EXISTING KEY",
        Pr,
        0,
        pr_out,
        [0x5F, 0, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x07),
        "PERSISTENT RESERVE OUT: REGISTER AND MOVE",
        Pr,
        0,
        pr_out,
        [0x5F, 0, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]
    ),
    cmd!(
        op::EXTENDED_COPY,
        Some(0x00),
        "EXTENDED COPY(LID1)",
        Write,
        W,
        extended_copy,
        [0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]
    ),
    cmd!(
        op::RECEIVE_COPY_RESULTS,
        Some(op::RCR_COPY_STATUS),
        "RECEIVE COPY RESULTS: COPY STATUS",
        Read,
        0,
        receive_copy_results,
        [0x84, 0, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]
    ),
    cmd!(
        op::RECEIVE_COPY_RESULTS,
        Some(op::RCR_OPERATING_PARAMETERS),
        "RECEIVE COPY RESULTS: OPERATING PARAMETERS",
        Read,
        0,
        receive_copy_results,
        [0x84, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]
    ),
    cmd!(
        op::READ16,
        None,
        "READ(16)",
        Read,
        M,
        read,
        [
            0x88, 0xFA, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0
        ]
    ),
    cmd!(
        op::COMPARE_AND_WRITE,
        None,
        "COMPARE AND WRITE",
        Write,
        W,
        compare_and_write,
        [0x89, 0xFA, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0x1F, 0]
    ),
    cmd!(
        op::WRITE16,
        None,
        "WRITE(16)",
        Write,
        W,
        write,
        [
            0x8A, 0xFA, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0
        ]
    ),
    cmd!(
        op::ORWRITE16,
        None,
        "ORWRITE(16)",
        Write,
        W,
        orwrite,
        [
            0x8B, 0xFA, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0
        ]
    ),
    cmd!(
        op::WRITE_VERIFY16,
        None,
        "WRITE AND VERIFY(16)",
        Write,
        W,
        write_verify,
        [
            0x8E, 0xF2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0
        ]
    ),
    cmd!(
        op::VERIFY16,
        None,
        "VERIFY(16)",
        Read,
        M,
        verify,
        [
            0x8F, 0xF6, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0
        ]
    ),
    cmd!(
        op::PRE_FETCH16,
        None,
        "PRE-FETCH(16)",
        Read,
        M,
        pre_fetch,
        [
            0x90, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0
        ]
    ),
    cmd!(
        op::SYNCHRONIZE_CACHE16,
        None,
        "SYNCHRONIZE CACHE(16)",
        Write,
        M,
        synchronize_cache,
        [
            0x91, 0x06, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0
        ]
    ),
    cmd!(
        op::WRITE_SAME16,
        None,
        "WRITE SAME(16)",
        Write,
        W,
        write_same,
        [
            0x93, 0xF9, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0
        ]
    ),
    cmd!(
        op::WRITE_ATOMIC16,
        None,
        "WRITE ATOMIC(16)",
        Write,
        W,
        write_atomic,
        [0x9C, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF, 0x1F, 0]
    ),
    cmd!(
        op::SERVICE_ACTION_IN16,
        Some(op::SAI_READ_CAPACITY16),
        "READ CAPACITY(16)",
        Allowed,
        M,
        read_capacity16,
        [
            0x9E, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01,
            0
        ]
    ),
    cmd!(
        op::SERVICE_ACTION_IN16,
        Some(op::SAI_GET_LBA_STATUS),
        "GET LBA STATUS",
        Read,
        M,
        get_lba_status,
        [0x9E, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]
    ),
    cmd!(
        op::REPORT_LUNS,
        None,
        "REPORT LUNS",
        Allowed,
        F_NO_UA,
        report_luns,
        [0xA0, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]
    ),
    cmd!(
        op::MAINTENANCE_IN,
        Some(op::MI_REPORT_TARGET_PORT_GROUPS),
        "REPORT TARGET PORT GROUPS",
        Allowed,
        0,
        report_target_port_groups,
        [0xA3, 0xE0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]
    ),
    cmd!(
        op::MAINTENANCE_IN,
        Some(op::MI_REPORT_SUPPORTED_OPCODES),
        "REPORT SUPPORTED OPERATION CODES",
        Allowed,
        0,
        report_supported_opcodes,
        [0xA3, 0, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]
    ),
    cmd!(
        op::READ12,
        None,
        "READ(12)",
        Read,
        M,
        read,
        [0xA8, 0xFA, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0]
    ),
    cmd!(
        op::WRITE12,
        None,
        "WRITE(12)",
        Write,
        W,
        write,
        [0xAA, 0xFA, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0]
    ),
    cmd!(
        op::WRITE_VERIFY12,
        None,
        "WRITE AND VERIFY(12)",
        Write,
        W,
        write_verify,
        [0xAE, 0xF2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0]
    ),
    cmd!(
        op::VERIFY12,
        None,
        "VERIFY(12)",
        Read,
        M,
        verify,
        [0xAF, 0xF6, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0]
    ),
    cmd!(
        op::READ_DEFECT_DATA12,
        None,
        "READ DEFECT DATA(12)",
        Read,
        M,
        read_defect_data,
        [0xB7, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]
    ),
];

/// Whether `lun` offers the command `c`: a few depend on what the LU is configured as
/// (UNMAP and SANITIZE BLOCK ERASE need thin provisioning, SANITIZE OVERWRITE its option).
/// REPORT SUPPORTED OPERATION CODES lists only what is offered; the handlers refuse the rest.
pub(crate) fn offered(c: &CmdDesc, lun: &Lun) -> bool {
    use crate::sanitize::{SA_BLOCK_ERASE, SA_OVERWRITE};
    match (c.opcode, c.sa) {
        (op::UNMAP, _) | (op::SANITIZE, Some(SA_BLOCK_ERASE)) => lun.thin_provisioned(),
        (op::SANITIZE, Some(SA_OVERWRITE)) => lun.config().sanitize_overwrite,
        _ => true,
    }
}

/// The name of the command in `cdb` (e.g. "READ(10)"), for logs; `None` if riser does
/// not implement it.
pub fn command_name(cdb: &Cdb) -> Option<&'static str> {
    lookup(cdb).ok().map(|c| c.name)
}

/// Whether `opcode` is one whose commands are distinguished by a service action.
pub(crate) fn has_service_actions(opcode: u8) -> bool {
    COMMANDS
        .iter()
        .any(|c| c.opcode == opcode && c.sa.is_some())
}

/// For each opcode, the index of its first entry in [`COMMANDS`] (or `u8::MAX`): lookup is
/// one load on the data path instead of a scan.
fn index() -> &'static [u8; 256] {
    static INDEX: std::sync::OnceLock<[u8; 256]> = std::sync::OnceLock::new();
    INDEX.get_or_init(|| {
        let mut ix = [u8::MAX; 256];
        for (i, c) in COMMANDS.iter().enumerate().rev() {
            ix[c.opcode as usize] = i as u8;
        }
        ix
    })
}

/// The descriptor of the command in `cdb`, or INVALID COMMAND OPERATION CODE (or
/// INVALID FIELD IN CDB for an unknown service action of a known opcode).
pub(crate) fn lookup(cdb: &Cdb) -> CmdResult<&'static CmdDesc> {
    let opc = cdb.opcode();
    let first = index()[opc as usize];
    if first == u8::MAX {
        return Err(CmdError::invalid_opcode());
    }
    let sa = cdb.service_action();
    for c in &COMMANDS[first as usize..] {
        if c.opcode != opc {
            break;
        }
        match c.sa {
            None => return Ok(c),
            Some(s) if s == sa => return Ok(c),
            Some(_) => {}
        }
    }
    // A known opcode with a service action riser does not implement (SPC-4):
    // the field pointer names byte 1, as initiators expect for "not supported".
    Err(CmdError::invalid_cdb(1, Some(4)))
}

/// The usage data of `c` with its service action filled in.
fn usage(c: &CmdDesc) -> Vec<u8> {
    let mut u = c.usage.to_vec();
    if let Some(sa) = c.sa {
        u[1] |= sa;
    }
    u
}

/// Command timeouts descriptor (SPC-4 6.35.4): no specific timeouts.
fn timeouts() -> [u8; 12] {
    let mut t = [0u8; 12];
    put_be16(&mut t, 0, 0x0A);
    t
}

/// REPORT SUPPORTED OPERATION CODES (SPC-4 6.35) for `lun`.
pub(crate) fn report_supported_opcodes(lun: &Lun, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    let rctd = cdb.u8(2) & 0x80 != 0;
    let options = cdb.u8(2) & 0x07;
    let req_op = cdb.u8(3);
    let req_sa = cdb.be16(4);
    match options {
        0 => {
            let mut v = vec![0u8; 4];
            for c in COMMANDS.iter().filter(|c| offered(c, lun)) {
                let mut d = [0u8; 8];
                d[0] = c.opcode;
                put_be16(&mut d, 2, c.sa.unwrap_or(0) as u16);
                d[5] = if c.sa.is_some() { 0x01 } else { 0 } | if rctd { 0x02 } else { 0 };
                put_be16(&mut d, 6, c.usage.len() as u16);
                v.extend_from_slice(&d);
                if rctd {
                    v.extend_from_slice(&timeouts());
                }
            }
            let n = (v.len() - 4) as u32;
            put_be32(&mut v, 0, n);
            Ok(v)
        }
        1..=3 => {
            let with_sa = has_service_actions(req_op);
            // 001b: the opcode must not have service actions; 010b: it must.
            if (options == 1 && with_sa) || (options == 2 && !with_sa && known(req_op)) {
                return Err(CmdError::invalid_cdb(2, Some(0)));
            }
            let found = COMMANDS.iter().filter(|c| offered(c, lun)).find(|c| {
                c.opcode == req_op
                    && match c.sa {
                        None => options != 2 && (options != 3 || req_sa == 0),
                        Some(s) => s as u16 == req_sa,
                    }
            });
            let mut v = vec![0u8; 4];
            match found {
                Some(c) => {
                    v[1] = 0x03 | if rctd { 0x80 } else { 0 }; // SUPPORT 011b
                    let u = usage(c);
                    put_be16(&mut v, 2, u.len() as u16);
                    v.extend_from_slice(&u);
                    if rctd {
                        v.extend_from_slice(&timeouts());
                    }
                }
                None => {
                    if options == 2 && !known(req_op) {
                        // An unknown opcode asked with a service action: not supported.
                    }
                    v[1] = 0x01; // SUPPORT 001b: not supported
                }
            }
            Ok(v)
        }
        _ => Err(CmdError::invalid_cdb(2, Some(0))),
    }
}

fn known(opcode: u8) -> bool {
    COMMANDS.iter().any(|c| c.opcode == opcode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_consistent() {
        for w in COMMANDS.windows(2) {
            let a = (w[0].opcode, w[0].sa.unwrap_or(0));
            let b = (w[1].opcode, w[1].sa.unwrap_or(0));
            assert!(a < b, "{} before {}", w[0].name, w[1].name);
        }
        assert!(COMMANDS.len() < 255);
        for c in COMMANDS {
            assert_eq!(c.usage[0], c.opcode, "{}", c.name);
            assert_eq!(
                Some(c.usage.len()),
                crate::cdb::cdb_len(c.opcode),
                "{}",
                c.name
            );
            if c.sa.is_some() {
                assert_eq!(c.usage[1] & 0x1F, 0, "{}", c.name);
            }
        }
    }
}
