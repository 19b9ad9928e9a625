//! The layout keeps to its limits (docs/architecture.md, "Where the layout
//! stands"): no import circle between modules or files, and no file over
//! 700 or function over 100 non-test lines beyond the listed ones, none of
//! which may grow (tools/layout-allowances.txt).

use std::process::Command;

#[test]
fn the_layout_has_no_circle_and_nothing_over_its_limits_beyond_the_list() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .arg(format!("{root}/tools/measure-layout.py"))
        .arg("--check")
        .arg(format!("{root}/src"))
        .output()
        .expect("python3 runs tools/measure-layout.py");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// docs/architecture.md states the figures the tool measures.
#[test]
fn the_architecture_doc_states_what_the_tool_measures() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .arg(format!("{root}/tools/measure-layout.py"))
        .arg(format!("{root}/src"))
        .output()
        .expect("python3 runs tools/measure-layout.py");
    let measured = String::from_utf8_lossy(&out.stdout);
    let doc = std::fs::read_to_string(format!("{root}/docs/architecture.md")).unwrap();
    for line in measured.lines() {
        assert!(
            doc.contains(line),
            "docs/architecture.md does not state `{line}`: rerun `python3 tools/measure-layout.py` and paste its lines there"
        );
    }
}
