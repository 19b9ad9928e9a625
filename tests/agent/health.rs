use crate::common::*;
use std::time::Duration;

#[test]
fn a_failing_health_check_keeps_the_trainer_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("trainer-ran");
    let cfg = write_config(
        dir.path(),
        "[health]\ncommand = [\"sh\", \"-c\", \"echo 'GPU 3: 12 uncorrectable ECC errors'; exit 1\"]\n",
    );
    let mut c = resilio_run(dir.path(), "unhealthy");
    c.args([
        "--config",
        cfg.to_str().unwrap(),
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    let (o, _) = output_within(&mut c, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(125), "{}", stderr_of(&o));
    assert!(
        !marker.exists(),
        "the trainer must not start on an unhealthy node"
    );
    assert!(stderr_of(&o).contains("health check failed"));
    let recs = records(dir.path(), "unhealthy");
    let h = one(&recs, "health_check");
    assert_eq!(h.get("result").unwrap()["ok"], false);
    let exit = one(&recs, "rank_exit");
    assert_eq!(exit.str("class"), Some("infrastructure"));
    assert!(exit.str("evidence").unwrap().contains("ECC"));
}

#[test]
fn a_health_check_failing_after_a_crash_blames_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("gpu-broken");
    let cfg = write_config(
        dir.path(),
        &format!(
            "[health]\ncommand = [\"sh\", \"-c\", \"test ! -e {}\"]\n",
            broken.display()
        ),
    );
    let mut c = resilio_run(dir.path(), "after");
    // The trainer "breaks the GPU" and exits 1 with a user-looking traceback.
    c.args([
        "--config",
        cfg.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &format!("echo 'Traceback (most recent call last):' >&2; echo 'ValueError: nan' >&2; touch {}; exit 1", broken.display()),
    ]);
    let (o, _) = output_within(&mut c, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1));
    let recs = records(dir.path(), "after");
    assert_eq!(
        kinds(&recs, "health_check").len(),
        2,
        "before start and after the failure"
    );
    let exit = one(&recs, "rank_exit");
    assert_eq!(exit.str("class"), Some("infrastructure"), "{exit:?}");
}
