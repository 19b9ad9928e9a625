//! `events!`: one struct per record kind, every field optional, and the
//! [`super::Event`] enum tagged by `kind`.

macro_rules! events {
    (
        $(
            $(#[$meta:meta])*
            $variant:ident = $name:literal {
                $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)?
            }
        )*
        ;
        $( $(#[$xmeta:meta])* $xvariant:ident = $xname:literal => $xty:ty ),* $(,)?
    ) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
            pub struct $variant {
                $(
                    $(#[$fmeta])*
                    #[serde(default, skip_serializing_if = "Option::is_none")]
                    pub $field: Option<$ty>,
                )*
            }

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

        /// Every kind this build writes or reads.
        pub const KINDS: &[&str] = &[ $( $name, )* $( $xname, )* ];
    };
}
