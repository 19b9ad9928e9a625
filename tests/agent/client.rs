//! The Python client (clients/python): its own unittest suite, standard
//! library only. No-op without resilio, never raises, the documented wire
//! format, the checkpoint request cycle, the rollback's variables, and both framework callbacks
//! importable and working without their frameworks installed.

use std::process::Command;

#[test]
fn the_python_client_suite_passes() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(format!("{root}/clients/python/tests"))
        .env_remove("RESILIO_SOCKET")
        .env_remove("RESILIO_CONTROL")
        .env_remove("RESILIO_ROLLBACK_STEP")
        .env_remove("RESILIO_SKIP_STEPS")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    // Every case ran (a discovery problem would run none and still pass).
    assert!(text.contains("Ran 11 tests"), "{text}");
}
