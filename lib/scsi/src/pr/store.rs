//! Persistent reservations that survive a restart (SPC-4 5.12.5, APTPL): the registrations
//! and the reservation of one LUN in one JSON file under the state directory, keyed by the
//! device's UUID and the LUN number, written atomically (temporary file, fsync, rename,
//! fsync of the directory).
//!
//! `pr-<device uuid>-lun<N>.json`:
//!
//! ```json
//! {
//!   "format": "riser-persistent-reservations",
//!   "version": 1,
//!   "checksum": "crc32c:1a2b3c4d",
//!   "state": {
//!     "device_uuid": "…", "lun": 0, "generation": 3,
//!     "registrations": [{"initiator_port": "iqn…,i,0x23d000000001",
//!                        "target_port": "iqn…,t,0x0001", "relative_target_port": 1,
//!                        "reservation_key": "0x00000000000000a1", "transport_id": "45000020…"}],
//!     "reservation": {"initiator_port": "…", "target_port": "…", "type": 1,
//!                     "type_name": "WRITE EXCLUSIVE", "scope": 0}
//!   }
//! }
//! ```
//!
//! The checksum is CRC-32C of the compact JSON of `state`. The file exists only while
//! APTPL is in force. A file that cannot be used (truncated, not JSON, bad checksum, another
//! format or version, another device or LUN, inconsistent contents) is reported in the log,
//! renamed to `*.corrupt` and ignored: the LUN starts without registrations.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::pr::{PrState, Registration, Reservation};

/// The `format` field: says what the file is to a reader who finds it.
pub(crate) const FORMAT: &str = "riser-persistent-reservations";
/// The `version` field this code writes and reads.
pub(crate) const VERSION: u64 = 1;

/// The `state` object of version 1.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateV1 {
    device_uuid: Uuid,
    lun: u64,
    generation: u32,
    registrations: Vec<RegistrationV1>,
    reservation: Option<ReservationV1>,
    /// The APTPL bit last given; absent in the APTPL file (which exists only while it is
    /// set), present in a device's shared state (see `pr::shared`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    aptpl: Option<bool>,
}

/// One registered I_T nexus: SCSI port names (SPC-4 7.6.4.6: initiator name with ISID,
/// target name with TPGT), RELATIVE TARGET PORT IDENTIFIER, key and TransportID.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistrationV1 {
    initiator_port: String,
    target_port: String,
    relative_target_port: u16,
    /// Hex, `0x` and 16 digits: readable, and exact for JSON readers that use doubles.
    reservation_key: String,
    /// Hex bytes.
    transport_id: String,
    /// Registered with ALL_TG_PT (written only when set).
    #[serde(default, skip_serializing_if = "is_false")]
    all_tg_pt: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReservationV1 {
    /// The holder (for all-registrants types: the nexus that reserved).
    initiator_port: String,
    target_port: String,
    #[serde(rename = "type")]
    ty: u8,
    /// For the reader; ignored when loading.
    #[serde(default)]
    type_name: String,
    /// 0: LU_SCOPE, the only scope there is (SPC-4 6.16.2).
    scope: u8,
}

/// Where one LUN's state lives.
#[derive(Debug)]
pub(crate) struct PrStore {
    dir: PathBuf,
    name: String,
    uuid: Uuid,
    lun: u64,
}

impl PrStore {
    pub fn new(dir: &Path, uuid: Uuid, lun: u64) -> PrStore {
        PrStore { dir: dir.to_path_buf(), name: file_name(uuid, lun), uuid, lun }
    }

