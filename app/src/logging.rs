//! riser's log: the filter (`--log-level`, `RISER_LOG`, then SPDK's `log_set_level` RPC), the
//! line format, and journald's native stream format when systemd captures stderr.
//!
//! One sink, stderr. On a terminal or a file each line carries riser's own timestamp; under
//! systemd (`JOURNAL_STREAM` names stderr's device and inode) a line starts with its syslog
//! priority instead (`<3>` error ... `<7>` debug, sd-daemon(3)), so journald keeps the levels
//! and adds its own time.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use log::{Level, LevelFilter, Log, Metadata, Record};
use riser_rpc::params::{LogSetLevel, NoParams};
use riser_rpc::{RpcError, RpcRegistry};
use serde_json::Value;

/// SPDK's log levels (spdk/log.h), the names its `log_*_level` RPCs take and give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpdkLevel {
    Error = 1,
    Warn = 2,
    Notice = 3,
    Info = 4,
    Debug = 5,
}

impl SpdkLevel {
    const ALL: [SpdkLevel; 5] = [SpdkLevel::Error, SpdkLevel::Warn, SpdkLevel::Notice, SpdkLevel::Info, SpdkLevel::Debug];

    /// As SPDK parses it: case-insensitive, "WARN" and "WARNING" both.
    pub fn parse(name: &str) -> Option<SpdkLevel> {
        let n = name.to_ascii_uppercase();
        Some(match n.as_str() {
            "ERROR" => SpdkLevel::Error,
            "WARN" | "WARNING" => SpdkLevel::Warn,
            "NOTICE" => SpdkLevel::Notice,
            "INFO" => SpdkLevel::Info,
            "DEBUG" => SpdkLevel::Debug,
            _ => return None,
        })
    }

    /// The name `log_get_level` answers (SPDK's `_log_get_level_name`).
    pub fn name(self) -> &'static str {
        match self {
            SpdkLevel::Error => "ERROR",
            SpdkLevel::Warn => "WARNING",
            SpdkLevel::Notice => "NOTICE",
            SpdkLevel::Info => "INFO",
            SpdkLevel::Debug => "DEBUG",
        }
    }

    /// The `log` crate has no NOTICE: riser's info lines are notices (ready, config loaded,
    /// logins), so NOTICE and INFO both let them through.
    pub fn filter(self) -> LevelFilter {
        match self {
            SpdkLevel::Error => LevelFilter::Error,
            SpdkLevel::Warn => LevelFilter::Warn,
            SpdkLevel::Notice | SpdkLevel::Info => LevelFilter::Info,
            SpdkLevel::Debug => LevelFilter::Debug,
        }
    }

    /// The SPDK name closest to a `log` filter (`--log-level trace` reads as DEBUG).
    pub fn of_filter(f: LevelFilter) -> SpdkLevel {
        match f {
            LevelFilter::Off | LevelFilter::Error => SpdkLevel::Error,
            LevelFilter::Warn => SpdkLevel::Warn,
            LevelFilter::Info => SpdkLevel::Info,
            LevelFilter::Debug | LevelFilter::Trace => SpdkLevel::Debug,
        }
    }

    fn from_u8(v: u8) -> Option<SpdkLevel> {
        SpdkLevel::ALL.into_iter().find(|l| *l as u8 == v)
    }
}

/// The syslog priority of a level, as journald reads it from a `<N>` line prefix.
pub fn syslog_priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// Whether `journal_stream` (the `JOURNAL_STREAM` variable, "DEV:INODE") names the file
/// `dev`/`ino`: systemd sets it for the stream it connects to stdout/stderr, and a child that
/// inherits the variable but writes elsewhere must not use the journal's format.
pub fn journal_stream_matches(journal_stream: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.trim().split_once(':') else {
        return false;
    };
    matches!((d.parse::<u64>(), i.parse::<u64>()), (Ok(d), Ok(i)) if d == dev && i == ino)
}

/// Whether journald captures stderr (an fstat of a duplicate of fd 2, no unsafe code).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(var) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some(var) = var.to_str() else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match std::fs::File::from(fd).metadata() {
        Ok(m) => journal_stream_matches(var, m.dev(), m.ino()),
        Err(_) => false,
    }
}

/// Writes one record in journald's stream format: every line of the message gets the
/// priority prefix (journald makes one entry per line), no timestamp.
pub fn write_journal_line(out: &mut impl Write, record: &Record<'_>) -> std::io::Result<()> {
    let prio = syslog_priority(record.level());
    let text = record.args().to_string();
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or_default();
    writeln!(out, "<{prio}>{}: {first}", record.target())?;
    for line in lines {
        writeln!(out, "<{prio}>{line}")?;
    }
    Ok(())
}

/// 0: the startup filter; else the [`SpdkLevel`] set by `log_set_level` (one global level).
static RPC_LEVEL: AtomicU8 = AtomicU8::new(0);

struct RiserLogger {
    /// `--log-level`, then `RISER_LOG`'s directives (env_logger's syntax: `riser_server=debug`).
    startup: env_filter::Filter,
    /// Formats and writes (its own filter lets everything through: ours decides).
    printer: env_logger::Logger,
}

impl RiserLogger {
    fn passes(&self, metadata: &Metadata<'_>) -> bool {
        match SpdkLevel::from_u8(RPC_LEVEL.load(Ordering::Relaxed)) {
            Some(l) => metadata.level() <= l.filter(),
            None => self.startup.enabled(metadata),
        }
    }
}

