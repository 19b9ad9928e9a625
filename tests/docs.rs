//! The docs keep up with the code: every journal record kind of the schema
//! (`src/event.rs`) is named in docs/journal.md, and nothing else is.

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
    // Writers build typed events (`src/event.rs`, checked against the docs
    // below); a kind still written by name must be one of the schema's.
    let kinds = written_kinds();
    let unknown: Vec<_> = kinds
        .iter()
        .filter(|(k, _)| !resilio::event::KINDS.contains(&k.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "kinds written by name but not in src/event.rs: {unknown:?}"
    );
    let missing: Vec<_> = kinds
        .iter()
        .filter(|(k, _)| !doc.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "record kinds written but not in docs/journal.md: {missing:?}"
    );
}

/// The schema (`src/event.rs`) and docs/journal.md's tables name the same kinds.
#[test]
fn the_schema_and_journal_md_name_the_same_kinds() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/journal.md"))
            .unwrap();
    let undocumented: Vec<&&str> = resilio::event::KINDS
        .iter()
        .filter(|k| !doc.contains(&format!("`{k}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "kinds of src/event.rs not in docs/journal.md: {undocumented:?}"
    );
    // The first cell of each row of the kinds tables.
    let cell =
        regex::Regex::new(r"(?m)^\| (`[a-z_]+`(?:(?: / |, )`[a-z_]+`)*)(?: \(coordinator\))? \|")
            .unwrap();
    let kind = regex::Regex::new(r"`([a-z_]+)`").unwrap();
    let documented: Vec<String> = cell
        .captures_iter(&doc)
        .flat_map(|c| {
            kind.captures_iter(&c[1])
                .map(|k| k[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(documented.len() > 50, "read too few rows: {documented:?}");
    let unknown: Vec<&String> = documented
        .iter()
        .filter(|k| !resilio::event::KINDS.contains(&k.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/journal.md documents kinds src/event.rs does not have: {unknown:?}"
    );
}

/// resilio's own code writes typed events (`Writer::write`), never a
/// record shaped by hand (`Writer::record`, kept for tests and tools).
#[test]
fn resilio_writes_every_record_through_the_schema() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let call = regex::Regex::new(r"\.record(_at)?\(").unwrap();
    let mut by_hand = Vec::new();
    for f in files {
        if f.ends_with("journal/writer.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        // Up to the file's test module (test code may shape records by hand).
        let code = text.split("\n#[cfg(test)]\nmod ").next().unwrap_or("");
        for (i, line) in code.lines().enumerate() {
            if call.is_match(line) && !line.trim_start().starts_with("//") {
                by_hand.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(by_hand.is_empty(), "records written by hand: {by_hand:#?}");
}

/// Every exit code resilio's errors map to is in the README's table.
#[test]
fn every_exit_code_is_in_the_readme() {
    use resilio::error::*;
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for code in [
        EXIT_USAGE,
        EXIT_NO_JOB,
        EXIT_NOT_PERMITTED,
        EXIT_NO_COORDINATOR,
        EXIT_NOT_CONFIRMED,
        EXIT_INTERNAL,
        EXIT_STALLED,
        EXIT_NOT_EXECUTABLE,
        EXIT_NOT_FOUND,
    ] {
        assert!(
            readme.contains(&format!("| `{code}` |"))
                || readme.contains(&format!("`{code}` /"))
                || readme.contains(&format!("/ `{code}` |")),
            "exit code {code} is not in the README's table"
        );
    }
}

/// The README's exit-code table is `resilio::error::EXIT_CODES`, row for
/// row, and every man page has its EXIT STATUS.
#[test]
fn the_readme_and_the_man_pages_give_the_same_exit_codes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let table = &readme[readme.find("| Code | Meaning | Commands |").unwrap()..];
    let rows: Vec<Vec<String>> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect();
    let want: Vec<Vec<String>> = resilio::error::EXIT_CODES
        .iter()
        .map(|(a, b, c)| vec![a.to_string(), b.to_string(), c.to_string()])
        .collect();
    assert_eq!(rows, want);
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_resilio"))
        .args(["man", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success());
    let page = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
    let run = page("resilio-run.1");
    let status = page("resilio-status.1");
    assert!(run.contains(".SH \"EXIT STATUS\""), "{run}");
    assert!(run.contains("\\fB124\\fR") && !run.contains("\\fB5\\fR"));
    assert!(status.contains("\\fB5\\fR") && !status.contains("\\fB124\\fR"));
    assert!(page("resilio.1").contains("\\fB141\\fR"));
}

/// Markdown files of the project (not build output, not the fuzz corpora).
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !(name.starts_with('.')
                || ["target", "fuzz", "node_modules"].contains(&name.as_str()))
            {
                markdown_files(&p, out);
            }
        } else if name.ends_with(".md") {
            out.push(p);
        }
    }
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#').replace('`', "").as_str()));
        }
    }
    out
}

#[test]
fn every_link_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    markdown_files(root, &mut files);
    assert!(files.len() >= 10, "{files:?}");
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        // Links in code blocks are examples, not links.
        let mut prose = String::new();
        let mut in_code = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            } else if !in_code {
                prose += line;
                prose.push('\n');
            }
        }
        for c in link.captures_iter(&prose) {
            let target = &c[1];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let dest = if path.is_empty() {
                f.clone()
            } else {
                f.parent().unwrap().join(path)
            };
            let shown = format!("{}: {target}", f.strip_prefix(root).unwrap().display());
            if !dest.exists() {
                broken.push(format!("{shown} (no such file)"));
                continue;
            }
            if !anchor.is_empty() && dest.extension().is_some_and(|x| x == "md") {
                let there = anchors(&std::fs::read_to_string(&dest).unwrap());
                if !there.iter().any(|a| a == anchor) {
                    broken.push(format!("{shown} (no heading #{anchor})"));
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
