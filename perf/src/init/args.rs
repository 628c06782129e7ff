//! The flags of the initiator mode and what they add up to: a validated [`Plan`], then per
//! target URL a [`Geometry`] once its LUN is known.

use std::time::Duration;

use clap::{Args, ValueEnum};
use riser_iscsi::chap::{ChapAlgorithm, ChapCredentials, ChapInitiatorConfig};
use serde::Serialize;

use riser_initiator::session::{INITIATOR_NAME, MAX_QD};
use riser_initiator::url::{self, TargetUrl, Transport};
use crate::workload::{PollModeArg, Workload};
use crate::{MAX_BUFFER_BYTES, MAX_SECONDS};

const MAX_SESSIONS: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DigestArg {
    None,
    Header,
    Data,
    Both,
}

/// A CHAP digest (`--chap-digest`): the CHAP_A values 5 to 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ChapDigestArg {
    Md5,
    Sha1,
    Sha256,
    #[value(name = "sha3-256")]
    Sha3_256,
}

impl ChapDigestArg {
    pub fn algorithm(self) -> ChapAlgorithm {
        match self {
            ChapDigestArg::Md5 => ChapAlgorithm::Md5,
            ChapDigestArg::Sha1 => ChapAlgorithm::Sha1,
            ChapDigestArg::Sha256 => ChapAlgorithm::Sha256,
            ChapDigestArg::Sha3_256 => ChapAlgorithm::Sha3_256,
        }
    }
}

/// `USER:SECRET` of --chap and --chap-mutual.
fn parse_chap(s: &str) -> Result<ChapCredentials, String> {
    ChapCredentials::parse(s)
}

/// Flags of the initiator mode (`riser-perf [flags] URL...`).
#[derive(Args, Clone, Debug)]
pub struct InitArgs {
    /// Targets: iscsi://host[:port]/IQN/LUN (iSCSI over TCP) or iser://host[:port]/IQN/LUN
    /// (iSER over RDMA: InfiniBand, RoCE); port 3260 by default. Several paths to ONE logical
    /// unit (gateways, portals) are given comma-separated in one argument, URL_A,URL_B: the
    /// first that logs in is used, and when its connection dies (reset, end of file, no
    /// answer for --path-timeout) riser-perf logs in on the next and resubmits every I/O not
    /// acknowledged (path failover).
    #[arg(value_name = "URL[,URL...]")]
    pub urls: Vec<String>,

    /// With several paths (URL_A,URL_B): seconds an I/O may wait with nothing at all received
    /// on its connection before the path counts as dead (a hung target) and riser-perf fails
    /// over (1 to 3600).
    #[arg(long = "path-timeout", value_name = "SECONDS", default_value_t = 5)]
    pub path_timeout: u64,

    /// With several paths: seconds to keep trying the paths in turn after a path failed,
    /// before the run fails (1 to 3600).
    #[arg(long = "failover-timeout", value_name = "SECONDS", default_value_t = 60)]
    pub failover_timeout: u64,

    /// Access pattern. Random offsets are uniform over the LBA range and aligned to --bs;
    /// sequential streams start spread over the range (one per session) and wrap.
    #[arg(long, value_enum, default_value_t = Workload::Randread)]
    pub rw: Workload,

    /// Percentage of reads for rw and randrw (0 to 100).
    #[arg(long, value_name = "PCT", default_value_t = 70)]
    pub rwmixread: u8,

    /// Size of every I/O in bytes: a multiple of the LUN's block size.
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    pub bs: u64,

    /// I/Os kept outstanding per session (1 to 4096); the target's CmdSN window may hold
    /// some back.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub qd: u32,

    /// Seconds measured (after the ramp).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub time: u64,

    /// Seconds of load before measuring starts (not counted).
    #[arg(long, value_name = "SECONDS", default_value_t = 1)]
    pub ramp: u64,

    /// Part of the LUN to use, in logical blocks: START:COUNT (default: the whole LUN).
    #[arg(long = "lba-range", value_name = "START:COUNT")]
    pub lba_range: Option<String>,

