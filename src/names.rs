//! The `names!` macro: a field that takes one of a few names, as a serde
//! enum. Used by the journal's schema and by the policies whose words the
//! journal records.

/// A journal field that takes one of a few names: a serde enum of them,
/// with `Unknown` for a name a later build writes, and the name back.
macro_rules! names {
    ($( $(#[$meta:meta])* $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),* $(,)? } )*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
            pub enum $name {
                $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )*
                /// A name this build does not know (a later build's).
                #[serde(other, rename = "unknown")]
                Unknown,
            }

            impl $name {
                /// The name as the journal writes it.
                pub fn name(self) -> &'static str {
                    match self {
                        $( $name::$variant => $text, )*
                        $name::Unknown => "unknown",
                    }
                }
            }

            impl $crate::names::Named for $name {
                fn name(self) -> &'static str {
                    $name::name(self)
                }
            }

            impl std::fmt::Display for $name {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(self.name())
                }
            }
        )*
    };
}

/// A `names!` enum's name, for code that takes any of them.
pub trait Named: Copy {
    fn name(self) -> &'static str;
}

/// The name of a field that may be absent: `?` when it is.
pub fn or_unknown<T: Named>(v: &Option<T>) -> &'static str {
    v.map_or("?", Named::name)
}
