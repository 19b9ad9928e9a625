//! The journal reader: any bytes as one journal file (a shared state dir
//! can hold anything). Never panics; every record it keeps is whole and
//! its typed event survives a write and a read; the report and the
//! timeline of what it read render.
#![no_main]

use libfuzzer_sys::fuzz_target;
use resilio::event::Event;
use resilio::journal::parse_file;

fuzz_target!(|data: &[u8]| {
    let (mut records, skip) = parse_file(data);
    assert_eq!(records.len(), skip.records);
    let _ = skip.describe();
    for r in &records {
        let line = serde_json::to_string(r).expect("a record serializes");
        let (again, s) = parse_file(line.as_bytes());
        assert_eq!((again.len(), s.lines), (1, 0), "{line}");
        if let Some(ev) = r.event() {
            let kind = ev.kind();
            let fields = ev.clone().into_fields();
            assert_eq!(
                Event::from_fields(kind, &fields).as_ref(),
                Some(ev),
                "{line}"
            );
        }
    }
    records.sort_by_key(|r| r.ts);
    let report = resilio::analysis::report::build("fuzz", &records, skip.lines, None);
    let _ = resilio::analysis::report::render_text(&report);
    let _ = resilio::analysis::timeline::render("fuzz", &records, None);
});
