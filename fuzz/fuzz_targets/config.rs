//! The configuration loader: any text as a `resilio.toml`. Errors are
//! fine (each names a line of the file); panics are not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use resilio::config::Config;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut cfg = Config::default();
    if let Err(e) = cfg.apply_str(text, Path::new("fuzz.toml")) {
        let _ = e.to_string();
    }
});
