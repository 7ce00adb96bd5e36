//! `man/coorfs.1` and `docs/OPTIONS.md`, generated from the clap definitions, so that
//! `--help`, the man page and the option reference cannot disagree. `tests/it/manpage.rs` fails
//! when either committed file is stale (`UPDATE_MAN=1 cargo test --test it manpage::` rewrites
//! both).
//!
//! clap_mangen renders one page per command; coorfs wants one page with a section per
//! subcommand and its options grouped by help heading, plus the extra sections below, so
//! this walks clap's own introspection and writes the roff (and the Markdown) directly.

use clap::{Arg, ArgAction, Command, CommandFactory};

use crate::cli::Cli;

/// Escapes text for roff: backslashes, hyphens, and a leading dot or quote.
fn esc(text: &str) -> String {
    let mut out = text.replace('\\', "\\e").replace('-', "\\-");
    if out.starts_with('.') || out.starts_with('\'') {
        out.insert_str(0, "\\&");
    }
    out
}

/// Paragraphs of help text as roff (blank lines separate paragraphs; other line breaks in
/// the text are kept as line breaks).
fn paragraphs(text: &str) -> String {
    let mut out = String::new();
    for (i, para) in text.split("\n\n").enumerate() {
        if i > 0 {
            out.push_str(".PP\n");
        }
        let lines: Vec<&str> = para.lines().collect();
        for (j, line) in lines.iter().enumerate() {
            out.push_str(&esc(line.trim_start()));
            out.push('\n');
            if j + 1 < lines.len() {
                out.push_str(".br\n");
            }
        }
    }
    out
}

fn usage_of(cmd: &Command, parents: &str) -> String {
    if let Some(usage) = cmd.get_overridden_usage() {
        return usage.to_string();
    }
    let mut usage = format!("{parents} {}", cmd.get_name());
    let has_options = cmd
        .get_arguments()
        .any(|a| !a.is_positional() && !a.is_hide_set());
    if has_options {
        usage.push_str(" [OPTIONS]");
    }
    for arg in cmd.get_positionals() {
        let name = positional_name(arg);
        if arg.is_required_set() {
            usage.push_str(&format!(" {name}"));
        } else {
            usage.push_str(&format!(" [{name}]"));
        }
    }
    usage.trim().to_string()
}

fn option_line(arg: &Arg) -> String {
    let mut names = Vec::new();
    if let Some(s) = arg.get_short() {
        names.push(format!("\\fB\\-{s}\\fR"));
    }
    if let Some(l) = arg.get_long() {
        names.push(format!("\\fB\\-\\-{}\\fR", esc(l)));
    }
    let mut line = names.join(", ");
    if let Some(value) = option_value(arg) {
        line.push_str(&format!(" \\fI{}\\fR", esc(&value)));
    }
    line
}

