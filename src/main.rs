//! The `coorfs` command: parses the command line and reports failures as one line.

use std::process::ExitCode;

use clap::Parser;
use coorfs::cli::{Cli, Command};
use coorfs::daemon;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_failure(e),
    };
    let result = match cli.command {
        Command::Mount(args) => {
            let (config, options) = args.into_config();
            daemon::mount(config, options)
        }
        Command::Umount(args) => daemon::unmount(&args.mountpoint, args.lazy, args.timeout),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coorfs: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

/// Help and version go to stdout as clap prints them; a usage error becomes one line.
fn clap_failure(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        _ => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid command line");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("coorfs: {first} (see coorfs --help)");
            ExitCode::from(2)
        }
    }
}