    /// The state file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// The state saved for this device and LUN, if any. An unusable file is logged, renamed
    /// to `*.corrupt` and ignored.
    pub fn load(&self) -> Option<PrState> {
        let path = self.path();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                log::error!(
                    "LUN {} (device {}): cannot read persistent reservation state {}: {e}; starting without registrations",
                    self.lun,
                    self.uuid,
                    path.display()
                );
                return None;
            }
        };
        match decode(&bytes, self.uuid, self.lun) {
            Ok(st) => {
                log::info!(
                    "LUN {} (device {}): restored {} registration(s){}, generation {}, from {} (APTPL)",
                    self.lun,
                    self.uuid,
                    st.regs.len(),
                    st.reservation.as_ref().map(|r| format!(" and a {} reservation", type_name(r.ty))).unwrap_or_default(),
                    st.generation,
                    path.display()
                );
                Some(st)
            }
            Err(reason) => {
                let aside = self.dir.join(format!("{}.corrupt", self.name));
                let kept = match fs::rename(&path, &aside) {
                    Ok(()) => format!("kept as {}", aside.display()),
                    Err(e) => format!("could not be renamed to {}: {e}", aside.display()),
                };
                log::warn!(
                    "LUN {} (device {}): persistent reservation state file {} is corrupt ({reason}); ignored ({kept}); the LUN starts without registrations",
                    self.lun,
                    self.uuid,
                    path.display()
                );
                None
            }
        }
    }

    /// Writes `st` atomically: a temporary file in the same directory, fsync, rename over
    /// the state file, fsync of the directory. Creates the directory if it is missing.
    pub fn save(&self, st: &PrState) -> io::Result<()> {
        let bytes = encode(st, self.uuid, self.lun)?;
        fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{}.tmp", self.name));
        let written = (|| {
            let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, self.path())
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(&self.dir)
    }

    /// Removes the state file (APTPL=0); a missing file is fine.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_file(self.path()) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `pr-<uuid>-lun<N>.json`.
pub(crate) fn file_name(uuid: Uuid, lun: u64) -> String {
    format!("pr-{}-lun{lun}.json", uuid.hyphenated())
}

/// SPC-4 table 170's names.
pub(crate) fn type_name(ty: u8) -> &'static str {
    match ty {
        1 => "WRITE EXCLUSIVE",
        3 => "EXCLUSIVE ACCESS",
        5 => "WRITE EXCLUSIVE - REGISTRANTS ONLY",
        6 => "EXCLUSIVE ACCESS - REGISTRANTS ONLY",
        7 => "WRITE EXCLUSIVE - ALL REGISTRANTS",
        8 => "EXCLUSIVE ACCESS - ALL REGISTRANTS",
        _ => "unknown",
    }
}

/// The checksum of the `state` object.
fn checksum(state: &Value) -> io::Result<String> {
    let compact = serde_json::to_vec(state).map_err(io::Error::other)?;
    Ok(format!("crc32c:{:08x}", crc32c::crc32c(&compact)))
}

/// `nexus` (a [`Nexus::key`](crate::Nexus::key): `<initiator port>|<target port>`) split.
fn ports(nexus: &str) -> io::Result<(String, String)> {
    nexus
        .split_once('|')
        .map(|(i, t)| (i.to_string(), t.to_string()))
        .ok_or_else(|| io::Error::other(format!("I_T nexus {nexus:?} has no target port")))
}

/// The file's bytes for `st`.
pub(crate) fn encode(st: &PrState, uuid: Uuid, lun: u64) -> io::Result<Vec<u8>> {
    encode_as(st, uuid, lun, FORMAT, false)
}

