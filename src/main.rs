//! The `coorfs` command: parses the command line and reports failures as one line, with the
//! exit status of [`CommandError::exit_code`].

use std::process::ExitCode;

use clap::Parser;
use coorfs::cli::{Cli, Command, CommandError};
use coorfs::daemon;
use coorfs::helper::Helper;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // As a mount helper (`mount -t fuse.coorfs`, fstab), the command line is mount(8)'s.
    let parsed = match coorfs::helper::parse(&argv) {
        None => Cli::try_parse_from(&argv),
        Some(Ok(Helper::Mount(args))) => Cli::try_parse_from(args),
        Some(Ok(Helper::Fake)) => return ExitCode::SUCCESS,
        Some(Err(e)) => {
            eprintln!("coorfs: {e}");
            return ExitCode::from(CommandError::BAD_INPUT);
        }
    };
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => return clap_failure(e),
    };
    let result = match cli.command {
        Command::Mount(args) => match args.into_config() {
            Ok((config, options)) => daemon::mount(config, options).map_err(CommandError::from),
            Err(e) => Err(CommandError::from(e)),
        },
        Command::Umount(args) => {
            daemon::unmount(&args.mountpoint, args.lazy, args.timeout).map_err(CommandError::from)
        }
        Command::Restart(args) => match daemon::restart(&args.mountpoint) {
            Ok(pid) => {
                println!(
                    "{}: served by a new daemon (pid {pid})",
                    args.mountpoint.display()
                );
                Ok(())
            }
            Err(e) => Err(CommandError::from(e)),
        },
        Command::Completions(args) => {
            let mut cli = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(args.shell, &mut cli, "coorfs", &mut std::io::stdout());
            Ok(())
        }
        Command::Read(args) => read(&args),
        Command::Stats(args) => stats(&args),
        Command::Hint(args) => hint(&args),
        Command::Manifest(args) => manifest(&args),
        Command::Analyze(args) => analyze(args),
        // CMD's own exit status, passed through.
        Command::Run(args) => match coorfs::run::run(&args.into_config()) {
            Ok(status) => return ExitCode::from(status),
            Err(e) => Err(CommandError::from(e)),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failure(&e),
    }
}

/// Prints the one line of `e` and gives its exit status.
fn failure(e: &CommandError) -> ExitCode {
    eprintln!("coorfs: {e}");
    ExitCode::from(e.exit_code())
}

/// Help and version go to stdout as clap prints them; a usage error becomes one line.
fn clap_failure(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        // `coorfs` alone: the help, and the status of a usage error.
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::from(CommandError::BAD_INPUT)
        }
        _ => {
            let text = e.render().to_string();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let first = lines.next().unwrap_or("invalid command line");
            let mut first = first.strip_prefix("error: ").unwrap_or(first).to_string();
            // "the following required arguments were not provided:" names them on the next line.
            if first.ends_with(':') {
                first = format!("{first} {}", lines.next().unwrap_or_default());
            }
            failure(&CommandError::Usage(first))
        }
    }
}

fn read(args: &coorfs::cli::ReadArgs) -> Result<(), CommandError> {
    if !args.json {
        println!(
            "{:>5} {:>8} {:>12} {:>6} {:>9} {:>10} {:>9}",
            "epoch", "files", "bytes", "errors", "seconds", "files/s", "MiB/s"
        );
    }
    let reports = coorfs::reader::run(&args.plan(), |r| {
        if args.json {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        } else {
            println!(
                "{:>5} {:>8} {:>12} {:>6} {:>9.3} {:>10.0} {:>9.1}",
                r.epoch, r.files, r.bytes, r.errors, r.seconds, r.files_per_sec, r.mib_per_sec
            );
        }
    })?;
    if reports.iter().any(|r| r.errors > 0) {
        return Err(CommandError::FilesUnreadable);
    }
    Ok(())
}

/// `coorfs hint`: the order from a file or standard input, handed to the mount.
fn hint(args: &coorfs::cli::HintArgs) -> Result<(), CommandError> {
    use std::io::Read;
    let mount = std::path::absolute(&args.mountpoint).unwrap_or_else(|_| args.mountpoint.clone());
    if !coorfs::mountinfo::is_coorfs_mount(&mount) {
        return Err(coorfs::stats::view::StatsError::NotMounted(mount).into());
    }
    let mut text = Vec::new();
    let (name, read) = match args.file.as_deref() {
        Some(path) if path != std::path::Path::new("-") => {
            (path.to_path_buf(), std::fs::read(path).map(|t| text = t))
        }
        _ => (
            "standard input".into(),
            std::io::stdin().read_to_end(&mut text).map(drop),
        ),
    };
    read.map_err(|e| CommandError::HintInput(name, e))?;
    // One path a line; write_hint makes absolute ones below the mount point relative to it.
    use std::os::unix::ffi::OsStrExt;
    let order: Vec<std::path::PathBuf> = text
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| std::ffi::OsStr::from_bytes(line).into())
        .collect();
    coorfs::reader::write_hint(&args.mountpoint, &order).map_err(|e| {
        CommandError::Read(coorfs::reader::ReadError::Hint(args.mountpoint.clone(), e))
    })
}

fn stats(args: &coorfs::cli::StatsArgs) -> Result<(), CommandError> {
    use std::io::{IsTerminal, Write};
    loop {
        let doc = coorfs::stats::view::fetch(&args.mountpoint)?;
        let text = if args.json {
            format!("{doc}\n")
        } else {
            coorfs::stats::view::render(&doc)
        };
        let mut out = std::io::stdout().lock();
        if args.watch.is_some() && out.is_terminal() {
            // Clear the screen and go home, like watch(1).
            let _ = write!(out, "\x1b[2J\x1b[H");
        }
        if write!(out, "{text}").and_then(|_| out.flush()).is_err() {
            // The reader went away (a pipe into `head`): nothing left to show.
            return Ok(());
        }
        match args.watch {
            Some(secs) => std::thread::sleep(std::time::Duration::from_secs_f64(secs)),
            None => return Ok(()),
        }
    }
}

fn analyze(args: coorfs::cli::AnalyzeArgs) -> Result<(), CommandError> {
    coorfs::analyze::run(&args.into_config(), &mut std::io::stdout().lock())?;
    Ok(())
}

/// `coorfs manifest URL`: the prefix's manifest on standard output, its count on stderr.
fn manifest(args: &coorfs::cli::ManifestArgs) -> Result<(), CommandError> {
    use coorfs::daemon::MountError;
    use coorfs::source::object::{ObjectUrl, manifest};
    let url = ObjectUrl::parse(&args.url).map_err(MountError::BadUrl)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let n = manifest::list_and_write(&url, &mut out)
        .and_then(|n| std::io::Write::flush(&mut out).map(|()| n))
        .map_err(|e| MountError::SourceUnreadable(args.url.clone(), e))?;
    eprintln!("{}: {n} objects", args.url.display());
    Ok(())
}
