//! The docs keep up with the code: every journal record kind that `src/`
//! writes is named in docs/journal.md.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Record kinds written outside tests: `record("kind", ...)`,
/// `record_at(ts, "kind", ...)`, and the coordinator's `journal("kind", ...)`.
fn written_kinds() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let patterns = [
        regex::Regex::new(r#"\brecord\(\s*"([a-z_]+)""#).unwrap(),
        regex::Regex::new(r#"(?s)\brecord_at\(\s*[^,;]+?,\s*"([a-z_]+)""#).unwrap(),
        regex::Regex::new(r#"\bjournal\(\s*"([a-z_]+)""#).unwrap(),
    ];
    let mut kinds = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for re in &patterns {
            for c in re.captures_iter(code) {
                kinds.push((c[1].to_string(), f.display().to_string()));
            }
        }
    }
    kinds.sort();
    kinds.dedup_by(|a, b| a.0 == b.0);
    kinds
}

#[test]
fn every_record_kind_written_is_documented_in_journal_md() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/journal.md"))
            .unwrap();
    let kinds = written_kinds();
    assert!(kinds.len() > 40, "the scan found too few kinds: {kinds:?}");
    let missing: Vec<_> = kinds
        .iter()
        .filter(|(k, _)| !doc.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "record kinds written but not in docs/journal.md: {missing:?}"
    );
}
