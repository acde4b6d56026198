//! The machinery every row type shares: a serde visitor over the row's JSON
//! array that records which field it is reading (so an error can name it),
//! tolerates trailing fields, and reads booleans as Synapse writes them.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::StreamRow;
use super::error::{RowError, snippet};
use super::raw::RawJson;
use crate::wire::StreamName;
use crate::wire::json::check_exact_numbers;

/// Which field a visitor is reading, so an error can name it (public in a
/// private module, as it appears in [`SeqRow`]).
#[derive(Default)]
pub struct Tracker {
    /// Whether a row's array was entered at all.
    entered: Cell<bool>,
    index: Cell<usize>,
    field: Cell<&'static str>,
    /// Whether the error is a missing field rather than an invalid one.
    missing: Cell<bool>,
}

impl Tracker {
    /// Records that the field `index`, called `field`, is read next.
    pub(crate) fn at(&self, index: usize, field: &'static str) {
        self.entered.set(true);
        self.index.set(index);
        self.field.set(field);
    }

    /// The error for a row that ends before field `index`.
    pub(crate) fn missing<E: de::Error>(&self, index: usize, expecting: &dyn de::Expected) -> E {
        self.missing.set(true);
        E::invalid_length(index, expecting)
    }

    /// Turns a serde_json error into a typed one, naming the field.
    fn error(&self, stream: StreamName, source: serde_json::Error, bytes: &[u8]) -> RowError {
        let input = snippet(bytes);
        if !self.entered.get() {
            return match source.classify() {
                serde_json::error::Category::Data => RowError::NotAnArray {
                    stream,
                    source,
                    input,
                },
                _ => RowError::Json {
                    stream,
                    source,
                    input,
                },
            };
        }
        let (index, field) = (self.index.get(), self.field.get());
        if self.missing.get() {
            RowError::MissingField {
                stream,
                index,
                field,
                input,
            }
        } else {
            RowError::InvalidField {
                stream,
                index,
                field,
                source,
                input,
            }
        }
    }
}

/// A row read from a JSON array, field by field.
///
/// Public in a private module: it seals [`StreamRow`](super::StreamRow).
pub trait SeqRow: Sized {
    /// What serde's messages say was expected (`a caches row`).
    const EXPECTING: &'static str;

    /// Reads the fields from the array, recording progress in `tracker`.
    fn visit<'de, A: SeqAccess<'de>>(seq: A, tracker: &Tracker) -> Result<Self, A::Error>;
}

/// Deserialises a `T` from a JSON array, tracking fields.
pub(crate) struct RowSeed<'t, T> {
    tracker: &'t Tracker,
    row: PhantomData<fn() -> T>,
}

impl<'t, T> RowSeed<'t, T> {
    pub(crate) fn new(tracker: &'t Tracker) -> Self {
        RowSeed {
            tracker,
            row: PhantomData,
        }
    }
}

impl<'de, T: SeqRow> DeserializeSeed<'de> for RowSeed<'_, T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, T: SeqRow> Visitor<'de> for RowSeed<'_, T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::visit(seq, self.tracker)
    }
}

/// Decodes a whole row from JSON text.
pub(crate) fn decode<T: StreamRow>(bytes: &[u8]) -> Result<T, RowError> {
    // Text already known to be UTF-8 (every `RawRow`) parses faster as a
    // `str`: serde_json then skips checking each string again. Other bytes
    // go through the slice reader, which reports where UTF-8 breaks.
    match std::str::from_utf8(bytes) {
        Ok(text) => decode_from(serde_json::Deserializer::from_str(text), bytes),
        Err(_) => decode_from(serde_json::Deserializer::from_slice(bytes), bytes),
    }
}

fn decode_from<'de, R: serde_json::de::Read<'de>, T: StreamRow>(
    mut deserializer: serde_json::Deserializer<R>,
    bytes: &[u8],
) -> Result<T, RowError> {
    let tracker = Tracker::default();
    let row = RowSeed::<T>::new(&tracker)
        .deserialize(&mut deserializer)
        .map_err(|source| tracker.error(T::STREAM, source, bytes))?;
    deserializer.end().map_err(|source| RowError::Json {
        stream: T::STREAM,
        source,
        input: snippet(bytes),
    })?;
    Ok(row)
}

/// Deserialises a row on its own (inside a catch-up answer, say): errors
/// are serde's, without the field's name.
pub(crate) fn deserialize<'de, T: SeqRow, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    RowSeed::<T>::new(&Tracker::default()).deserialize(deserializer)
}

/// Reads the fields after the known ones, from position `index` on.
pub(crate) fn read_extra<'de, A: SeqAccess<'de>>(
    seq: &mut A,
    tracker: &Tracker,
    mut index: usize,
) -> Result<Vec<RawJson>, A::Error> {
    let mut extra = Vec::new();
    loop {
        tracker.at(index, "extra");
        match seq.next_element::<RawJson>()? {
            Some(field) => extra.push(field),
            None => return Ok(extra),
        }
        index += 1;
    }
}

