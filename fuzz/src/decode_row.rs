//! Decodes arbitrary bytes as the row of every stream: never panics, and a
//! row that decodes encodes to Synapse's spelling, which decodes to the same
//! row and encodes to the same bytes. Decoding from a validated `RawRow`
//! (the RDATA path) and from raw bytes agree.

use std::fmt::Debug;

use bytes::Bytes;
use synapse_replication::streams::{
    AccountDataRow, BackfillRow, CachesRow, DeviceListsRow, EventsRow, FederationRow,
    PresenceFederationRow, PresenceRow, ProfileUpdatesRow, PushRulesRow, PushersRow,
    QuarantinedMediaRow, ReceiptsRow, Row, StickyEventsRow, StreamName, StreamRow,
    ThreadSubscriptionsRow, ToDeviceRow, TypingRow, UnPartialStatedEventRow,
    UnPartialStatedRoomRow,
};
use synapse_replication::wire::RawRow;

fn check_row<T: StreamRow + Clone + PartialEq + Debug>(data: &[u8], raw: Option<&RawRow>) {
    let from_bytes = T::from_slice(data);
    if let Some(raw) = raw {
        // The RDATA path: through the `Row` enum, from validated JSON.
        let from_raw = Row::decode(&T::STREAM, raw);
        assert_eq!(
            from_raw.is_ok(),
            from_bytes.is_ok(),
            "{from_raw:?} {from_bytes:?}"
        );
        if let (Ok(from_raw), Ok(from_bytes)) = (from_raw, &from_bytes) {
            assert_eq!(from_raw, from_bytes.clone().into());
        }
        // The lossy decode agrees where the strict one succeeds, and what it
        // decodes round trips through the strict one.
        if let Ok(lossy) = Row::decode_lossy(&T::STREAM, raw) {
            let encoded = lossy.encode().expect("a decoded row encodes");
            let again = Row::decode(&T::STREAM, &encoded).expect("strictly decodes");
            assert_eq!(again, lossy);
            if let Ok(strict) = &from_bytes {
                assert_eq!(lossy, strict.clone().into());
            }
        }
    }
    let Ok(row) = from_bytes else {
        return;
    };
    let encoded = row.encode().expect("a decoded row encodes");
    assert!(encoded.as_bytes().is_ascii(), "Synapse writes ASCII only");
    let again = T::decode(&encoded).expect("an encoded row decodes");
    assert_eq!(again, row);
    assert_eq!(again.encode().expect("encodes again"), encoded);
    // Where serde_json can read the value exactly, Synapse's re-encoding of
    // it is the same text.
    if let Ok(canonical) = encoded.canonical() {
        assert_eq!(canonical, encoded);
    }
}

/// Runs one input through the checks; panics where one fails.
pub fn check(data: &[u8]) {
    let raw = RawRow::new(Bytes::copy_from_slice(data)).ok();
    check_row::<EventsRow>(data, raw.as_ref());
    check_row::<BackfillRow>(data, raw.as_ref());
    check_row::<PresenceRow>(data, raw.as_ref());
    check_row::<PresenceFederationRow>(data, raw.as_ref());
    check_row::<TypingRow>(data, raw.as_ref());
    check_row::<ReceiptsRow>(data, raw.as_ref());
    check_row::<PushRulesRow>(data, raw.as_ref());
    check_row::<PushersRow>(data, raw.as_ref());
    check_row::<CachesRow>(data, raw.as_ref());
    check_row::<DeviceListsRow>(data, raw.as_ref());
    check_row::<ToDeviceRow>(data, raw.as_ref());
    check_row::<FederationRow>(data, raw.as_ref());
    check_row::<AccountDataRow>(data, raw.as_ref());
    check_row::<ProfileUpdatesRow>(data, raw.as_ref());
    check_row::<StickyEventsRow>(data, raw.as_ref());
    check_row::<ThreadSubscriptionsRow>(data, raw.as_ref());
    check_row::<UnPartialStatedRoomRow>(data, raw.as_ref());
    check_row::<UnPartialStatedEventRow>(data, raw.as_ref());
    check_row::<QuarantinedMediaRow>(data, raw.as_ref());
    // Unknown streams pass through untouched.
    if let Some(raw) = &raw {
        let stream = StreamName::from("not_a_stream");
        let row = Row::decode(&stream, raw).expect("unknown streams pass through");
        assert_eq!(&row.encode().expect("passes through"), raw);
    }
}
