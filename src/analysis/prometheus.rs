//! Prometheus's text format, for node_exporter's textfile collector.

/// A label's value, escaped for the text format.
pub fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family: its help, its type, its rows (labels, value).
pub fn family(out: &mut String, name: &str, kind: &str, help: &str, rows: Vec<(String, String)>) {
    *out += &format!("# HELP resilio_{name} {help}\n# TYPE resilio_{name} {kind}\n");
    for (labels, value) in rows {
        *out += &format!("resilio_{name}{labels} {value}\n");
    }
}