/// How a field of a given Rust type is read off the wire.
pub(crate) trait Field: Sized {
    /// The type serde reads; converted into the field's type.
    type Wire: DeserializeOwned + Into<Self>;
}

macro_rules! plain_fields {
    ($($ty:ty),*) => { $( impl Field for $ty { type Wire = $ty; } )* };
}

plain_fields!(
    String,
    Option<String>,
    i64,
    Vec<String>,
    Option<Vec<String>>,
    RawJson
);

impl Field for bool {
    type Wire = LenientBool;
}

impl Field for Option<Vec<Value>> {
    type Wire = ExactValues;
}

/// A boolean as Synapse writes it: `true`/`false` from PostgreSQL, `0`/`1`
/// from SQLite.
pub(crate) struct LenientBool(bool);

impl From<LenientBool> for bool {
    fn from(value: LenientBool) -> bool {
        value.0
    }
}

impl<'de> Deserialize<'de> for LenientBool {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LenientBoolVisitor)
    }
}

struct LenientBoolVisitor;

impl Visitor<'_> for LenientBoolVisitor {
    type Value = LenientBool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a boolean (true, false, 0 or 1)")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<LenientBool, E> {
        Ok(LenientBool(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<LenientBool, E> {
        match value {
            0 => Ok(LenientBool(false)),
            1 => Ok(LenientBool(true)),
            _ => Err(E::invalid_value(de::Unexpected::Unsigned(value), &self)),
        }
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<LenientBool, E> {
        match value {
            0 => Ok(LenientBool(false)),
            1 => Ok(LenientBool(true)),
            _ => Err(E::invalid_value(de::Unexpected::Signed(value), &self)),
        }
    }
}

/// A list of JSON values (or null) that re-encode to the same text: refuses
/// integers beyond 64 bits, which serde_json would read as floats.
pub(crate) struct ExactValues(Option<Vec<Value>>);

impl From<ExactValues> for Option<Vec<Value>> {
    fn from(values: ExactValues) -> Self {
        values.0
    }
}

impl<'de> Deserialize<'de> for ExactValues {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let values = Option::<Vec<Value>>::deserialize(deserializer)?;
        if let Some(values) = &values {
            for value in values {
                check_exact_numbers(value).map_err(de::Error::custom)?;
            }
        }
        Ok(ExactValues(values))
    }
}

/// Defines a row struct whose JSON form is an array of its fields in order,
/// with its decoding, encoding and documentation.
///
/// `prefix` is prepended to field names in errors (`data.` for the rows
/// inside an `events` row).
macro_rules! row_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            expecting: $expecting:literal,
            prefix: $prefix:literal,
            fields: {
                $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $wire:literal, )*
            }
        }
    ) => {
        $(#[$meta])*
        ///
        /// Its JSON form is an array of the fields in the order below, as
        /// Synapse 1.163.2 writes it (names in
        #[doc = concat!("[`", stringify!($name), "::FIELDS`]).")]
        /// Booleans are read as `true`/`false` or `0`/`1` and written as
        /// `true`/`false`. Fields after the known ones are kept in `extra`.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
            /// Fields after the ones Synapse 1.163.2 writes (from a newer
            /// Synapse), kept in order and written back after the known
            /// fields, so re-encoding gives the same bytes. Usually empty.
            pub extra: Vec<$crate::streams::RawJson>,
        }

        impl $name {
            /// Synapse's names of the fields this version knows, in order.
            pub const FIELDS: &'static [&'static str] = &[$($wire),*];
        }

        impl $crate::streams::de::SeqRow for $name {
            const EXPECTING: &'static str = $expecting;

            fn visit<'de, A: ::serde::de::SeqAccess<'de>>(
                mut seq: A,
                tracker: &$crate::streams::de::Tracker,
            ) -> Result<Self, A::Error> {
                let index = 0usize;
                $(
                    tracker.at(index, concat!($prefix, $wire));
                    let $field: $ty = match seq
                        .next_element::<<$ty as $crate::streams::de::Field>::Wire>()?
                    {
                        Some(value) => value.into(),
                        None => return Err(tracker.missing(index, &$expecting)),
                    };
                    let index = index + 1;
                )*
                let extra = $crate::streams::de::read_extra(&mut seq, tracker, index)?;
                Ok($name { $($field,)* extra })
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use ::serde::ser::SerializeTuple as _;
                let mut tuple = serializer.serialize_tuple(Self::FIELDS.len() + self.extra.len())?;
                $( tuple.serialize_element(&self.$field)?; )*
                for field in &self.extra {
                    tuple.serialize_element(field)?;
                }
                tuple.end()
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $crate::streams::de::deserialize(deserializer)
            }
        }
    };
}

pub(crate) use row_struct;