/// An argument's help as `--help` prints it, unescaped and on one line: the long help (or
/// the short), then its default, environment variable and possible values.
fn help_text(arg: &Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let mut text = help.replace('\n', " ");
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && matches!(arg.get_action(), ArgAction::Set | ArgAction::Append) {
        text.push_str(&format!(" [default: {}]", defaults.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        text.push_str(&format!(" [env: {}]", env.to_string_lossy()));
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    if !possible.is_empty() && matches!(arg.get_action(), ArgAction::Set | ArgAction::Append) {
        text.push_str(&format!(" [possible values: {}]", possible.join(", ")));
    }
    text
}

fn option_help(arg: &Arg) -> String {
    esc(&help_text(arg))
}

/// The name a positional argument is shown by (its value name, else its id in capitals).
fn positional_name(arg: &Arg) -> String {
    arg.get_value_names()
        .and_then(|v| v.first().map(|s| s.to_string()))
        .unwrap_or_else(|| arg.get_id().to_string().to_uppercase())
}

/// The value an option takes, if it takes one (its value name, else `VALUE`).
fn option_value(arg: &Arg) -> Option<String> {
    let takes_value = matches!(arg.get_action(), ArgAction::Set | ArgAction::Append);
    takes_value.then(|| {
        arg.get_value_names()
            .and_then(|v| v.first().map(|s| s.to_string()))
            .unwrap_or_else(|| "VALUE".into())
    })
}

/// A command's visible options, grouped by help heading in order of first appearance.
fn option_groups(cmd: &Command) -> Vec<(Option<&str>, Vec<&Arg>)> {
    let mut groups: Vec<(Option<&str>, Vec<&Arg>)> = Vec::new();
    for arg in cmd
        .get_arguments()
        .filter(|a| !a.is_positional() && !a.is_hide_set())
    {
        let heading = arg.get_help_heading();
        match groups.iter_mut().find(|(h, _)| *h == heading) {
            Some((_, args)) => args.push(arg),
            None => groups.push((heading, vec![arg])),
        }
    }
    groups
}

fn command_section(cmd: &Command, out: &mut String) {
    out.push_str(&format!(".SS \"{}\"\n", esc(&usage_of(cmd, "coorfs"))));
    let about = cmd
        .get_long_about()
        .or(cmd.get_about())
        .map(|a| a.to_string())
        .unwrap_or_default();
    out.push_str(&paragraphs(&about));
    let aliases: Vec<&str> = cmd.get_visible_aliases().collect();
    if !aliases.is_empty() {
        out.push_str(&format!(".PP\nAlias: {}.\n", esc(&aliases.join(", "))));
    }
    // Arguments first, then options grouped by heading, in order of first appearance.
    let positionals: Vec<&Arg> = cmd.get_positionals().collect();
    if !positionals.is_empty() {
        out.push_str(".PP\n\\fIArguments\\fR\n");
        for arg in positionals {
            out.push_str(&format!(
                ".TP\n\\fI{}\\fR\n{}\n",
                esc(&positional_name(arg)),
                option_help(arg)
            ));
        }
    }
    for (heading, options) in option_groups(cmd) {
        out.push_str(&format!(
            ".PP\n\\fI{} options\\fR\n",
            esc(heading.unwrap_or("Other"))
        ));
        for arg in options {
            out.push_str(&format!(
                ".TP\n{}\n{}\n",
                option_line(arg),
                option_help(arg)
            ));
        }
    }
    if let Some(after) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        out.push_str(".PP\n");
        out.push_str(&paragraphs(&after.to_string()));
    }
}

/// Sections that are not part of any command's help: the statistics attributes, exit
/// status, files and the rest.
fn extra_sections(out: &mut String) {
    out.push_str(".SH EXTENDED ATTRIBUTES\n");
    out.push_str(&paragraphs(
        "A mount's statistics are extended attributes of its root directory: \
'getfattr -d -m - MOUNTPOINT' lists them all, 'getfattr -n NAME --only-values MOUNTPOINT' reads \
one. Each numeric statistic is its own attribute (a decimal number; ratios have four decimals). \
A size-0 probe returns the value's length, a buffer too small gets ERANGE, an unknown name \
ENODATA. They are read-only.",
    ));
    out.push_str(&format!(
        ".TP\n\\fB{}\\fR\nEvery statistic below, the dataset's epochs (\\fBepochs\\fR) and every job with its epochs (\\fBjobs\\fR), as one JSON document; what \\fBcoorfs stats \\-\\-json\\fR prints. In a cluster it also names this member (\\fBcluster\\fR) and every member with its share of the dataset (\\fBmembers\\fR), and each epoch counts the blocks from peers and the reads a peer failed (\\fBpeer_hits\\fR, \\fBbytes_from_peers\\fR, \\fBpeer_fallbacks\\fR). The kernel caps an attribute value at 64 KiB: when the histories do not fit, only the most recent epochs are kept, and \\fBepochs_omitted\\fR counts the records left out.\n",
        esc(crate::stats::STATS_XATTR)
    ));
    for stat in crate::stats::Stat::ALL {
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            esc(&crate::stats::xattr_name(*stat)),
            esc(stat.help())
        ));
    }
    out.push_str(&format!(
        ".PP\nOn every regular file:\n.TP\n\\fB{}\\fR\nHow many bytes of the file are in the cache (equal to its size when it is wholly cached).\n",
        esc(crate::stats::CACHED_XATTR)
    ));
    out.push_str(
        ".SH MOUNT HELPER\n\
         With a link \\fB/sbin/mount.fuse.coorfs\\fR to coorfs (or through \\fBmount.fuse3\\fR, \
         which runs \\fBcoorfs SOURCE MOUNTPOINT \\-o OPTIONS\\fR), \\fBmount \\-t fuse.coorfs \
         SOURCE MOUNTPOINT \\-o OPTIONS\\fR and \\fB/etc/fstab\\fR lines of type \
         \\fBfuse.coorfs\\fR mount coorfs. Each option \\fIname\\fR=\\fIvalue\\fR or \
         \\fIname\\fR is the mount option \\fB\\-\\-\\fR\\fIname\\fR, with underscores for \
         dashes (cache_size=8G is \\fB\\-\\-cache\\-size 8G\\fR); a value with commas is \
         written in double quotes. The generic options of mount(8), fstab and systemd (defaults, \
         ro, rw, auto, noauto, nofail, _netdev, user, nosuid, nodev, noexec, noatime, x\\-*, \
         comment=, ...) are passed over; any other option is refused with one line and status 2. \
         \\fB\\-f\\fR checks the options and mounts nothing. \\fBumount MOUNTPOINT\\fR unmounts.\n",
    );
    out.push_str(
        ".SH EXIT STATUS\n\
         0 on success; 2 for bad input (an unknown option, a malformed value, a missing or \
         unsuitable source, mount point or dataset, a path that is not a coorfs mount), with one \
         line on standard error that says what is wrong; 1 when the system fails (the mount or \
         unmount itself, a daemon that does not exit, files that \\fBcoorfs read\\fR could not \
         read, output that \\fBcoorfs analyze\\fR could not write), also with one line. \
         \\fBcoorfs run\\fR exits with the status of CMD (128 + N when signal N ended it), 127 when \
         CMD is not found and 126 when it cannot be run, as a shell does.\n",
    );
    out.push_str(
        ".SH ENVIRONMENT\n\
         .TP\n\\fBRUST_LOG\\fR\n\
         The log filter when \\fB\\-\\-log\\-level\\fR is not given.\n\
         .TP\n\\fBCOORFS_NODE_RANK\\fR\n\
         \\fB\\-\\-node\\-rank\\fR when it is not given.\n\
         .TP\n\\fBGROUP_RANK\\fR, \\fBNODE_RANK\\fR\n\
         The node rank that torchrun and launch scripts set: \\fB\\-\\-node\\-rank\\fR when \
         neither it nor \\fBCOORFS_NODE_RANK\\fR is given, GROUP_RANK first.\n\
         .TP\n\\fBPYTHONPATH\\fR, \\fBCOORFS_RUN_DIR\\fR, \\fBCOORFS_MOUNT\\fR\n\
         Set by \\fBcoorfs run\\fR for CMD: its hook's directory first on the Python path, the \
         same directory for the hook's own use, and \\fB\\-\\-mount\\fR.\n\
         .TP\n\\fBAWS_ENDPOINT_URL\\fR, \\fBAWS_REGION\\fR, \\fBAWS_ACCESS_KEY_ID\\fR, \
         \\fBAWS_SECRET_ACCESS_KEY\\fR, \\fBAWS_SESSION_TOKEN\\fR, \\fBAWS_ALLOW_HTTP\\fR\n\
         For an s3:// SOURCE: the store's endpoint (an http:// one is plain HTTP), region and \
         keys. Without keys, the profile's, else the instance's role (instance metadata).\n\
         .TP\n\\fBAWS_PROFILE\\fR, \\fBAWS_SHARED_CREDENTIALS_FILE\\fR, \\fBAWS_CONFIG_FILE\\fR\n\
         For an s3:// SOURCE: the profile (default: default) of ~/.aws/credentials and \
         ~/.aws/config whose keys, aws_session_token, region and endpoint_url fill in what the \
         variables above leave out. mount(8) passes its helper no environment: an fstab mount \
         reads root's ~/.aws, profile default.\n\
         .TP\n\\fBCOORFS_S3_TIMEOUT\\fR\n\
         For an s3:// SOURCE: how long one request may take (a duration: 500ms, 10s; default \
         30s) before it is abandoned and retried.\n\
         .TP\n\\fBCOORFS_S3_DIRECT\\fR\n\
         For an s3:// SOURCE at an http:// endpoint: 1 (the default) reads each GET's body from \
         the socket straight into the cache's blocks, over kept\\-alive connections, its \
         request presigned; an answer other than the range asked, and a connection that \
         breaks, leave the rest to the object store client, which retries as above. 0 sends \
         every GET through that client. Not used with a proxy (HTTP_PROXY, ALL_PROXY), an \
         SSE\\-C key or unsigned requests (AWS_SKIP_SIGNATURE).\n\
         .TP\n\\fBCOORFS_TOLD_BY\\fR\n\
         How the kernel tells the daemon of the opens it makes itself (\\fB\\-\\-opens\\fR): \
         ebpf, a program on the open system calls (the default where the kernel loads it and \
         coorfs was built with clang; only the ring buffer's 1 MiB and a few instructions an \
         open on the machine), or fanotify (a mark on every directory of the mount; the fallback). \
         opens_why in the stats says which is in use.\n",
    );
    out.push_str(
        ".SH NOTES\n\
         The mount is read\\-only: every operation that would change the dataset fails with EROFS, \
         and coorfs never writes to the source. The kernel checks the source's permission bits \
         (\\fBdefault_permissions\\fR). A source file that changes while mounted (its inode, \
         size, modification or change time) is detected when it is next opened and served with \
         its new content; an object of an s3:// source, once \\fB\\-\\-metadata\\-ttl\\fR has \
         passed since it was listed, and a read of an object replaced since its open fails with \
         ESTALE.\n\
         .PP\n\
         Memory: the cache never holds more than \\fB\\-\\-cache\\-size\\fR bytes of file data. \
         Beyond it the daemon needs the staging area (\\fB\\-\\-prefetch\\-memory\\fR, with \
         prefetch on), about 110 bytes plus the name for every entry of the dataset (its node \
         table; for an s3:// source, also about 250 bytes, twice the path and the ETag an object \
         for its listing), the blocks being fetched (at most (\\fB\\-\\-prefetch\\-depth\\fR + 2 x \
         \\fB\\-\\-threads\\fR) x \\fB\\-\\-block\\-size\\fR), up to 16 MiB of blocks read \
         moments ago, and order hints (at most \\fB\\-\\-hint\\-memory\\fR). The kernel may also \
         keep page\\-cache copies of wholly cached files; it reclaims them under memory pressure, \
         and the cache still holds those bytes.\n",
    );
    out.push_str(
        ".SH SEE ALSO\n\
         \\fBfusermount3\\fR(1), \\fBumount\\fR(8), \\fBgetfattr\\fR(1)\n",
    );
}

