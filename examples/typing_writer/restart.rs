//! What a restart of the typing writer needs so that Synapse's processes
//! follow the new run at once: a start token above every token the old
//! run used, and the rooms the old run left shown typing (Synapse's
//! followers keep a room's typing list until a row replaces it).
//!
//! The start token is `max(saved + 1, clock)`: `saved` the last token the
//! previous run wrote to its state file, `clock` the milliseconds since the
//! Unix epoch at start. Without a state file (or with a lost one) the clock
//! alone keeps tokens moving forward, as long as the old run made at most
//! one change per millisecond on average and the clock did not step back.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// What the previous run left in its state file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// The last token it wrote.
    pub token: i64,
    /// The rooms whose typing list was not empty (or whose clearing row
    /// had not been announced yet).
    pub rooms: BTreeSet<String>,
}

/// The state file (`--state FILE`): JSON `{"token": N, "rooms": [...]}`,
/// replaced whole on each change (written beside it, then renamed), so a
/// crash leaves the old file or the new one, never half of one.
#[derive(Clone, Debug)]
pub struct StateFile {
    path: PathBuf,
    temp: PathBuf,
}

impl StateFile {
    /// The state file at `path` (its temporary copy is `path` + `.tmp`).
    pub fn new(path: impl Into<PathBuf>) -> StateFile {
        let path = path.into();
        let mut temp = path.clone().into_os_string();
        temp.push(".tmp");
        StateFile {
            path,
            temp: PathBuf::from(temp),
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the previous run saved; `None` if there is no file.
    pub fn load(&self) -> io::Result<Option<Saved>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let invalid = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", self.path.display()),
            )
        };
        let value: Value = serde_json::from_str(&text).map_err(|_| invalid("not JSON"))?;
        let token = value
            .get("token")
            .and_then(Value::as_i64)
            .ok_or_else(|| invalid("no integer token"))?;
        let rooms = value
            .get("rooms")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid("no rooms list"))?
            .iter()
            .map(|room| room.as_str().map(str::to_owned))
            .collect::<Option<BTreeSet<String>>>()
            .ok_or_else(|| invalid("a room that is not a string"))?;
        Ok(Some(Saved { token, rooms }))
    }

    /// Replaces the file with `token` and `rooms`. Not synced to disk: it
    /// survives the process (a crash, a kill), not a power loss, which is
    /// a lost file (see the module docs).
    pub fn save<'a>(&self, token: i64, rooms: impl IntoIterator<Item = &'a str>) -> io::Result<()> {
        let rooms: BTreeSet<&str> = rooms.into_iter().collect();
        let text = json!({"token": token, "rooms": rooms}).to_string();
        std::fs::write(&self.temp, text)?;
        std::fs::rename(&self.temp, &self.path)
    }
}

/// Milliseconds since the Unix epoch at `now` (0 for a clock before it).
pub fn clock_floor(now: SystemTime) -> i64 {
    now.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    })
}

/// The first token of a run: above the last one the previous run saved,
/// and at least the clock's floor.
pub fn start_token(saved: Option<i64>, clock_floor: i64) -> i64 {
    saved
        .map_or(0, |token| token.saturating_add(1))
        .max(clock_floor)
}
