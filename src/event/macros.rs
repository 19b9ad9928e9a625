//! `events!`: one struct per record kind and the [`super::Event`] enum
//! tagged by `kind`. A field marked `required` is written by every writer of
//! its kind, in this build (the compiler holds each writer to it) and in
//! every build whose journals are kept under `tests/fixtures/journals/` (a
//! test reads them all): it is its plain type, and readers take it as it is.
//! Only a record resilio did not write (made by hand, or cut by another
//! tool) can lack one or hold `null` there; it reads as its type's zero
//! (`Unknown` for a name), so that such a record is still read as its kind
//! rather than dropped.
//! Every other field is an `Option`, absent when unknown.

/// One kind's struct, its fields gathered one at a time (`required` ones as
/// they are, the rest as `Option`s skipped when absent).
macro_rules! event_struct {
    (@fields [$(#[$meta:meta])*] $variant:ident [$($done:tt)*]) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        pub struct $variant { $($done)* }
    };
    (@fields $meta:tt $variant:ident [$($done:tt)*]
        $(#[$fmeta:meta])* required $field:ident : $ty:ty $(, $($rest:tt)*)?) => {
        event_struct!(@fields $meta $variant [$($done)*
            $(#[$fmeta])*
            #[serde(default, deserialize_with = "crate::event::fields::null_as_default")]
            pub $field: $ty,
        ] $($($rest)*)?);
    };
    (@fields $meta:tt $variant:ident [$($done:tt)*]
        $(#[$fmeta:meta])* $field:ident : $ty:ty $(, $($rest:tt)*)?) => {
        event_struct!(@fields $meta $variant [$($done)*
            $(#[$fmeta])*
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub $field: Option<$ty>,
        ] $($($rest)*)?);
    };
}

macro_rules! events {
    (
        $(
            $(#[$meta:meta])*
            $variant:ident = $name:literal { $($body:tt)* }
        )*
        ;
        $( $(#[$xmeta:meta])* $xvariant:ident = $xname:literal => $xty:ty ),* $(,)?
    ) => {
        $(
            event_struct!(@fields [$(#[$meta])*] $variant [] $($body)*);

            impl From<$variant> for Event {
                fn from(e: $variant) -> Event {
                    Event::$variant(e)
                }
            }
        )*

        /// One journal record's kind and fields.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind")]
        pub enum Event {
            $(
                $(#[$meta])*
                #[serde(rename = $name)]
                $variant($variant),
            )*
            $(
                $(#[$xmeta])*
                #[serde(rename = $xname)]
                $xvariant($xty),
            )*
        }

        impl Event {
            /// The kind as written in the journal.
            pub fn kind(&self) -> &'static str {
                match self {
                    $( Event::$variant(_) => $name, )*
                    $( Event::$xvariant(_) => $xname, )*
                }
            }
        }

        impl Event {
            /// Read `kind`'s fields (the tag left out) from `de` straight into
            /// its struct, with no copy of them on the way (the derived reader
            /// of a tagged enum buffers every field to find the tag); `None`
            /// for a kind this build does not know.
            pub(crate) fn deserialize_kind<'de, D: serde::Deserializer<'de>>(
                kind: &str,
                de: D,
            ) -> Option<Result<Event, D::Error>> {
                Some(match kind {
                    $( $name => <$variant as Deserialize>::deserialize(de).map(Event::$variant), )*
                    $( $xname => <$xty as Deserialize>::deserialize(de).map(Event::$xvariant), )*
                    _ => return None,
                })
            }
        }

        /// Every kind this build writes or reads.
        pub const KINDS: &[&str] = &[ $( $name, )* $( $xname, )* ];
    };
}
