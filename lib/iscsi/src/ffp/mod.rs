//! Full-feature phase: the sans-IO connection state machine, the Datamover trait, and the
//! configuration a connection runs with (from its login's outcome).

pub mod config;
pub mod datamover;
pub mod session;

pub use config::{connection_config, FfpConfig, TargetLimits, ISER_INITIATOR_RECV_DATA_SEGMENT, LARGEST_WRITE};
pub use datamover::{CopyStats, Datamover, DatamoverParams, DmEvent, GetData, PutData, SnState, TxBacklog, TxLimit, WriteBuffers, DEFAULT_MAX_TX_QUEUE_BYTES};
pub use session::{
    lun_id, Action, CmdWindow, DataOut, Ffp, Residual, ScsiRequest, ScsiResult, SharedWindow, TaskEvent, TextResponder,
    STATUS_CHECK_CONDITION, STATUS_GOOD, STATUS_TASK_SET_FULL,
};
