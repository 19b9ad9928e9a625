//! Small pieces used across resilio that belong to no one concern.
//!
//! - [`clock`]: the time records are stamped with (the wall clock read once,
//!   carried on the monotonic clock: a step of the wall clock moves nothing).
//! - [`cmd`]: running an external command with a timeout, and spawning in a
//!   process group of its own that dies with resilio.
//! - [`files`]: reading a file someone else may have planted (no symlink,
//!   no FIFO or device, a size cap).
//! - [`runtime_dir`]: the private directory of the progress sockets, checked
//!   before use (a squatted one is replaced), and stale sockets removed.

pub mod clock;
pub mod cmd;
pub mod files;
pub mod runtime_dir;

/// `text` made safe to print on a terminal: control characters (C0 but
/// newline and tab, carriage return, DEL, C1) written as `\x1b` or
/// `\u{9b}`, so that what a trainer, a host or a planted journal put in a
/// record cannot clear an admin's screen, move the cursor or write the
/// clipboard (OSC 52) when `resilio report`, `timeline`, `nodes` or
/// `status` prints it.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| (c.is_control() && c != '\n' && c != '\t') || c == '\u{7f}';
    if !text.chars().any(bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if bad(c) {
            if (c as u32) < 0x80 {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` cut to at most `max` characters for a one-line summary: at a
/// word's end where one is near, and marked (`...`) when anything was cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let head: String = text.chars().take(max.saturating_sub(3)).collect();
    let cut = match head.rfind(char::is_whitespace) {
        Some(i) if head.len() - i < 40 => head[..i].trim_end(),
        _ => head.as_str(),
    };
    format!("{cut}...")
}

/// The current-thread runtime every resilio command runs its loop on.
pub fn runtime() -> crate::error::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::error::Error::Other(format!("cannot start runtime: {e}")))
}

/// Give the heap's free pages back to the system. A rank agent's setup
/// (its configuration, its patterns compiled) leaves about a megabyte
/// freed but still held by the allocator for the weeks the trainer runs;
/// at 8 ranks a node, each agent pays it. glibc only (elsewhere nothing to
/// do).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free
    // pages of the allocator's own heap to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

static ARGS: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

/// This process's command line as resilio reads it: the one `main` parsed
/// (the SPANK plugin's task stands for `resilio run ... -- COMMAND`), which
/// a re-exec of itself must repeat; else the process's own.
pub fn args_os() -> Vec<std::ffi::OsString> {
    ARGS.get()
        .cloned()
        .unwrap_or_else(|| std::env::args_os().collect())
}

/// Set once by `main`, before anything re-executes itself.
pub fn set_args(args: Vec<std::ffi::OsString>) {
    let _ = ARGS.set(args);
}

/// A command running this very binary again, with `argv[0]` as this
/// process got it: through `/proc/self/exe`, which still names this
/// program after its file was replaced on disk (a package upgrade during a
/// long job), where `current_exe()` would name a deleted path.
pub fn own_binary() -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let exe = std::path::Path::new("/proc/self/exe");
    let mut cmd = if exe.exists() {
        std::process::Command::new(exe)
    } else {
        std::process::Command::new(std::env::current_exe().unwrap_or_else(|_| exe.into()))
    };
    if let Some(a0) = args_os().into_iter().next() {
        cmd.arg0(a0);
    }
    cmd
}

/// `eprintln!` that never panics: a stderr that went away (a `| head`, a
/// `>(tee ...)` reader gone) is not a reason for resilio to die.
#[macro_export]
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(super::terminal_safe("step 1\tok\n"), "step 1\tok\n");
        assert_eq!(
            super::terminal_safe("a\x1b[2Jb\x1b]52;c;aGk=\x07\r\u{9b}c"),
            "a\\x1b[2Jb\\x1b]52;c;aGk=\\x07\\x0d\\u{9b}c"
        );
    }

    #[test]
    fn clip_cuts_at_a_word_and_says_so() {
        assert_eq!(super::clip("short", 10), "short");
        let c = super::clip("the probes could not tell what rank 1 was doing", 30);
        assert_eq!(c, "the probes could not tell...");
        assert!(c.chars().count() <= 30);
        // No space near the end: cut where it must.
        assert_eq!(super::clip("abcdefghijklmnop", 8), "abcde...");
    }
}
