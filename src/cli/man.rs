//! `resilio man` and `resilio completions`.

use super::Cli;
use crate::error::{Error, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct CompletionsArgs {
    /// The shell
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub(super) struct ManArgs {
    /// Directory to write the pages into
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
}

/// `resilio man`: one page per visible subcommand, and the top page.
pub(super) fn man_cmd(a: ManArgs) -> Result<i32> {
    use clap::CommandFactory;
    let top = Cli::command();
    let io = |p: &std::path::Path, e: std::io::Error| Error::Usage(format!("{}: {e}", p.display()));
    std::fs::create_dir_all(&a.dir).map_err(|e| io(&a.dir, e))?;
    let mut pages: Vec<(String, clap::Command)> = vec![("resilio".into(), top.clone())];
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("resilio-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, cmd) in pages {
        let path = a.dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd)
            .render(&mut buf)
            .map_err(|e| io(&path, e))?;
        buf.extend(exit_status_section(name.strip_prefix("resilio-")).into_bytes());
        std::fs::write(&path, buf).map_err(|e| io(&path, e))?;
        println!("{}", path.display());
    }
    Ok(0)
}

/// The man page's EXIT STATUS section: the codes of `command` (all of them
/// for the top page), from [`crate::error::EXIT_CODES`].
pub(super) fn exit_status_section(command: Option<&str>) -> String {
    // Roff: `code` in bold, backslashes escaped, no line starting with a dot.
    let roff = |s: &str| {
        let s = s.replace('\\', "\\e");
        let mut out = String::new();
        for (i, part) in s.split('`').enumerate() {
            if i % 2 == 1 {
                out += &format!("\\fB{part}\\fR");
            } else {
                out += part;
            }
        }
        if out.starts_with('.') || out.starts_with('\'') {
            out.insert_str(0, "\\&");
        }
        out
    };
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning, commands) in crate::error::EXIT_CODES {
        let applies = match command {
            None => true,
            Some(c) => {
                commands.contains("every command")
                    || commands.contains(&format!("`{c}`"))
                    || commands.contains(&format!("`{c} "))
                    || (commands.contains("only print") && !["run", "demo"].contains(&c))
            }
        };
        if applies {
            out += &format!(".TP\n{}\n{}\n", roff(code), roff(meaning));
        }
    }
    out
}

/// `resilio completions SHELL`.
pub(super) fn completions_cmd(a: &CompletionsArgs) -> Result<i32> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "resilio", &mut std::io::stdout());
    Ok(0)
}