/// The whole man page.
pub fn render() -> String {
    let cli = Cli::command();
    let version = cli.get_version().unwrap_or("").to_string();
    let mut out = String::new();
    out.push_str(&format!(
        ".TH COORFS 1 \"\" \"coorfs {}\" \"User Commands\"\n",
        esc(&version)
    ));
    out.push_str(&format!(
        ".SH NAME\ncoorfs \\- {}\n",
        esc(&cli.get_about().map(|a| a.to_string()).unwrap_or_default())
    ));
    out.push_str(".SH SYNOPSIS\n");
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        out.push_str(&format!("\\fB{}\\fR\n.br\n", esc(&usage_of(sub, "coorfs"))));
    }
    out.push_str(".SH DESCRIPTION\n");
    out.push_str(&paragraphs(
        &cli.get_long_about()
            .map(|a| a.to_string())
            .unwrap_or_default(),
    ));
    out.push_str(".SH COMMANDS\n");
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_section(sub, &mut out);
    }
    extra_sections(&mut out);
    out
}

/// Text for a cell of a Markdown table: pipes escaped, and angle brackets as entities so that
/// nothing reads as HTML.
fn md_cell(text: &str) -> String {
    text.replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A sentence from a command's one-line about (clap drops the doc comment's final period).
fn sentence(text: &str) -> String {
    let text = text.trim();
    if text.ends_with(['.', '?', '!']) {
        text.to_string()
    } else {
        format!("{text}.")
    }
}