    /// Client threads, one per core of the mask (SPDK syntax: 0x3, 3, [0,1], [0-3]),
    /// each pinned to its core.
    #[arg(
        short = 'm',
        long = "cpumask",
        value_name = "MASK",
        default_value = "0x1"
    )]
    pub cpumask: String,

    /// Do not pin client threads to their cores.
    #[arg(long = "no-pin")]
    pub no_pin: bool,

    /// What a client thread does when a pass over its sockets found nothing: adaptive sleeps
    /// in poll(2) until a socket is ready (a spinning client takes CPU from a target on the
    /// same machine); busy spins (lowest latency when client and target have cores of
    /// their own).
    #[arg(long = "poll-mode", value_enum, default_value_t = PollModeArg::Adaptive)]
    pub poll_mode: PollModeArg,

    /// Sessions per URL (one connection each), spread round-robin over the client
    /// threads. Default: one per client thread.
    #[arg(long, value_name = "N")]
    pub sessions: Option<usize>,

    /// Write the LBA range sequentially in a self-checking format (LBA, generation, CRC32C
    /// in every block), read it all back and report every mismatch; exits non-zero on any.
    /// Runs until the range is done (--time and --ramp do not apply).
    #[arg(long, conflicts_with_all = ["rw", "rwmixread"])]
    pub verify: bool,

    /// Only the read-back pass of --verify, checking for --generation.
    #[arg(long = "verify-only", conflicts_with_all = ["verify", "rw", "rwmixread"], requires = "generation")]
    pub verify_only: bool,

    /// Generation number written (--verify) or expected (--verify-only).
    /// Default for --verify: the current Unix time.
    #[arg(long, value_name = "N")]
    pub generation: Option<u64>,

    /// --verify: every MS milliseconds of the write pass, let the writes in flight complete,
    /// send SYNCHRONIZE CACHE and, once it is GOOD, print `sync: LABEL LBA A..B durable`
    /// (every block of the range was acknowledged before the sync); once more at the end of
    /// the pass. For crash tests: those blocks must read back after a target restart.
    #[arg(long = "sync-every", value_name = "MS", requires = "verify")]
    pub sync_every: Option<u64>,

    /// Seconds to wait between the write and the read pass of --verify.
    #[arg(long = "verify-pause", value_name = "SECONDS", default_value_t = 0)]
    pub verify_pause: u64,

    /// CRC32C digests to negotiate.
    #[arg(long, value_enum, default_value_t = DigestArg::None)]
    pub digest: DigestArg,

    /// Log in with CHAP (RFC 7143 §12.1.3) as USER (CHAP_N) with SECRET, split at the last ':'
    /// (USER may be an IQN; SECRET may not contain ':'). Only AuthMethod=CHAP is offered: a
    /// target that does not use CHAP refuses the login. The secret shows in the process list.
    #[arg(long, value_name = "USER:SECRET", value_parser = parse_chap)]
    pub chap: Option<ChapCredentials>,

    /// Mutual CHAP: the target must prove itself as USER with SECRET (its muser and msecret
    /// in SPDK's auth groups); a wrong answer fails the login. Needs --chap.
    #[arg(long = "chap-mutual", value_name = "USER:SECRET", value_parser = parse_chap, requires = "chap")]
    pub chap_mutual: Option<ChapCredentials>,

    /// CHAP digests offered (CHAP_A), in order of preference, comma-separated; the target
    /// picks the first it supports. Default: sha256,sha3-256,sha1,md5. Needs --chap.
    #[arg(long = "chap-digest", value_name = "DIGEST", value_enum, value_delimiter = ',', requires = "chap")]
    pub chap_digest: Vec<ChapDigestArg>,

    /// InitiatorName sent at login.
    #[arg(long = "initiator-name", value_name = "IQN", default_value = INITIATOR_NAME)]
    pub initiator_name: String,

    /// Seconds allowed for connecting, logging in, each setup command and logout.
    #[arg(long = "login-timeout", value_name = "SECONDS", default_value_t = 10)]
    pub login_timeout: u64,

    /// Print one JSON object on stdout (the live lines go to stderr).
    #[arg(long)]
    pub json: bool,

    /// Also write the latency distribution of the measured window as an SVG chart
    /// (percentile spectrum and histogram).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,

    /// iser:// only: offer iSERHelloRequired=Yes and, once logged in, do the iSER Hello /
    /// HelloReply exchange (RFC 7145 §5.1.4, §9.3; what iWARP initiators may require) before
    /// any I/O.
    #[arg(long = "iser-hello")]
    pub iser_hello: bool,

    /// Tests: the iSER versions (MAX:MIN, 0-15) our Hello offers; default 10:10 (RFC 7145's).
    #[arg(long = "iser-hello-versions", value_name = "MAX:MIN", requires = "iser_hello", hide = true, value_parser = parse_versions)]
    pub iser_hello_versions: Option<(u8, u8)>,

    /// Tests (iser://): after login, a Text Request SendTargets=All in full-feature phase;
    /// the answer's keys are printed as `text: KEY=VALUE` lines.
    #[arg(long = "text-sendtargets", hide = true)]
    pub text_sendtargets: bool,

    /// Tests (iser://): log in as connection 1 of the existing session TSIH:ISID (ISID as 12
    /// hex digits) instead of a new session.
    #[arg(long = "join-session", value_name = "TSIH:ISID", hide = true, value_parser = parse_join)]
    pub join_session: Option<(u16, [u8; 6])>,

    /// Tests (iser://), a hostile peer: once connected and before logging in, RDMA-Write
    /// 512 bytes to STAG:ADDR (both hex) in the target's memory, then try to log in. Exits
    /// non-zero either way, saying whether the target accepted the write (the login after
    /// it went through) or refused it (the connection failed first).
    #[arg(long = "iser-attack-write", value_name = "STAG:ADDR", hide = true, value_parser = parse_attack)]
    pub iser_attack_write: Option<(u32, u64)>,

    /// Tests: an ABORT TASK right after every Nth command of the benchmark (not with
    /// --verify); prints what the target answered (`aborts: ...`) and fails on a protocol
    /// violation (a response for an aborted task, an unexpected TMF response code).
    #[arg(long = "abort-every", value_name = "N", hide = true, conflicts_with_all = ["verify", "verify_only"])]
    pub abort_every: Option<u32>,
}

