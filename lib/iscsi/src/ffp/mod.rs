//! Full-feature phase: the sans-IO connection state machine and the Datamover trait.

pub mod datamover;
pub mod session;

pub use datamover::{Datamover, DatamoverParams, DmEvent, GetData, PutData, SnState};
pub use session::{
    Action, CmdWindow, Ffp, FfpConfig, Residual, SharedWindow, ScsiDone, ScsiRequest, TextResponder,
    STATUS_CHECK_CONDITION, STATUS_GOOD,
};
