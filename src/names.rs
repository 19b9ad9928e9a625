//! The `names!` macro: a field that takes one of a few names, as a serde
//! enum. Used by the journal's schema and by the policies whose words the
//! journal records.

/// A journal field that takes one of a few names: a serde enum of them,
/// with `Unknown` for a name a later build writes, and the name back.
macro_rules! names {
    ($( $(#[$meta:meta])* $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),* $(,)? } )*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
            pub enum $name {
                $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )*
                /// A name this build does not know (a later build's); the
                /// default of a record built field by field.
                #[default]
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

                /// The value a name stands for; `None` for any other (a
                /// configuration's word: `unknown` is no value there).
                pub fn parse(s: &str) -> Option<$name> {
                    match s {
                        $( $text => Some($name::$variant), )*
                        _ => None,
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

#[cfg(test)]
mod tests {
    use crate::policy::numerical::Act;

    #[test]
    fn a_name_parses_to_its_value_and_back_and_unknown_is_no_value() {
        for a in [Act::Record, Act::Stop, Act::Rollback] {
            assert_eq!(Act::parse(a.name()), Some(a));
        }
        assert_eq!(Act::parse("unknown"), None);
        assert_eq!(Act::parse("Stop"), None);
        let read: Act = serde_json::from_str("\"halt\"").unwrap();
        assert_eq!((read, read.name()), (Act::Unknown, "unknown"));
    }
}