/// `MAX:MIN`, each 0-15.
fn parse_versions(s: &str) -> Result<(u8, u8), String> {
    let (a, b) = s.split_once(':').ok_or("expected MAX:MIN")?;
    let v = |x: &str| x.trim().parse::<u8>().ok().filter(|v| *v < 16).ok_or(format!("{x}: not 0-15"));
    Ok((v(a)?, v(b)?))
}

/// `STAG:ADDR`, both hex (with or without 0x).
fn parse_attack(s: &str) -> Result<(u32, u64), String> {
    let (t, a) = s.split_once(':').ok_or("expected STAG:ADDR")?;
    let hex = |x: &str| x.trim().trim_start_matches("0x").to_string();
    let stag = u32::from_str_radix(&hex(t), 16).map_err(|e| format!("STag {t}: {e}"))?;
    let addr = u64::from_str_radix(&hex(a), 16).map_err(|e| format!("address {a}: {e}"))?;
    Ok((stag, addr))
}

/// `TSIH:ISID`: TSIH decimal or 0x hex, ISID 12 hex digits.
fn parse_join(s: &str) -> Result<(u16, [u8; 6]), String> {
    let (t, i) = s.split_once(':').ok_or("expected TSIH:ISID")?;
    let t = t.trim();
    let tsih = match t.strip_prefix("0x") {
        Some(h) => u16::from_str_radix(h, 16),
        None => t.parse(),
    }
    .map_err(|e| format!("TSIH {t}: {e}"))?;
    let i = i.trim().trim_start_matches("0x");
    if i.len() != 12 {
        return Err(format!("ISID {i}: 12 hex digits"));
    }
    let mut isid = [0u8; 6];
    for (k, b) in isid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&i[2 * k..2 * k + 2], 16).map_err(|e| format!("ISID {i}: {e}"))?;
    }
    Ok((tsih, isid))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Bench,
    /// Write pass (unless `read_only`), pause, read pass.
    Verify {
        read_only: bool,
        generation: u64,
        pause: Duration,
    },
}

/// A validated run description (everything that can be checked before connecting).
#[derive(Clone, Debug)]
pub struct Plan {
    /// The first path of every target (what is printed as the target's URL).
    pub targets: Vec<TargetUrl>,
    /// Every path of every target, in the order given (`paths[u][0] == targets[u]`).
    pub paths: Vec<Vec<TargetUrl>>,
    /// --path-timeout: a multipath session's I/O with nothing received this long fails it.
    pub path_timeout: Duration,
    /// --failover-timeout: how long a failover keeps trying the paths.
    pub failover_timeout: Duration,
    pub workload: Workload,
    pub read_pct: u8,
    pub bs: u64,
    pub qd: usize,
    pub time: Duration,
    pub ramp: Duration,
    pub lba_range: Option<(u64, u64)>,
    pub cores: Vec<usize>,
    pub pin: bool,
    pub poll_mode: PollModeArg,
    pub sessions: usize,
    pub mode: Mode,
    pub header_digest: bool,
    pub data_digest: bool,
    pub initiator_name: String,
    /// CHAP credentials and offer (--chap, --chap-mutual, --chap-digest).
    pub chap: Option<ChapInitiatorConfig>,
    pub timeout: Duration,
    pub json: bool,
    pub plot: Option<std::path::PathBuf>,
    /// --sync-every: SYNCHRONIZE CACHE this often during the verify write pass.
    pub sync_every: Option<Duration>,
    /// --abort-every (hidden): ABORT TASK after every Nth command of the benchmark.
    pub abort_every: Option<u32>,
}

