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
        Command::Read(args) => return read(&args),
        Command::Stats(args) => return stats(&args),
        Command::Analyze(args) => return analyze(args),
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

fn read(args: &coorfs::cli::ReadArgs) -> ExitCode {
    if !args.json {
        println!(
            "{:>5} {:>8} {:>12} {:>6} {:>9} {:>10} {:>9}",
            "epoch", "files", "bytes", "errors", "seconds", "files/s", "MiB/s"
        );
    }
    let result = coorfs::reader::run(&args.plan(), |r| {
        if args.json {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        } else {
            println!(
                "{:>5} {:>8} {:>12} {:>6} {:>9.3} {:>10.0} {:>9.1}",
                r.epoch, r.files, r.bytes, r.errors, r.seconds, r.files_per_sec, r.mib_per_sec
            );
        }
    });
    match result {
        Ok(reports) if reports.iter().any(|r| r.errors > 0) => {
            eprintln!("coorfs: some files could not be read");
            ExitCode::from(1)
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coorfs: {e}");
            ExitCode::from(2)
        }
    }
}

fn stats(args: &coorfs::cli::StatsArgs) -> ExitCode {
    use std::io::{IsTerminal, Write};
    loop {
        let doc = match coorfs::statsview::fetch(&args.mountpoint) {
            Ok(doc) => doc,
            Err(e) => {
                eprintln!("coorfs: {e}");
                return ExitCode::from(2);
            }
        };
        let text = if args.json {
            format!("{doc}\n")
        } else {
            coorfs::statsview::render(&doc)
        };
        let mut out = std::io::stdout().lock();
        if args.watch.is_some() && out.is_terminal() {
            // Clear the screen and go home, like watch(1).
            let _ = write!(out, "\x1b[2J\x1b[H");
        }
        if write!(out, "{text}").and_then(|_| out.flush()).is_err() {
            return ExitCode::SUCCESS;
        }
        match args.watch {
            Some(secs) => std::thread::sleep(std::time::Duration::from_secs_f64(secs)),
            None => return ExitCode::SUCCESS,
        }
    }
}

fn analyze(args: coorfs::cli::AnalyzeArgs) -> ExitCode {
    match coorfs::analyze::run(&args.into_config(), &mut std::io::stdout().lock()) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coorfs: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
