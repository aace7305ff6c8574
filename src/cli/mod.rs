//! The command line: one module per subcommand. Every failure is one [`error::CliError`]: a
//! code from the closed set, printed as one line on stderr (one JSON object with `--json`),
//! and the exit status of its code.

mod apply;
mod backup;
mod convert;
mod diff;
mod discard;
pub mod error;
mod fs;
mod fsck;
mod history;
mod init;
mod integrity;
mod kv;
mod manual;
mod materialize;
mod migrate;
mod mount;
mod mount_helper;
mod progress;
mod recover;
mod replica;
mod sandbox;
mod status;
mod tools;
mod umount;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

pub use error::{CliError, Code};

/// AgentFS: a POSIX filesystem stored in one SQLite database.
#[derive(Parser, Debug)]
#[command(name = "agentfs", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print a failure as one JSON object on stderr: {"error":{"code","detail","message",
    /// "path"}} (verbs that report also print their output as JSON).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Work on a directory in a sandbox: make (or reuse) its project and run a command or your
    /// shell where the directory is the project's overlay at its real path.
    Quick(sandbox::QuickArgs),
    /// Run a command (default: your shell, prompt prefixed [NAME]) in a new sandbox of a
    /// project; exits with the command's status.
    Run(sandbox::RunArgs),
    /// Run one command in a project's sandbox: the live one when there is one, else a new one
    /// for the command's lifetime.
    Exec(sandbox::ExecArgs),
    /// Create a project (NAME) or a new database with the SPEC v0.5 schema (a path: one with a
    /// `/` or ending in .db, .sqlite or .sqlite3).
    Init(init::Args),
    /// List what an overlay delta changes in its base directory (or print it as a patch).
    Diff(diff::Args),
    /// Write an overlay delta's changes into its base directory.
    Apply(apply::Args),
    /// Remove a project: stop its sandbox, unmount its delta, then delete its directory
    /// (refused while it has changes never applied, unless --force).
    Discard(discard::Args),
    /// Find and fix what crashes left behind (dead mounts, stale records and markers, an
    /// apply stopped halfway, orphaned projects); safe to repeat.
    Recover(recover::Args),
    /// Switch the mount backend a project keeps (fuse or overlayfs): an upper directory an
    /// overlayfs run left goes into the delta first, then config.toml records the new backend
    /// (not while the project's sandbox runs or its delta is mounted).
    Convert(convert::Args),
    /// Mount a database (created with defaults when absent) and serve it in the background;
    /// with a project NAME: give a new project its directory, or mount its delta.
    Mount(mount::Args),
    /// Unmount a mounted database and wait for its server's final commit.
    ///
    /// Returns after the server has committed everything, made it durable and folded the WAL
    /// into the database file (it exits then), so the database is final when this returns.
    /// Exits 1 and says what was lost when the server reports a failed commit.
    Umount(umount::Args),
    /// Read or change a database's files without mounting it (safe while mounted).
    Fs(fs::Args),
    /// List your live mounts, their databases and server pids (--all: every user's mounts),
    /// and your projects: source, delta size, live sandbox, last run.
    Status(status::Args),
    /// Check a database: SQLite integrity plus every SPEC consistency rule (exit 0 clean,
    /// 1 findings, 2 could not check).
    Integrity(integrity::Args),
    /// Check a database and, with --repair, fix what is safe to fix (never file contents).
    Fsck(fsck::Args),
    /// Upgrade an older-format database to v0.5, in place or by copy with the current layout.
    Migrate(migrate::Args),
    /// Write a consistent single-file copy of a database, also while it is mounted.
    Backup(backup::Args),
    /// Write a portable copy with partial-origin files folded into full files.
    Materialize(materialize::Args),
    /// Get, set, delete or list key/value entries (JSON values); safe while mounted.
    Kv(kv::Args),
    /// Record, list or summarise tool calls in the audit log; safe while mounted.
    Tools(tools::Args),
    /// Print the knob ledger (KNOBS.md).
    Knobs,
    /// Replicate a project (its delta and its history) or a database continuously to an S3
    /// bucket or a directory with Litestream, in the foreground until interrupted.
    Replicate(replica::Args),
    /// Restore a replica into a new project or a new database path and check it.
    RestoreReplica(replica::RestoreArgs),
    /// Snapshot a project's upper layer (a tag names it; -m records a message).
    Snap(history::SnapArgs),
    /// List every snapshot of a project, oldest first; the current one (HEAD) is marked *.
    List(history::NameArgs),
    /// Show a project's history back from HEAD, with each commit's kind.
    Log(history::NameArgs),
    /// Make a project's upper layer equal a snapshot, as a new commit (not while it runs).
    Restore(history::RestoreArgs),
    /// Go back to the state before the last commit, as a new commit (undo again goes forward).
    Undo(history::NameArgs),
    /// Delete the snapshot objects no tag or HEAD reaches (--dry-run lists them; --check
    /// checks the store).
    Gc(history::GcArgs),
    /// Inside a sandbox: ask for a checkpoint now and wait until it is recorded. Outside one:
    /// do nothing (exit 0).
    Checkpoint(history::CheckpointArgs),
    /// Print a shell completion script (bash: `source <(agentfs completions bash)`).
    Completions(manual::CompletionsArgs),
    /// Print the manual page, or write one page per verb into a directory (--dir).
    Man(manual::ManArgs),
    /// Make `mount -t fuse.agentfs DB MNT` and fstab lines work: a symlink
    /// PREFIX/sbin/mount.fuse.agentfs to this executable.
    InstallMountHelper(mount_helper::InstallArgs),
}

