//! `agentfs convert NAME --to fuse|overlayfs [--json]`: switch the backend a project keeps
//! (docs/sandbox.md, Mount backends). Between runs the delta holds everything either backend
//! serves, so a conversion moves one thing: the upper directory an overlayfs run left
//! unimported, imported into the delta first as `agentfs recover` imports it. Then config.toml
//! records the new backend. Refused while the project's sandbox runs or a server holds its
//! delta, and, towards overlayfs, while the project's settings ask for what only the FUSE
//! server enforces.

use serde_json::json;

use super::{CliError, Code};
use crate::knobs::Knobs;
use crate::project::config::{Backend, SymlinkName};
use crate::sandbox::request::MountBackend;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The project.
    pub name: String,
    /// The backend the project keeps from now on.
    #[arg(long, value_enum)]
    pub to: Backend,
    /// Print what was done as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn name(b: Backend) -> &'static str {
    MountBackend::from(b).as_str()
}

pub fn run(a: Args, knobs: &Knobs) -> super::CliResult {
    let p = super::history::project(&a.name)?;
    let from = p.config.project.backend;
    let report = |converted: bool, imported: Option<crate::sandbox::Imported>| {
        json!({
            "project": p.name,
            "from": from.map(name),
            "to": name(a.to),
            "converted": converted,
            "imported": imported,
        })
    };
    if from == Some(a.to) {
        if a.json {
            super::say(format_args!("{}", report(false, None)));
        } else {
            super::say(format_args!(
                "project {} already keeps the {} backend; nothing to do",
                p.name,
                name(a.to)
            ));
        }
        return Ok(0);
    }
    if a.to == Backend::Overlayfs {
        let root = crate::project::root(knobs)?;
        let mut settings = crate::project::defaults(&root)?;
        settings.merge(p.config.settings());
        if settings.policy.symlinks == Some(SymlinkName::RefuseEscaping) {
            return Err(CliError::new(
                Code::PolicyUnenforceable,
                format!(
                    "project {} refuses escaping symlinks ([policy] symlinks = \"refuse-escaping\" \
                     in its config.toml or defaults.toml), which only the FUSE server enforces: \
                     set it to \"allow\" first; nothing was changed",
                    p.name
                ),
            )
            .at(p.dir.join(crate::project::CONFIG)));
        }
    }
    let db = p.db();
    let (lock, imported) = super::history::offline(&p.dir, &db, "converting it")?;
    let mut converted = p.clone();
    converted.config.project.backend = Some(a.to);
    converted.save()?;
    drop(lock);
    if a.json {
        super::say(format_args!("{}", report(true, imported)));
    } else {
        if let Some(i) = &imported {
            super::say(format_args!("{}", super::history::imported_line(i)));
        }
        super::say(format_args!(
            "converted project {} from {} to {}",
            p.name,
            from.map_or("no backend yet", name),
            name(a.to)
        ));
    }
    Ok(0)
}