/// `START:COUNT`, decimal or 0x hex, COUNT > 0.
pub fn parse_lba_range(s: &str) -> Result<(u64, u64), String> {
    let bad = |why: &str| format!("--lba-range {s}: {why} (expected START:COUNT in blocks)");
    let (a, b) = s.split_once(':').ok_or_else(|| bad("no ':'"))?;
    let num = |v: &str| -> Result<u64, String> {
        let v = v.trim();
        let r = if let Some(h) = v.strip_prefix("0x") {
            u64::from_str_radix(h, 16)
        } else {
            v.parse()
        };
        r.map_err(|_| bad(&format!("\"{v}\" is not a number")))
    };
    let (start, count) = (num(a)?, num(b)?);
    if count == 0 {
        return Err(bad("COUNT must be at least 1"));
    }
    if start.checked_add(count).is_none() {
        return Err(bad("START + COUNT overflows"));
    }
    Ok((start, count))
}

impl InitArgs {
    /// Checks the flags and turns them into a [`Plan`], or says what is wrong.
    // `u64::is_multiple_of` is newer than the workspace's rust-version (1.75).
    #[allow(unknown_lints, clippy::manual_is_multiple_of)]
    pub fn plan(&self) -> Result<Plan, String> {
        crate::iser::set_options(crate::iser::IserOptions {
            hello: self.iser_hello.then(|| {
                self.iser_hello_versions.unwrap_or((
                    riser_datamover::iser::header::ISER_VERSION,
                    riser_datamover::iser::header::ISER_VERSION,
                ))
            }),
            text_sendtargets: self.text_sendtargets,
            join: self.join_session,
            attack_write: self.iser_attack_write,
        });
        if self.urls.is_empty() {
            return Err("no target URL given: riser-perf [flags] iscsi://host[:port]/IQN/LUN ... (or riser-perf bdev ...)".into());
        }
        let mut targets = Vec::new();
        let mut paths = Vec::new();
        for arg in &self.urls {
            if arg == "bdev" {
                return Err("\"bdev\" after initiator flags: the subcommand comes first, riser-perf bdev [flags]".into());
            }
            let mut these: Vec<TargetUrl> = Vec::new();
            for u in arg.split(',') {
                if u.is_empty() {
                    return Err(format!(
                        "\"{arg}\": an empty path between commas (several paths to one LUN: URL_A,URL_B)"
                    ));
                }
                let t = url::parse(u)?;
                if t.transport == Transport::Iser && self.digest != DigestArg::None {
                    return Err(format!(
                        "{u}: --digest does not apply to iSER (RDMA has its own integrity checks)"
                    ));
                }
                if these.contains(&t) {
                    return Err(format!("\"{arg}\": path {t} is given twice"));
                }
                these.push(t);
            }
            targets.push(these[0].clone());
            paths.push(these);
        }
        for (flag, v) in [
            ("--path-timeout", self.path_timeout),
            ("--failover-timeout", self.failover_timeout),
        ] {
            crate::in_range(flag, v, 1, 3600, " seconds")?;
        }
        if self.bs == 0 || self.bs % 512 != 0 {
            return Err(format!(
                "--bs {} must be a positive multiple of 512",
                self.bs
            ));
        }
        if self.bs > 32 << 20 {
            // riser's (and most targets') MAXIMUM TRANSFER LENGTH.
            return Err(format!("--bs {} is above the 32 MiB limit", self.bs));
        }
        if self.qd == 0 || self.qd as usize > MAX_QD {
            return Err(format!(
                "--qd {} is out of range: use 1 to {MAX_QD}",
                self.qd
            ));
        }
        crate::check_run_flags(self.time, self.ramp, self.rwmixread as u64)?;
        if self.verify_pause > MAX_SECONDS {
            return Err(format!(
                "--verify-pause {} is out of range",
                self.verify_pause
            ));
        }
        if self.login_timeout == 0 || self.login_timeout > 3600 {
            return Err(format!(
                "--login-timeout {} is out of range: use 1 to 3600",
                self.login_timeout
            ));
        }
        let cores = riser_reactor::parse_core_mask(&self.cpumask)
            .map_err(|e| format!("-m {}: {e}", self.cpumask))?;
        let sessions = self.sessions.unwrap_or(cores.len());
        if sessions == 0 || sessions > MAX_SESSIONS {
            return Err(format!(
                "--sessions {sessions} is out of range: use 1 to {MAX_SESSIONS}"
            ));
        }
        let per_thread = (sessions * targets.len()).div_ceil(cores.len()) as u64;
        let bytes = per_thread
            .saturating_mul(self.qd as u64)
            .saturating_mul(self.bs);
        if bytes > MAX_BUFFER_BYTES {
            return Err(format!(
                "{per_thread} sessions x --qd {} x --bs {} need {} MiB of buffers per thread; the limit is {} MiB",
                self.qd,
                self.bs,
                bytes >> 20,
                MAX_BUFFER_BYTES >> 20
            ));
        }
        let lba_range = self.lba_range.as_deref().map(parse_lba_range).transpose()?;
        if !self.verify && !self.verify_only && (self.generation.is_some() || self.verify_pause > 0)
        {
            return Err(
                "--generation and --verify-pause only apply with --verify or --verify-only".into(),
            );
        }
        if self.verify_only && self.verify_pause > 0 {
            return Err("--verify-pause needs --verify (--verify-only has no write pass)".into());
        }
        let mode = if self.verify || self.verify_only {
            let generation = match self.generation {
                Some(g) => g,
                None => std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(1),
            };
            Mode::Verify {
                read_only: self.verify_only,
                generation,
                pause: Duration::from_secs(self.verify_pause),
            }
        } else {
            Mode::Bench
        };
        if !self.initiator_name.starts_with("iqn.")
            && !self.initiator_name.starts_with("eui.")
            && !self.initiator_name.starts_with("naa.")
        {
            return Err(format!(
                "--initiator-name {}: an iSCSI name starts with iqn., eui. or naa.",
                self.initiator_name
            ));
        }
        let (header_digest, data_digest) = match self.digest {
            DigestArg::None => (false, false),
            DigestArg::Header => (true, false),
            DigestArg::Data => (false, true),
            DigestArg::Both => (true, true),
        };
        if self.abort_every == Some(0) {
            return Err("--abort-every 0: give N, at least 1".into());
        }
        if self.sync_every == Some(0) {
            return Err("--sync-every 0: give a period in milliseconds (at least 1)".into());
        }
        Ok(Plan {
            abort_every: self.abort_every,
            sync_every: self.sync_every.map(Duration::from_millis),
            chap: self.chap_config()?,
            targets,
            paths,
            path_timeout: Duration::from_secs(self.path_timeout),
            failover_timeout: Duration::from_secs(self.failover_timeout),
            workload: self.rw,
            read_pct: self.rw.read_pct(self.rwmixread),
            bs: self.bs,
            qd: self.qd as usize,
            time: Duration::from_secs(self.time),
            ramp: Duration::from_secs(self.ramp),
            lba_range,
            pin: !self.no_pin,
            poll_mode: self.poll_mode,
            cores,
            sessions,
            mode,
            header_digest,
            data_digest,
            initiator_name: self.initiator_name.clone(),
            timeout: Duration::from_secs(self.login_timeout),
            json: self.json,
            plot: self.plot.clone(),
        })
    }
}

