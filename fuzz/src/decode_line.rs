//! Decodes arbitrary bytes as a line: never panics, the JSON recogniser
//! used for rows agrees with serde_json on every input, and the JSON fields
//! of `USER_IP` and `LOCK_RELEASED` (read as slices of the line where they
//! hold no escapes) equal what a plain owned parse gives.

use bytes::Bytes;
use synapse_replication::wire::{Command, json};

/// Runs one input through the checks; panics where one fails.
pub fn check(data: &[u8]) {
    match Command::decode(Bytes::copy_from_slice(data)) {
        Ok(Some(Command::UserIp(ip))) => {
            let json_at = b"USER_IP ".len() + ip.user_id.len() + 1;
            let owned: (String, String, String, Option<String>, i64) =
                json::from_slice_lossy(&data[json_at..]).expect("the owned parse agrees");
            assert_eq!(&*ip.access_token, owned.0);
            assert_eq!(&*ip.ip, owned.1);
            assert_eq!(&*ip.user_agent, owned.2);
            assert_eq!(ip.device_id.as_deref(), owned.3.as_deref());
            assert_eq!(ip.last_seen, owned.4);
        }
        Ok(Some(Command::LockReleased(lock))) => {
            let owned: (String, String, String) =
                json::from_slice_lossy(&data[b"LOCK_RELEASED ".len()..])
                    .expect("the owned parse agrees");
            assert_eq!(lock.instance.as_str(), owned.0);
            assert_eq!(&*lock.lock_name, owned.1);
            assert_eq!(&*lock.lock_key, owned.2);
        }
        _ => {}
    }

    let ours = json::validate(data).is_ok();
    let oracle = std::str::from_utf8(data).is_ok()
        && !data.contains(&b'\n')
        && serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok();
    // The one deliberate difference: integers Python refuses to read.
    let long_integer = data
        .split(|b| !b.is_ascii_digit())
        .any(|run| run.len() > 4300);
    if !long_integer {
        assert_eq!(
            ours, oracle,
            "recogniser and serde_json disagree on {data:?}"
        );
    }
}