/// `docs/OPTIONS.md`: every argument and option of every command with its value name and the
/// help text of `--help`, options grouped by their help heading as `--help` and the man page
/// group them.
pub fn options_markdown() -> String {
    let cli = Cli::command();
    let commands: Vec<&Command> = cli.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    let mut out = String::new();
    out.push_str("# coorfs options\n\n");
    out.push_str(
        "Every argument and option of every command, with the text `coorfs COMMAND --help` \
prints for it. This file is generated from the command line's definitions (`src/cli.rs`) by \
`src/manpage.rs`, as `man/coorfs.1` is, so do not edit it by hand: `UPDATE_MAN=1 cargo test --test it \
manpage::` rewrites it, and that test fails when it is stale. How the commands are used, \
with examples: [USAGE.md](USAGE.md); the options most mounts need: the \
[README](../README.md#usage).\n\n",
    );
    for cmd in &commands {
        out.push_str(&format!(
            "- [`coorfs {name}`](#coorfs-{name}): {about}\n",
            name = cmd.get_name(),
            about = sentence(&cmd.get_about().map(|a| a.to_string()).unwrap_or_default()),
        ));
    }
    for cmd in &commands {
        out.push_str(&format!("\n## coorfs {}\n\n", cmd.get_name()));
        out.push_str(&format!("```text\n{}\n```\n\n", usage_of(cmd, "coorfs")));
        out.push_str(&md_cell(&sentence(
            &cmd.get_about().map(|a| a.to_string()).unwrap_or_default(),
        )));
        let aliases: Vec<String> = cmd
            .get_visible_aliases()
            .map(|a| format!("`coorfs {a}`"))
            .collect();
        if !aliases.is_empty() {
            out.push_str(&format!(" Alias: {}.", aliases.join(", ")));
        }
        out.push('\n');
        let positionals: Vec<&Arg> = cmd.get_positionals().collect();
        if !positionals.is_empty() {
            out.push_str("\n| argument | meaning |\n|---|---|\n");
            for arg in positionals {
                out.push_str(&format!(
                    "| `{}` | {} |\n",
                    positional_name(arg),
                    md_cell(&help_text(arg))
                ));
            }
        }
        let groups = option_groups(cmd);
        let alone = groups.len() == 1;
        for (heading, options) in groups {
            let title = match heading {
                Some(heading) => format!("{heading} options"),
                None if alone => "Options".to_string(),
                None => "Other options".to_string(),
            };
            out.push_str(&format!(
                "\n**{title}**\n\n| option | meaning |\n|---|---|\n"
            ));
            for arg in options {
                let mut names = Vec::new();
                if let Some(s) = arg.get_short() {
                    names.push(format!("`-{s}`"));
                }
                if let Some(l) = arg.get_long() {
                    match option_value(arg) {
                        Some(value) => names.push(format!("`--{l} {}`", md_cell(&value))),
                        None => names.push(format!("`--{l}`")),
                    }
                }
                out.push_str(&format!(
                    "| {} | {} |\n",
                    names.join(", "),
                    md_cell(&help_text(arg))
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_roff_specials() {
        assert_eq!(esc("--x"), "\\-\\-x");
        assert_eq!(esc(".start"), "\\&.start");
        assert_eq!(esc("a\\b"), "a\\eb");
    }
}