/// `st` in `format`, with the APTPL bit when `with_aptpl` (a shared state, which exists
/// whatever APTPL says).
pub(crate) fn encode_as(st: &PrState, uuid: Uuid, lun: u64, format: &str, with_aptpl: bool) -> io::Result<Vec<u8>> {
    let mut registrations = Vec::with_capacity(st.regs.len());
    for r in &st.regs {
        let (initiator_port, target_port) = ports(&r.nexus)?;
        registrations.push(RegistrationV1 {
            initiator_port,
            target_port,
            relative_target_port: r.rel_target_port,
            reservation_key: format!("0x{:016x}", r.key),
            transport_id: hex(&r.transport_id),
            all_tg_pt: r.all_tg_pt,
        });
    }
    let reservation = match &st.reservation {
        Some(res) => {
            let (initiator_port, target_port) = ports(&res.holder)?;
            Some(ReservationV1 { initiator_port, target_port, ty: res.ty, type_name: type_name(res.ty).to_string(), scope: 0 })
        }
        None => None,
    };
    let aptpl = with_aptpl.then_some(st.aptpl);
    let state = StateV1 { device_uuid: uuid, lun, generation: st.generation, registrations, reservation, aptpl };
    let state = serde_json::to_value(&state).map_err(io::Error::other)?;
    let file = serde_json::json!({
        "format": format,
        "version": VERSION,
        "checksum": checksum(&state)?,
        "state": state,
    });
    let mut bytes = serde_json::to_vec_pretty(&file).map_err(io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The state in a file's bytes, checked for this device and LUN; the error says why the
/// file cannot be used.
pub(crate) fn decode(bytes: &[u8], uuid: Uuid, lun: u64) -> Result<PrState, String> {
    decode_as(bytes, uuid, lun, FORMAT)
}

/// [`decode`] of `format`.
pub(crate) fn decode_as(bytes: &[u8], uuid: Uuid, lun: u64, format: &str) -> Result<PrState, String> {
    let file: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let obj = file.as_object().ok_or("not a JSON object")?;
    match obj.get("format").and_then(Value::as_str) {
        Some(f) if f == format => {}
        other => return Err(format!("format {other:?}, expected {format:?}")),
    }
    match obj.get("version").and_then(Value::as_u64) {
        Some(VERSION) => {}
        Some(v) => return Err(format!("version {v} is not supported (this riser reads version {VERSION})")),
        None => return Err("no version".into()),
    }
    let state = obj.get("state").ok_or("no state")?;
    let want = obj.get("checksum").and_then(Value::as_str).ok_or("no checksum")?;
    let got = checksum(state).map_err(|e| e.to_string())?;
    if want != got {
        return Err(format!("checksum mismatch: the file says {want}, its state has {got}"));
    }
    let s: StateV1 = serde_json::from_value(state.clone()).map_err(|e| format!("state: {e}"))?;
    if s.device_uuid != uuid || s.lun != lun {
        return Err(format!("it is the state of device {} LUN {}", s.device_uuid, s.lun));
    }
    let mut st = PrState { generation: s.generation, aptpl: s.aptpl.unwrap_or(true), ..PrState::default() };
    for (i, r) in s.registrations.into_iter().enumerate() {
        let key = r
            .reservation_key
            .strip_prefix("0x")
            .and_then(|k| u64::from_str_radix(k, 16).ok())
            .filter(|&k| k != 0)
            .ok_or_else(|| format!("registrations[{i}]: reservation key {:?}", r.reservation_key))?;
        let transport_id = unhex(&r.transport_id).ok_or_else(|| format!("registrations[{i}]: transport_id is not hex"))?;
        let nexus: Arc<str> = format!("{}|{}", r.initiator_port, r.target_port).into();
        if st.regs.iter().any(|x| x.covers(&nexus)) {
            return Err(format!("registrations[{i}]: I_T nexus {nexus} is registered twice"));
        }
        st.regs.push(Registration { key, nexus, transport_id, rel_target_port: r.relative_target_port, all_tg_pt: r.all_tg_pt });
    }
    if let Some(res) = s.reservation {
        if !matches!(res.ty, 1 | 3 | 5 | 6 | 7 | 8) || res.scope != 0 {
            return Err(format!("reservation: type {} scope {}", res.ty, res.scope));
        }
        let holder: Arc<str> = format!("{}|{}", res.initiator_port, res.target_port).into();
        let all_registrants = matches!(res.ty, 7 | 8);
        // A holder always is a registrant (unregistering releases its reservation).
        let consistent = if all_registrants { !st.regs.is_empty() } else { st.regs.iter().any(|r| r.covers(&holder)) };
        if !consistent {
            return Err(format!("reservation: holder {holder} is not registered"));
        }
        st.reservation = Some(Reservation { ty: res.ty, holder });
    }
    Ok(st)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::Nexus;

    type Hook = Arc<dyn Fn() + Send + Sync>;

    /// Hooks run before a PR OUT writes the state file of a store in the given directory
    /// (tests run in parallel, each in its own directory).
    static HOOKS: Mutex<Vec<(PathBuf, Hook)>> = Mutex::new(Vec::new());

    /// Runs `hook` before each write or removal of a state file in `dir`, until the guard
    /// drops.
    pub(crate) fn on_write(dir: &Path, hook: impl Fn() + Send + Sync + 'static) -> HookGuard {
        HOOKS.lock().unwrap().push((dir.to_path_buf(), Arc::new(hook)));
        HookGuard(dir.to_path_buf())
    }

    pub(crate) struct HookGuard(PathBuf);

    impl Drop for HookGuard {
        fn drop(&mut self) {
            HOOKS.lock().unwrap_or_else(|p| p.into_inner()).retain(|(d, _)| *d != self.0);
        }
    }

    /// Called by the PR OUT about to write `store`.
    pub(crate) fn before_write(store: &PrStore) {
        let hooks: Vec<Hook> = HOOKS.lock().unwrap().iter().filter(|(d, _)| *d == store.dir).map(|(_, h)| h.clone()).collect();
        for h in hooks {
            h();
        }
    }

    /// A directory under the temp dir, removed on drop.
    pub(crate) struct Dir(pub PathBuf);

    impl Dir {
        pub fn new(tag: &str) -> Dir {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!("riser-pr-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
            let _ = fs::remove_dir_all(&p);
            Dir(p)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn sample() -> PrState {
        let a = Nexus::new("iqn.2024-01.test:init1", 0x23d0_0000_0001, "iqn.2024-01.test:tgt", 1);
        let b = Nexus::new("iqn.2024-01.test:init2", 0x23d0_0000_0002, "iqn.2024-01.test:tgt", 2);
        let reg = |n: &Nexus, key| Registration {
            key,
            nexus: n.key().clone(),
            transport_id: n.transport_id(),
            rel_target_port: n.rel_target_port,
            all_tg_pt: false,
        };
        PrState {
            generation: 7,
            aptpl: true,
            regs: vec![reg(&a, 0xA1), reg(&b, u64::MAX)],
            reservation: Some(Reservation { ty: 1, holder: a.key().clone() }),
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let uuid = Uuid::new_v4();
        let st = sample();
        let bytes = encode(&st, uuid, 3).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("\"format\": \"riser-persistent-reservations\""), "{text}");
        assert!(text.contains("\"version\": 1"), "{text}");
        assert!(text.contains("iqn.2024-01.test:init1,i,0x23d000000001"), "{text}");
        assert!(text.contains("\"reservation_key\": \"0xffffffffffffffff\""), "{text}");
        assert!(text.contains("WRITE EXCLUSIVE"), "{text}");
        let back = decode(&bytes, uuid, 3).unwrap();
        assert_eq!(back, st);
        // The nexus key rebuilt from the port names is the one sessions present.
        let a = Nexus::new("iqn.2024-01.test:init1", 0x23d0_0000_0001, "iqn.2024-01.test:tgt", 1);
        assert_eq!(&back.regs[0].nexus, a.key());
        // Empty state (APTPL on, nobody registered) round-trips too.
        let empty = PrState { aptpl: true, generation: 9, ..PrState::default() };
        assert_eq!(decode(&encode(&empty, uuid, 0).unwrap(), uuid, 0).unwrap(), empty);
    }

    #[test]
    fn decode_refuses_what_it_cannot_trust() {
        let uuid = Uuid::new_v4();
        let good = encode(&sample(), uuid, 0).unwrap();
        let text = String::from_utf8(good.clone()).unwrap();
        let err = |b: &[u8]| decode(b, uuid, 0).unwrap_err();
        // Torn at every length: never accepted, never a panic.
        for n in 0..good.len() - 2 {
            let e = decode(&good[..n], uuid, 0);
            assert!(e.is_err(), "accepted a file cut at {n} bytes");
        }
        assert!(err(b"{\"format\": ").starts_with("not JSON"));
        assert!(err(b"[1, 2]").contains("not a JSON object"));
        // A changed key: the checksum catches it.
        let tampered = text.replace("0x00000000000000a1", "0x00000000000000a2");
        assert_ne!(tampered, text);
        assert!(err(tampered.as_bytes()).contains("checksum mismatch"));
        // Another version or format.
        let v2 = text.replace("\"version\": 1", "\"version\": 2");
        assert!(err(v2.as_bytes()).contains("version 2 is not supported"));
        let other = text.replace(FORMAT, "something-else");
        assert!(err(other.as_bytes()).contains("format"));
        // Another device or LUN.
        assert!(decode(&good, Uuid::new_v4(), 0).unwrap_err().contains("state of device"));
        assert!(decode(&good, uuid, 1).unwrap_err().contains("LUN 0"));
    }

    #[test]
    fn decode_refuses_inconsistent_state() {
        let uuid = Uuid::new_v4();
        let mut st = sample();
        // The holder of a WRITE EXCLUSIVE reservation is not registered.
        st.regs.remove(0);
        let e = decode(&encode(&st, uuid, 0).unwrap(), uuid, 0).unwrap_err();
        assert!(e.contains("not registered"), "{e}");
        let mut st = sample();
        st.regs.push(st.regs[0].clone());
        let e = decode(&encode(&st, uuid, 0).unwrap(), uuid, 0).unwrap_err();
        assert!(e.contains("registered twice"), "{e}");
    }

    #[test]
    fn save_is_atomic_and_remove_removes() {
        let d = Dir::new("save");
        let uuid = Uuid::new_v4();
        // The directory does not exist yet: save creates it.
        let store = PrStore::new(&d.0.join("state"), uuid, 2);
        assert_eq!(store.load(), None);
        let mut st = sample();
        store.save(&st).unwrap();
        assert_eq!(store.path().file_name().unwrap().to_str().unwrap(), format!("pr-{uuid}-lun2.json"));
        assert_eq!(store.load(), Some(st.clone()));
        // Overwrite: the new state replaces the old one, no temporary file stays behind.
        st.generation = 8;
        st.reservation = None;
        store.save(&st).unwrap();
        assert_eq!(store.load(), Some(st));
        let names: Vec<String> = fs::read_dir(d.0.join("state")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, vec![format!("pr-{uuid}-lun2.json")]);
        store.remove().unwrap();
        assert!(!store.path().exists());
        store.remove().unwrap();
        assert_eq!(store.load(), None);
    }

    #[test]
    fn save_into_an_unusable_directory_fails() {
        let d = Dir::new("bad");
        fs::create_dir_all(&d.0).unwrap();
        let file = d.0.join("a-file");
        fs::write(&file, b"x").unwrap();
        // A directory below a regular file cannot exist, even for root.
        let store = PrStore::new(&file.join("state"), Uuid::new_v4(), 0);
        assert!(store.save(&sample()).is_err());
    }

    #[test]
    fn a_torn_file_is_set_aside() {
        let d = Dir::new("torn");
        let uuid = Uuid::new_v4();
        let store = PrStore::new(&d.0, uuid, 0);
        store.save(&sample()).unwrap();
        let bytes = fs::read(store.path()).unwrap();
        fs::write(store.path(), &bytes[..bytes.len() / 2]).unwrap();
        assert_eq!(store.load(), None);
        assert!(!store.path().exists());
        let aside = d.0.join(format!("pr-{uuid}-lun0.json.corrupt"));
        assert_eq!(fs::read(&aside).unwrap(), &bytes[..bytes.len() / 2]);
    }
}