/// A subcommand's exit status, or its failure (printed by [`error::report`]).
pub type CliResult = Result<i32, CliError>;

pub fn main() -> i32 {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let called = args.first().map(std::path::Path::new);
    if called.and_then(|p| p.file_name()) == Some(std::ffi::OsStr::new(mount_helper::NAME)) {
        return mount_helper::main(&args[1..]);
    }
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => return usage_error(e),
    };
    error::set_json(json_asked(&matches));
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    let knobs = match crate::knobs::load() {
        Ok(k) => k,
        Err(e) => {
            // Every verb says `bad_knob`; run, exec and quick refuse to start the sandbox
            // (exit 125) as for any other refusal.
            let e = CliError::from(e);
            let launch = matches!(
                cli.command,
                Command::Quick(_) | Command::Run(_) | Command::Exec(_)
            );
            return error::report(&if launch {
                e.exit_with(sandbox::REFUSED)
            } else {
                e
            });
        }
    };
    let server = matches!(cli.command, Command::Mount(_));
    if !server {
        crate::sys::stdio::default_sigpipe();
    }
    // A command reports every failure as its one-line error; its log (the store's diagnostics,
    // which would repeat that error) appears only when AGENTFS_LOG asks for another filter.
    if server || knobs.log != crate::knobs::Knobs::defaults().log {
        init_logging(&knobs.log);
    }
    let result = match cli.command {
        Command::Quick(a) => sandbox::quick(a, knobs),
        Command::Run(a) => sandbox::run(a, knobs),
        Command::Exec(a) => sandbox::exec(a, knobs),
        Command::Init(a) => init::run(a, knobs),
        Command::Diff(a) => diff::run(a, knobs),
        Command::Apply(a) => apply::run(a, knobs),
        Command::Discard(a) => discard::run(a, knobs),
        Command::Recover(a) => recover::run(a, knobs),
        Command::Convert(a) => convert::run(a, knobs),
        Command::Mount(a) => mount::run(a, knobs),
        Command::Umount(a) => umount::run(a),
        Command::Fs(a) => fs::run(a),
        Command::Status(a) => status::run(a, knobs),
        Command::Integrity(a) => integrity::run(a),
        Command::Fsck(a) => fsck::run(a),
        Command::Migrate(a) => migrate::run(a),
        Command::Backup(a) => backup::run(a),
        Command::Materialize(a) => materialize::run(a),
        Command::Kv(a) => kv::run(a),
        Command::Tools(a) => tools::run(a),
        Command::Replicate(a) => replica::run(a, knobs),
        Command::RestoreReplica(a) => replica::restore(a, knobs),
        Command::Snap(a) => history::snap(a),
        Command::List(a) => history::list(a),
        Command::Log(a) => history::log(a),
        Command::Restore(a) => history::restore(a),
        Command::Undo(a) => history::undo(a),
        Command::Gc(a) => history::gc(a),
        Command::Checkpoint(a) => history::checkpoint(a),
        Command::Completions(a) => manual::completions(a, Cli::command()),
        Command::Man(a) => manual::man(a, Cli::command()),
        Command::InstallMountHelper(a) => mount_helper::install(a),
        Command::Knobs => {
            print!("{}", crate::knobs::LEDGER_MARKDOWN);
            Ok(0)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => error::report(&e),
    }
}

/// Whether `--json` was given, to the top level or to the subcommand (which may have its own).
fn json_asked(m: &clap::ArgMatches) -> bool {
    let mut level = Some(m);
    while let Some(m) = level {
        if let Ok(Some(true)) = m.try_get_one::<bool>("json") {
            return true;
        }
        level = m.subcommand().map(|(_, sub)| sub);
    }
    false
}

/// A command line clap refused: its own text (help and version exit 0), or with `--json`
/// before any `--`, one `usage` error object; exit 2.
fn usage_error(e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    let json = std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    if !json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit()
    }
    error::set_json(true);
    let text = e.kind().as_str().map_or_else(
        || e.to_string().lines().next().unwrap_or("").to_string(),
        |k| k.to_string(),
    );
    let message = e
        .to_string()
        .lines()
        .next()
        .map_or(text, |l| l.trim_start_matches("error: ").to_string());
    error::report(&CliError::new(Code::Usage, message))
}

/// Log to standard error, coloured only when it is a terminal (a log file stays plain text).
fn init_logging(filter: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// One line on standard output; a reader that went away is not an error worth a panic.
pub(crate) fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}
