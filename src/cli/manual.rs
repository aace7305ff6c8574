//! `agentfs completions SHELL` and `agentfs man [--dir DIR]`: shell completions and manual
//! pages, both generated from the command line's own definitions, so they cannot drift.

use std::path::PathBuf;

use super::{CliError, Code};

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write agentfs.1 and one page per verb (agentfs-run.1, ...) into DIR; without it, print
    /// agentfs.1 (`agentfs man | man -l -`).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Print the completion script for `a.shell` (bash: `source <(agentfs completions bash)`).
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> super::CliResult {
    clap_complete::generate(a.shell, &mut cmd, "agentfs", &mut std::io::stdout());
    Ok(0)
}

pub fn man(a: ManArgs, cmd: clap::Command) -> super::CliResult {
    // The verbs, not clap's `help` (which the per-verb pages leave out too).
    let cmd = cmd.disable_help_subcommand(true);
    let failed = |what: &str, e: std::io::Error| CliError::new(Code::Io, format!("{what}: {e}"));
    match a.dir {
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .map_err(|e| failed("writing the page", e))?,
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|e| failed(&dir.display().to_string(), e))?;
            clap_mangen::generate_to(cmd, &dir)
                .map_err(|e| failed(&dir.display().to_string(), e).at(&dir))?;
        }
    }
    Ok(0)
}