impl InitArgs {
    /// --chap, --chap-mutual and --chap-digest together (clap checks that the last two come
    /// with --chap; this checks again for callers that build InitArgs themselves).
    fn chap_config(&self) -> Result<Option<ChapInitiatorConfig>, String> {
        let Some(credentials) = self.chap.clone() else {
            if self.chap_mutual.is_some() || !self.chap_digest.is_empty() {
                return Err("--chap-mutual and --chap-digest need --chap USER:SECRET".into());
            }
            return Ok(None);
        };
        let mut config = ChapInitiatorConfig::new(credentials);
        config.mutual = self.chap_mutual.clone();
        if !self.chap_digest.is_empty() {
            config.algorithms.clear();
            for a in self.chap_digest.iter().map(|d| d.algorithm()) {
                if !config.algorithms.contains(&a) {
                    config.algorithms.push(a);
                }
            }
        }
        Ok(Some(config))
    }
}

/// Where one URL's I/Os go, once its LUN is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Geometry {
    pub block_size: u32,
    pub num_blocks: u64,
    /// The range used, in blocks.
    pub start: u64,
    pub count: u64,
    /// Blocks per I/O.
    pub io_blocks: u32,
}

impl Geometry {
    /// Checks the plan against what READ CAPACITY said.
    #[allow(unknown_lints, clippy::manual_is_multiple_of)]
    pub fn resolve(plan: &Plan, block_size: u32, num_blocks: u64) -> Result<Geometry, String> {
        if plan.bs % block_size as u64 != 0 {
            return Err(format!(
                "--bs {} is not a multiple of the LUN's block size ({block_size} bytes)",
                plan.bs
            ));
        }
        let io_blocks = (plan.bs / block_size as u64) as u32;
        let (start, count) = plan.lba_range.unwrap_or((0, num_blocks));
        if start + count > num_blocks {
            return Err(format!(
                "--lba-range {start}:{count} ends past the LUN's {num_blocks} blocks"
            ));
        }
        // Benchmarks issue whole --bs I/Os; verify also covers a partial last one.
        if matches!(plan.mode, Mode::Bench) && count < io_blocks as u64 {
            return Err(format!(
                "the LBA range ({count} blocks) is smaller than one I/O ({io_blocks} blocks of {block_size} bytes)"
            ));
        }
        Ok(Geometry {
            block_size,
            num_blocks,
            start,
            count,
            io_blocks,
        })
    }

