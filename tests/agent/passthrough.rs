use crate::common::*;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn pseudo_random_bytes(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn binary_output_passes_through_byte_for_byte_on_both_streams() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = pseudo_random_bytes(3 * 1024 * 1024);
    // Every byte value, NULs, CRs, invalid UTF-8, and a long line without newline.
    data.extend(0u8..=255);
    data.extend(std::iter::repeat_n(b'x', 200_000));
    let f = dir.path().join("blob");
    std::fs::write(&f, &data).unwrap();
    let f = f.to_str().unwrap();

    let mut c = resilio_run(dir.path(), "bin");
    c.args(["--", "cat", f]);
    let (o, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0));
    assert!(
        o.stdout == data,
        "stdout differs ({} vs {} bytes)",
        o.stdout.len(),
        data.len()
    );
    assert!(o.stderr.is_empty());

    let mut c = resilio_run(dir.path(), "bin2");
    c.args(["--", "sh", "-c", &format!("cat {f} >&2; printf 'out\\n'")]);
    let (o, _) = output_within(&mut c, Duration::from_secs(60));
    assert!(o.stderr == data, "stderr differs");
    assert_eq!(o.stdout, b"out\n");
}

/// Slurm opens the output file with O_APPEND (`--open-mode=append`): the
/// pass-through cannot splice into it and must copy, exactly, after what
/// the file already held.
#[test]
fn binary_output_appended_to_a_file_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random_bytes(2 * 1024 * 1024 + 123);
    let src = dir.path().join("blob");
    std::fs::write(&src, &data).unwrap();
    let out = dir.path().join("job.out");
    std::fs::write(&out, b"earlier attempt\n").unwrap();
    let file = std::fs::OpenOptions::new().append(true).open(&out).unwrap();
    let status = resilio_run(dir.path(), "append")
        .args(["--", "cat", src.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let got = std::fs::read(&out).unwrap();
    let mut want = b"earlier attempt\n".to_vec();
    want.extend_from_slice(&data);
    assert!(
        got == want,
        "file differs ({} vs {} bytes)",
        got.len(),
        want.len()
    );
}

/// An output pipe left non-blocking by a parent: a slow reader is waited
/// for (EAGAIN), nothing is lost or duplicated.
#[test]
fn a_non_blocking_output_pipe_with_a_slow_reader_loses_nothing() {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random_bytes(3 * 1024 * 1024);
    let src = dir.path().join("blob");
    std::fs::write(&src, &data).unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    fcntl(&w, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
    let mut child = resilio_run(dir.path(), "nonblock")
        .args(["--", "cat", src.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::from(w))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::from(r);
        // Let resilio fill the pipe and meet EAGAIN first.
        std::thread::sleep(Duration::from_millis(500));
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        got
    });
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let got = reader.join().unwrap();
    assert!(
        got == data,
        "output differs ({} vs {} bytes)",
        got.len(),
        data.len()
    );
}

/// A reader of resilio's output that lags (a slow filesystem behind
/// slurmstepd, a paused pager) must not stop progress from being seen while
/// the pipe still has room: a trainer printing a line at a time is not
/// taken for stalled.
#[test]
fn a_lagging_reader_of_line_by_line_output_is_no_stall() {
    let dir = tempfile::tempdir().unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    let child = resilio_run(dir.path(), "lag")
        .args([
            "--stall-timeout",
            "1s",
            "--",
            "python3",
            "-c",
            "import os, time\nfor i in range(1, 41):\n    os.write(1, b'step %d\\n' % i); time.sleep(0.1)\n",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(w))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // 40 lines over 4 s; nobody reads the first 3 s (the pipe holds them all).
    std::thread::sleep(Duration::from_secs(3));
    let mut out = Vec::new();
    std::fs::File::from(r).read_to_end(&mut out).unwrap();
    let (o, _) = wait_output(child, Duration::from_secs(30));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 40);
}

#[test]
fn a_partial_line_is_not_held_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = resilio_run(dir.path(), "partial");
    c.args(["--", "sh", "-c", "printf 'loading'; sleep 30; echo done"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 7];
    out.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"loading");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "partial line was buffered"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_closed_stdout_does_not_block_or_kill_the_trainer() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = resilio_run(dir.path(), "epipe");
    // 5 MB of output into a reader that went away: the trainer still finishes.
    c.args(["--", "sh", "-c", "head -c 5000000 /dev/zero; exit 7"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    drop(child.stdout.take());
    let (o, _) = wait_output(child, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(7));
}

#[test]
fn an_interactive_trainer_gets_the_terminal() {
    // script(1) (util-linux, essential on Debian) gives resilio a pseudo-terminal
    // as stdin; a trainer in its own process group could not read it unless
    // resilio hands the terminal's foreground over (breakpoint(), input()).
    let dir = tempfile::tempdir().unwrap();
    let inner = format!(
        "RESILIO_STATE_DIR={} {} run --job-id tty -- python3 -c 'x = input(\"prompt> \"); print(\"got\", x)'; echo rc=$?",
        dir.path().display(),
        bin()
    );
    let mut c = std::process::Command::new("script");
    c.args(["-qec", &inner, "/dev/null"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello-from-tty\n")
        .unwrap();
    let (o, _) = wait_output(child, Duration::from_secs(30));
    let out = String::from_utf8_lossy(&o.stdout).replace('\r', "");
    assert!(out.contains("got hello-from-tty"), "{out}");
    assert!(out.contains("rc=0"), "{out}");
}

/// resilio's own lines never continue a trainer's unended one (a tqdm frame
/// ends with no newline): each starts a line, so `grep '^resilio:'` finds
/// them all. The trainer's bytes are all there, unchanged.
#[test]
fn resilio_lines_start_a_line_after_an_unended_bar_frame() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bar.py");
    std::fs::write(
        &script,
        "import sys, time\nfor i in range(1, 30):\n    sys.stderr.write(f\"\\r 40%|####      | {i}/60 [00:01<00:02, 14.54it/s]\")\n    sys.stderr.flush()\n    time.sleep(0.1)\n    if i == 10:\n        time.sleep(6)\n",
    )
    .unwrap();
    let mut c = resilio_run(dir.path(), "glue");
    c.args([
        "--stall-floor",
        "2s",
        "--max-restarts",
        "0",
        "--",
        "python3",
    ])
    .arg(&script);
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    let err = stderr_of(&o);
    let ours = err.matches("resilio:").count();
    assert!(ours >= 1, "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("resilio:")).count(),
        ours,
        "{err:?}"
    );
    assert!(err.contains(" 10/60 [00:01<00:02, 14.54it/s]"), "{err:?}");
}
