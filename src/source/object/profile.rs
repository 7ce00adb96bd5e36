//! The AWS profile files, for what the environment does not set: the profile
//! `AWS_PROFILE` (else `default`) of the credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
//! else `~/.aws/credentials`, sections `[NAME]`) and of the config file (`AWS_CONFIG_FILE`,
//! else `~/.aws/config`, sections `[profile NAME]`, or `[default]`), as the AWS CLI reads
//! them; `~` is `HOME`, or the user's home directory where `HOME` is not set (mount(8),
//! systemd). The credentials file wins over the config file. Only static settings are read:
//! keys, a session token, the region and an endpoint (`endpoint_url`).

use std::path::PathBuf;

/// Where the profile files are, and which profile to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Files {
    pub credentials: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub profile: String,
}

impl Files {
    /// The files and profile the environment names (`HOME` for the defaults).
    pub fn from_env() -> Self {
        // mount(8) and systemd may start the daemon without HOME: then the user's own.
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .or_else(home_of_user);
        let file = |var: &str, name: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
        };
        Files {
            credentials: file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            config: file("AWS_CONFIG_FILE", "config"),
            profile: std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into()),
        }
    }
}

/// The home directory of the effective user, from the password database.
fn home_of_user() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: `pwd` and `buf` outlive the call, `buf.len()` is its size, and `found` points at
    // `pwd` (or is null) afterwards; `pw_dir` points into `buf`, read before `buf` is dropped.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::geteuid(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        );
        if rc != 0 || found.is_null() || pwd.pw_dir.is_null() {
            return None;
        }
        let dir = std::ffi::CStr::from_ptr(pwd.pw_dir);
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes())))
    }
}

/// The settings the profile gives, as `object_store` configuration keys (`aws_region`, ...)
/// with their values; credentials file first. Missing or unreadable files give nothing.
pub fn settings(files: &Files) -> Vec<(String, String)> {
    const KEYS: [(&str, &str); 5] = [
        ("aws_access_key_id", "aws_access_key_id"),
        ("aws_secret_access_key", "aws_secret_access_key"),
        ("aws_session_token", "aws_session_token"),
        ("region", "aws_region"),
        ("endpoint_url", "aws_endpoint"),
    ];
    let sections = [
        (files.credentials.as_ref(), files.profile.clone()),
        (files.config.as_ref(), config_section(&files.profile)),
    ];
    let mut out: Vec<(String, String)> = Vec::new();
    for (path, section) in sections {
        let Some(ini) = path.and_then(|p| ini::Ini::load_from_file(p).ok()) else {
            continue;
        };
        let Some(props) = ini.section(Some(section.as_str())) else {
            continue;
        };
        for (theirs, ours) in KEYS {
            if let Some(v) = props.get(theirs)
                && !out.iter().any(|(k, _)| k == ours)
            {
                out.push((ours.to_string(), v.trim().to_string()));
            }
        }
    }
    out
}

/// The config file's section for `profile`.
fn config_section(profile: &str) -> String {
    if profile == "default" {
        "default".into()
    } else {
        format!("profile {profile}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_profile_is_read_credentials_first() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = dir.path().join("credentials");
        let config = dir.path().join("config");
        std::fs::write(
            &credentials,
            "[default]\naws_access_key_id = AKDEFAULT\n\n[train]\naws_access_key_id = AKTRAIN\naws_secret_access_key = s3cret\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[default]\nregion = us-east-1\n[profile train]\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:9000\naws_access_key_id = AKCONFIG\n",
        )
        .unwrap();
        let files = |profile: &str| Files {
            credentials: Some(credentials.clone()),
            config: Some(config.clone()),
            profile: profile.into(),
        };
        let got = settings(&files("train"));
        let get = |k: &str| {
            got.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("aws_access_key_id"), Some("AKTRAIN"));
        assert_eq!(get("aws_secret_access_key"), Some("s3cret"));
        assert_eq!(get("aws_region"), Some("eu-west-1"));
        assert_eq!(get("aws_endpoint"), Some("http://127.0.0.1:9000"));
        let default = settings(&files("default"));
        assert!(default.contains(&("aws_region".into(), "us-east-1".into())));
        assert!(default.contains(&("aws_access_key_id".into(), "AKDEFAULT".into())));
        let missing = Files {
            credentials: Some(dir.path().join("nope")),
            config: None,
            profile: "default".into(),
        };
        assert!(settings(&missing).is_empty());
    }
}