    /// I/O-sized units in the range (a partial last unit counts in verify mode).
    pub(crate) fn units(&self, partial: bool) -> u64 {
        if partial {
            self.count.div_ceil(self.io_blocks as u64)
        } else {
            self.count / self.io_blocks as u64
        }
    }

    /// First LBA and length in blocks of unit `u`.
    pub(crate) fn unit(&self, u: u64) -> (u64, u32) {
        let lba = self.start + u * self.io_blocks as u64;
        let end = (lba + self.io_blocks as u64).min(self.start + self.count);
        (lba, (end - lba) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        init: InitArgs,
    }

    const URL: &str = "iscsi://127.0.0.1/iqn.2016-06.io.riser:t/0";

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let argv = std::iter::once("riser-perf").chain(args.iter().copied());
        Cli::try_parse_from(argv).map_err(|e| e.to_string())?.init.plan()
    }

    #[test]
    fn chap_flags() {
        Cli::command().debug_assert();
        assert_eq!(plan(&[URL]).unwrap().chap, None, "no flag: AuthMethod=None as before");
        let c = plan(&["--chap", "alice:s3cret", URL]).unwrap().chap.unwrap();
        assert_eq!(c.credentials, ChapCredentials::new("alice", "s3cret"));
        assert_eq!((c.mutual, c.algorithms), (None, ChapAlgorithm::ALL.to_vec()));
        let p = plan(&[
            "--chap",
            "alice:s3cret",
            "--chap-mutual",
            "iqn.2016-06.io.riser:t:t-secret",
            "--chap-digest",
            "md5,sha3-256",
            "--chap-digest",
            "md5",
            URL,
        ])
        .unwrap();
        let c = p.chap.clone().unwrap();
        assert_eq!(c.algorithms, [ChapAlgorithm::Md5, ChapAlgorithm::Sha3_256]);
        // The secret starts after the last ':': a user name may be an IQN.
        assert_eq!(c.mutual, Some(ChapCredentials::new("iqn.2016-06.io.riser:t", "t-secret")));
        let shown = format!("{p:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("t-secret"), "{shown}");

        let err = |args: &[&str]| plan(args).unwrap_err();
        assert!(err(&["--chap-mutual", "t:s", URL]).contains("--chap"));
        assert!(err(&["--chap-digest", "md5", URL]).contains("--chap"));
        assert!(err(&["--chap", "alice", URL]).contains("USER:SECRET"));
        assert!(err(&["--chap", "alice:", URL]).contains("USER:SECRET"));
        assert!(err(&["--chap", "a:b", "--chap-digest", "sha512", URL]).contains("sha3-256"));
        let help = Cli::command().render_long_help().to_string();
        for flag in ["--chap <USER:SECRET>", "--chap-mutual <USER:SECRET>", "--chap-digest <DIGEST>"] {
            assert!(help.contains(flag), "{flag} in\n{help}");
        }
    }
}
