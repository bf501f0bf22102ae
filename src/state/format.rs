//! The checkpoint file's bytes: a versioned, checksummed envelope around the payload.
//!
//! ```text
//! {
//!   "version": 1,
//!   "checksum": "<16 hex digits>",
//!   "checkpoint": { ...the Checkpoint... }
//! }
//! ```
//!
//! The checksum is FNV-1a 64 over the exact bytes of the `checkpoint` value as they stand in the
//! file, found on read with serde_json's `RawValue`. It depends on the text alone, never on how a
//! particular build re-serializes the records, so a file from a newer migdra with extra fields still
//! verifies in an older one (NVIDIA's checksum of a re-marshalled Go object is why adding a field
//! broke their old checkpoints). It guards against torn or bit-rotted files, not against tampering.

use super::record::Checkpoint;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The format version this build writes; it reads this one and every older one.
pub const CURRENT_VERSION: u64 = 1;

/// The checksum as written in the file: 16 lower-case hex digits.
pub fn checksum(payload: &[u8]) -> String {
    format!("{:016x}", crate::names::fnv1a64(payload))
}

/// The file text for `checkpoint`, in the current version.
///
/// # Errors
/// Only if serde_json cannot encode the records (it always can).
pub fn encode(checkpoint: &Checkpoint) -> Result<String, serde_json::Error> {
    // Pretty, and indented one level to sit inside the envelope. serde_json escapes control
    // characters inside strings, so every '\n' here is between tokens.
    let payload = serde_json::to_string_pretty(checkpoint)?.replace('\n', "\n  ");
    let sum = checksum(payload.as_bytes());
    Ok(format!("{{\n  \"version\": {CURRENT_VERSION},\n  \"checksum\": \"{sum}\",\n  \"checkpoint\": {payload}\n}}\n"))
}

/// The envelope; unknown top-level fields are ignored.
#[derive(Deserialize)]
struct Envelope<'a> {
    version: u64,
    checksum: String,
    #[serde(borrow)]
    checkpoint: &'a RawValue,
}

/// The checkpoint in `bytes`, or why they are not a valid checkpoint file.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8 text: {e}"))?;
    if text.trim().is_empty() {
        return Err("the file is empty".to_string());
    }
    let env: Envelope<'_> = serde_json::from_str(text)
        .map_err(|e| format!("not a checkpoint envelope {{version, checksum, checkpoint}}: {e}"))?;
    if env.version > CURRENT_VERSION {
        return Err(format!(
            "format version {} is newer than this migdra reads (up to {CURRENT_VERSION}); it was \
             written by a newer migdra",
            env.version
        ));
    }
    let raw = env.checkpoint.get();
    let actual = checksum(raw.as_bytes());
    if !env.checksum.eq_ignore_ascii_case(&actual) {
        return Err(format!("checksum mismatch: the file says {}, its checkpoint hashes to {actual}", env.checksum));
    }
    let parsed = if env.version == CURRENT_VERSION {
        serde_json::from_str(raw)
    } else {
        let value = serde_json::from_str(raw).map_err(|e| format!("checkpoint is not JSON: {e}"))?;
        serde_json::from_value(migrate(env.version, value)?)
    };
    parsed.map_err(|e| format!("checkpoint does not fit format version {}: {e}", env.version))
}

/// Bring a payload of an older format `version` up to [`CURRENT_VERSION`].
///
/// Version 1 is the first format, so there is nothing to migrate yet: a payload of version 1 is
/// returned as it is, and any other version (there never was a version 0) is refused. When a
/// version 2 comes, its step goes here as `1 => value = v1_to_v2(value)`, falling through to the
/// next, so every old file takes the same path up.
pub fn migrate(version: u64, value: serde_json::Value) -> Result<serde_json::Value, String> {
    match version {
        CURRENT_VERSION => Ok(value),
        v => Err(format!("there is no format version {v} to migrate from (versions start at 1)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::record::tests::sample_claim;

    fn sample() -> Checkpoint {
        let mut cp = Checkpoint::new("4f1c3b1e-0000-4000-8000-000000000001");
        for uid in ["u1", "u2"] {
            cp.claims.insert(uid.to_string(), sample_claim(uid));
        }
        cp.claims.get_mut("u2").unwrap().last_error = Some("line one\nline \"two\"".to_string());
        cp
    }

    #[test]
    fn encode_then_decode_round_trips() {
        let cp = sample();
        let text = encode(&cp).unwrap();
        assert!(text.starts_with("{\n  \"version\": 1,\n  \"checksum\": \""), "{text}");
        assert_eq!(decode(text.as_bytes()), Ok(cp));
        assert_eq!(decode(encode(&Checkpoint::default()).unwrap().as_bytes()), Ok(Checkpoint::default()));
    }

    #[test]
    fn any_change_to_the_payload_fails_the_checksum() {
        let text = encode(&sample()).unwrap();
        let at = text.find("3g.40gb").unwrap();
        let mut bytes = text.into_bytes();
        bytes[at] = b'4';
        let err = decode(&bytes).unwrap_err();
        assert!(err.starts_with("checksum mismatch"), "{err}");
    }

    #[test]
    fn the_checksum_covers_the_raw_text_not_a_re_serialization() {
        // A compact payload with fields in another order and extra fields, as a newer or different
        // writer might produce: it verifies because the hash is over the bytes as they stand.
        let payload = r#"{"claims":{},"futureField":[1,2],"bootId":"b"}"#;
        let text = format!(
            r#"{{"checkpoint": {payload} , "checksum":"{}","version":1,"writer":"migdra 9"}}"#,
            checksum(payload.as_bytes()).to_uppercase()
        );
        assert_eq!(decode(text.as_bytes()), Ok(Checkpoint::new("b")));
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let good = encode(&sample()).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "empty"),
            (b" \n".to_vec(), "empty"),
            (b"\xff\xfe".to_vec(), "UTF-8"),
            (b"garbage".to_vec(), "envelope"),
            (good.as_bytes()[..good.len() / 2].to_vec(), "envelope"),
            (br#"{"checksum":"0","checkpoint":{}}"#.to_vec(), "envelope"),
            (good.replacen("\"version\": 1", "\"version\": 2", 1).into_bytes(), "newer"),
            (good.replacen("\"version\": 1", "\"version\": \"1\"", 1).into_bytes(), "envelope"),
            (good.replacen("\"version\": 1", "\"version\": 0", 1).into_bytes(), "no format version 0"),
        ];
        for (bytes, want) in cases {
            let err = decode(&bytes).unwrap_err();
            assert!(err.contains(want), "{:?}: {err}", String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn wrong_types_inside_a_valid_checksum_are_refused() {
        let payload = r#"{"bootId":"b","claims":{"u":{"uid":7}}}"#;
        let text = format!(r#"{{"version":1,"checksum":"{}","checkpoint":{payload}}}"#, checksum(payload.as_bytes()));
        let err = decode(text.as_bytes()).unwrap_err();
        assert!(err.starts_with("checkpoint does not fit format version 1"), "{err}");
    }

    #[test]
    fn migrate_is_the_identity_for_the_current_version_only() {
        let v = serde_json::json!({"bootId": "b", "claims": {}});
        assert_eq!(migrate(CURRENT_VERSION, v.clone()), Ok(v.clone()));
        assert!(migrate(0, v).is_err());
    }
}
