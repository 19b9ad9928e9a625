//! `resilio config show`: the configuration in force, key by key, each with
//! the layer that set it (built-in default, a file's `file:line`, the
//! environment), in the order of conf/resilio.toml.

use super::file::{line_of, SECTIONS};
use super::*;
use std::fmt::Write as _;
use toml::Spanned;

/// One file's keys as written: `section -> key -> value` with its position.
type Written = BTreeMap<String, BTreeMap<String, Spanned<toml::Value>>>;

/// A file's keys, `(section, key) -> (value, "file:line")`.
type Located = BTreeMap<(String, String), (toml::Value, String)>;

/// The documented defaults, the file every built-in value is written in.
const DEFAULTS: &str = include_str!("../../conf/resilio.toml");

/// A layer's keys, read after [`Config::load`] accepted the file.
fn written(text: &str, path: &Path) -> Result<Written> {
    toml::from_str(text).map_err(|e| Error::Config {
        path: path.to_path_buf(),
        line: line_of(text, e.span().map(|s| s.start).unwrap_or(0)),
        message: e.message().trim().replace('\n', " "),
    })
}

/// The built-in value of a key conf/resilio.toml leaves commented out (a
/// value from the environment, a long regex, a built-in list), or `None`
/// for a key that is unset by default.
fn builtin(section: &str, key: &str) -> Option<String> {
    let quoted = |s: &str| toml::Value::String(s.to_string()).to_string();
    let list = |v: &[&str]| {
        toml::Value::Array(
            v.iter()
                .map(|s| toml::Value::String(s.to_string()))
                .collect(),
        )
        .to_string()
    };
    use crate::policy::patterns as f;
    Some(match (section, key) {
        ("run", "state_dir") => quoted(&default_state_dir().to_string_lossy()),
        ("progress", "regex") => quoted(DEFAULT_PROGRESS_REGEX),
        ("progress", "checkpoint_regex") => quoted(DEFAULT_CHECKPOINT_REGEX),
        ("progress", "eval_regex") => quoted(DEFAULT_EVAL_REGEX),
        ("checkpoint", "watch_regex") => quoted(DEFAULT_CHECKPOINT_WATCH_REGEX),
        ("failure", "ignore_patterns") => list(f::DEFAULT_IGNORE),
        ("failure", "ambiguous_patterns") => list(f::DEFAULT_AMBIGUOUS),
        ("failure", "user_patterns") => list(f::DEFAULT_USER),
        ("failure", "infrastructure_patterns") => list(f::DEFAULT_INFRA),
        ("failure", "secondary_patterns") => list(f::DEFAULT_SECONDARY),
        ("failure", "generic_patterns") => list(f::DEFAULT_GENERIC),
        _ => return None,
    })
}

/// The configuration `resilio run --config FILE` would use (without flags),
/// as TOML with the origin of every value in a comment. Errors are the ones
/// `run` would give.
pub fn show(user_file: Option<&Path>) -> Result<String> {
    Config::load(user_file)?;
    // Each file's keys, with the `file:line` that sets them.
    let mut layers: Vec<(String, Located)> = Vec::new();
    for path in system_file()?
        .into_iter()
        .chain(user_file.map(Path::to_path_buf))
    {
        let text = std::fs::read_to_string(&path).map_err(|source| Error::ConfigRead {
            path: path.clone(),
            source,
        })?;
        let mut set = BTreeMap::new();
        for (section, values) in written(&text, &path)? {
            for (key, value) in values {
                let at = format!("{}:{}", path.display(), line_of(&text, value.span().start));
                set.insert((section.clone(), key), (value.into_inner(), at));
            }
        }
        layers.push((path.display().to_string(), set));
    }
    let defaults = written(DEFAULTS, Path::new("conf/resilio.toml"))?;
    let mut out = String::new();
    let mut order = vec!["built-in defaults".to_string()];
    order.extend(layers.iter().map(|(name, _)| name.clone()));
    order.push("$RESILIO_STATE_DIR".into());
    let _ = writeln!(
        out,
        "# The configuration in force, later layers winning: {}.",
        order.join(", ")
    );
    let _ = writeln!(out, "# Flags given to `resilio run` win over all of these.");
    for (section, _, keys) in SECTIONS {
        let _ = writeln!(out, "\n[{section}]");
        for key in *keys {
            let mut value = None;
            let mut origin = "built-in default".to_string();
            if let Some(v) = defaults.get(*section).and_then(|s| s.get(*key)) {
                value = Some(v.get_ref().to_string());
            } else if let Some(v) = builtin(section, key) {
                value = Some(v);
            }
            for (_, set) in &layers {
                if let Some((v, at)) = set.get(&(section.to_string(), key.to_string())) {
                    value = Some(v.to_string());
                    origin = at.clone();
                }
            }
            if (*section, *key) == ("run", "state_dir") {
                if let Some(dir) = state_dir_from_env() {
                    value = Some(toml::Value::String(dir.to_string_lossy().into()).to_string());
                    origin = "$RESILIO_STATE_DIR".into();
                }
            }
            match value {
                Some(v) => {
                    let _ = writeln!(out, "{key} = {v}  # {origin}");
                }
                None => {
                    let _ = writeln!(out, "# {key}: not set  # {origin}");
                }
            }
        }
    }
    Ok(out)
}
