//! save_config / load_config: their arguments, reading the configuration to load, writing
//! the saved one with mode 0600.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

#[derive(Args, Debug)]
pub(crate) struct SaveConfig {
    /// Spaces per indentation level
    #[arg(short = 'i', long, default_value_t = 2)]
    pub(crate) indent: usize,
    /// Write to FILE, created with mode 0600 (the configuration holds CHAP secrets), instead
    /// of standard output; an existing FILE is replaced
    #[arg(short = 'o', long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct LoadConfig {
    /// JSON file made by save_config (standard input when absent)
    #[arg(short = 'j', long = "json-conf", value_name = "FILE")]
    pub(crate) json_conf: Option<PathBuf>,
}

/// Reads the load_config input: a file, or standard input.
pub(crate) fn read_config(file: Option<&PathBuf>) -> Result<Value, String> {
    let (text, from) = match file {
        Some(path) => (
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            path.display().to_string(),
        ),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| format!("cannot read standard input: {e}"))?;
            (s, "standard input".to_string())
        }
    };
    serde_json::from_str(&text).map_err(|e| format!("{from} is not valid JSON: {e}"))
}

/// Writes `text` to `path` readable by its owner only (mode 0600: a saved configuration holds
/// CHAP secrets): into a new file beside it, then renamed over it, so an existing file with
/// wider permissions is replaced rather than written into, and no half-written file is left.
pub(crate) fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let name = path.file_name().ok_or_else(|| format!("{}: not a file name", path.display()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(".{}.riser-rpc-{}.tmp", name.to_string_lossy(), std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        // The umask may have taken bits off 0600; never added any. Make it exactly 0600.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}