impl Log for RiserLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.passes(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        let through = match SpdkLevel::from_u8(RPC_LEVEL.load(Ordering::Relaxed)) {
            Some(l) => record.level() <= l.filter(),
            None => self.startup.matches(record),
        };
        if through {
            self.printer.log(record);
        }
    }

    fn flush(&self) {
        self.printer.flush();
    }
}

static STARTUP_MAX: OnceLock<LevelFilter> = OnceLock::new();

/// Installs riser's logger: `level` (`--log-level`) then `RISER_LOG`'s directives.
pub fn init_logging(level: &str) {
    let mut filter = env_filter::Builder::new();
    filter.parse(level);
    if let Ok(directives) = std::env::var("RISER_LOG") {
        filter.parse(&directives);
    }
    let startup = filter.build();
    let mut printer = env_logger::Builder::new();
    printer.filter_level(LevelFilter::Trace);
    if stderr_is_journal() {
        printer.write_style(env_logger::WriteStyle::Never).format(write_journal_line);
    } else {
        printer.format_timestamp_millis();
    }
    let max = startup.filter();
    let _ = STARTUP_MAX.set(max);
    let logger = RiserLogger { startup, printer: printer.build() };
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(max);
    }
}

/// The level `log_get_level` reports: the RPC's, else the startup filter's most verbose.
pub fn current_level() -> SpdkLevel {
    SpdkLevel::from_u8(RPC_LEVEL.load(Ordering::Relaxed))
        .unwrap_or_else(|| SpdkLevel::of_filter(STARTUP_MAX.get().copied().unwrap_or(LevelFilter::Info)))
}

/// One level for every module from now on (RISER_LOG's per-module directives are dropped).
pub fn set_level(level: SpdkLevel) {
    RPC_LEVEL.store(level as u8, Ordering::Relaxed);
    log::set_max_level(level.filter());
}

fn set_level_rpc(p: LogSetLevel) -> Result<Value, RpcError> {
    let level = SpdkLevel::parse(&p.level)
        .ok_or_else(|| RpcError::invalid_params(format!("invalid log level {:?}: ERROR, WARNING (or WARN), NOTICE, INFO or DEBUG", p.level)))?;
    set_level(level);
    log::info!("log level set to {}", level.name());
    Ok(Value::Bool(true))
}

/// SPDK's `log_set_level` / `log_get_level`, and `log_set_print_level` /
/// `log_get_print_level`: SPDK filters syslog and stderr apart; riser has one sink (stderr,
/// the journal under systemd), so both pairs set and read the same level.
pub fn register(reg: &mut RpcRegistry) {
    reg.add("log_set_level", set_level_rpc);
    reg.add("log_set_print_level", set_level_rpc);
    reg.add("log_get_level", |_: NoParams| Ok(Value::from(current_level().name())));
    reg.add("log_get_print_level", |_: NoParams| Ok(Value::from(current_level().name())));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdk_level_names() {
        for (name, level) in [
            ("ERROR", SpdkLevel::Error),
            ("error", SpdkLevel::Error),
            ("WARN", SpdkLevel::Warn),
            ("Warning", SpdkLevel::Warn),
            ("NOTICE", SpdkLevel::Notice),
            ("INFO", SpdkLevel::Info),
            ("debug", SpdkLevel::Debug),
        ] {
            assert_eq!(SpdkLevel::parse(name), Some(level), "{name}");
        }
        for bad in ["", "TRACE", "LOUD", "ERROR ", "0"] {
            assert_eq!(SpdkLevel::parse(bad), None, "{bad:?}");
        }
        for l in SpdkLevel::ALL {
            assert_eq!(SpdkLevel::parse(l.name()), Some(l));
            assert_eq!(SpdkLevel::from_u8(l as u8), Some(l));
        }
        assert_eq!(SpdkLevel::from_u8(0), None);
        assert_eq!(SpdkLevel::Notice.filter(), LevelFilter::Info);
        assert_eq!(SpdkLevel::Debug.filter(), LevelFilter::Debug);
        assert_eq!(SpdkLevel::of_filter(LevelFilter::Trace), SpdkLevel::Debug);
        assert_eq!(SpdkLevel::of_filter(LevelFilter::Warn).name(), "WARNING");
    }

    #[test]
    fn journal_stream_must_name_this_file() {
        assert!(journal_stream_matches("8:12345", 8, 12345));
        assert!(journal_stream_matches("8:12345\n", 8, 12345));
        assert!(!journal_stream_matches("8:12346", 8, 12345));
        assert!(!journal_stream_matches("9:12345", 8, 12345));
        assert!(!journal_stream_matches("", 8, 12345));
        assert!(!journal_stream_matches("8", 8, 12345));
        assert!(!journal_stream_matches("x:y", 8, 12345));
    }

    #[test]
    fn journal_lines_carry_the_priority_on_every_line() {
        let mut out = Vec::new();
        let args = format_args!("two\nlines");
        let record = Record::builder().level(Level::Warn).target("riser_server").args(args).build();
        write_journal_line(&mut out, &record).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "<4>riser_server: two\n<4>lines\n");
        assert_eq!(syslog_priority(Level::Error), 3);
        assert_eq!(syslog_priority(Level::Info), 6);
        assert_eq!(syslog_priority(Level::Trace), 7);
    }

    #[test]
    fn bad_level_is_a_clear_invalid_params_error() {
        let e = set_level_rpc(LogSetLevel { level: "LOUD".into() }).unwrap_err();
        let text = format!("{e:?}");
        assert!(text.contains("-32602") && text.contains("LOUD"), "{text}");
    }
}
