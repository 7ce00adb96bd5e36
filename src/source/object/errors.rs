//! A store's error as the caller gets it: a [`SourceError`] with its errno, and the store's
//! words on one line for the log or the user.

use std::path::Path;

use crate::source::SourceError;

/// The errno for a store error: 404 ENOENT, 412 ESTALE (the object changed), 403 and 401
/// EACCES, anything else (retries exhausted, a bad answer) EIO.
pub(super) fn errno_of(e: &object_store::Error) -> i32 {
    match e {
        object_store::Error::NotFound { .. } => libc::ENOENT,
        object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
            libc::ESTALE
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => libc::EACCES,
        _ => libc::EIO,
    }
}

/// A store's error as the source's: a missing object, a changed one, or a refusal with the
/// store's words (`what` was asked: GET, HEAD) and its errno ([`errno_of`]).
pub(super) fn refusal(what: &str, e: &object_store::Error) -> SourceError {
    match errno_of(e) {
        libc::ENOENT => SourceError::NotFound,
        libc::ESTALE => SourceError::Changed,
        errno => SourceError::Refused {
            errno,
            why: format!("{what}: {}", one_line(e)),
        },
    }
}

/// A store error on one line: an S3 error document in it is cut to its code and message.
pub(super) fn one_line(e: &object_store::Error) -> String {
    let text = e.to_string();
    let tag = |name: &str| {
        let (open, close) = (format!("<{name}>"), format!("</{name}>"));
        let from = text.find(&open)? + open.len();
        let to = from + text[from..].find(&close)?;
        Some(text[from..to].to_string())
    };
    let text = match (
        text.find("<?xml").or_else(|| text.find("<Error>")),
        tag("Code"),
    ) {
        (Some(at), Some(code)) => {
            let message = tag("Message")
                .map(|m| format!(" ({m})"))
                .unwrap_or_default();
            format!("{}{code}{message}", &text[..at])
        }
        _ => text.clone(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What a failed listing says, on one line, with what to do where the store's message does
/// not say it.
pub(super) fn listing_error(name: &Path, e: &object_store::Error) -> String {
    if let object_store::Error::InvalidPath { source } = e
        && let Some(why) = unlistable_key(source)
    {
        return format!(
            "listing {}: {why}, which no path may hold: mount a prefix beside that key",
            name.display()
        );
    }
    let text = one_line(e);
    // The instance metadata service answered, or did not: no credentials were found.
    let scheme = name.to_string_lossy();
    let hint = if !text.contains("169.254.169.254") {
        ""
    } else if scheme.starts_with("gs://") {
        "; no credentials: set GOOGLE_APPLICATION_CREDENTIALS (a service account's key file), or run on a VM or pod with a service account"
    } else if scheme.starts_with("s3://") {
        "; no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (~/.aws/credentials)"
    } else {
        "; no credentials: set AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN (or AZURE_STORAGE_CONNECTION_STRING), or run with a managed identity"
    };
    format!("listing {}: {text}{hint}", name.display())
}

/// Why the store's client refused a key of a listing (`object_store` refuses the page that
/// holds it), in words: the key (escaped, so that the line stays one line) and what it holds
/// that no path may: a control character, named (a tab was blamed on an empty, `.` or `..`
/// component), an empty component, or a `.` or `..` one.
fn unlistable_key(e: &object_store::path::Error) -> Option<String> {
    use object_store::path::Error as P;
    let key = match e {
        P::EmptySegment { path } | P::BadSegment { path, .. } => path,
        _ => return None,
    };
    let why = if let Some(c) = key.chars().find(|c| c.is_control()) {
        let name = match c {
            '\t' => ", a tab",
            '\n' => ", a newline",
            '\r' => ", a carriage return",
            '\0' => ", a NUL",
            _ => "",
        };
        format!("holds a control character (U+{:04X}{name})", c as u32)
    } else if key.trim_matches('/').split('/').any(|c| c.is_empty()) {
        "has an empty component ('//')".to_string()
    } else {
        "has a '.' or '..' component".to_string()
    };
    Some(format!("the key {key:?} {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::path::Path as Key;

    #[test]
    fn a_listing_refused_for_a_key_says_what_the_key_holds() {
        let refused = |key: &str| {
            let e = object_store::Error::from(Key::parse(key).unwrap_err());
            listing_error(Path::new("s3://b/p"), &e)
        };
        let beside = ", which no path may hold: mount a prefix beside that key";
        assert_eq!(
            refused("p/a\tb"),
            format!(
                "listing s3://b/p: the key \"p/a\\tb\" holds a control character (U+0009, a tab){beside}"
            )
        );
        assert_eq!(
            refused("p/\u{1b}x"),
            format!(
                "listing s3://b/p: the key \"p/\\u{{1b}}x\" holds a control character (U+001B){beside}"
            )
        );
        assert_eq!(
            refused("p//x"),
            format!("listing s3://b/p: the key \"p//x\" has an empty component ('//'){beside}")
        );
        assert_eq!(
            refused("p/../x"),
            format!("listing s3://b/p: the key \"p/../x\" has a '.' or '..' component{beside}")
        );
    }

    #[test]
    fn store_errors_become_the_errno_the_caller_gets() {
        let e = |f: fn(String) -> object_store::Error| errno_of(&f("k".into()));
        assert_eq!(
            e(|path| object_store::Error::NotFound {
                path,
                source: "x".into()
            }),
            libc::ENOENT
        );
        assert_eq!(
            e(|path| object_store::Error::Precondition {
                path,
                source: "x".into()
            }),
            libc::ESTALE
        );
        assert_eq!(
            e(|path| object_store::Error::PermissionDenied {
                path,
                source: "x".into()
            }),
            libc::EACCES
        );
        assert_eq!(
            errno_of(&object_store::Error::Generic {
                store: "S3",
                source: "503".into()
            }),
            libc::EIO
        );
    }

    #[test]
    fn no_credentials_names_each_clouds_variables() {
        let e = || object_store::Error::Generic {
            store: "X",
            source: "GET http://169.254.169.254/latest/api/token: refused".into(),
        };
        let hint = |url: &str| listing_error(Path::new(url), &e());
        assert!(hint("s3://b/p").ends_with(
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (~/.aws/credentials)"
        ));
        assert!(hint("gs://b/p").contains("; no credentials: set GOOGLE_APPLICATION_CREDENTIALS"));
        assert!(hint("az://b/p").contains("; no credentials: set AZURE_STORAGE_KEY"));
        let other = object_store::Error::Generic {
            store: "X",
            source: "503".into(),
        };
        assert_eq!(
            listing_error(Path::new("gs://b/p"), &other),
            "listing gs://b/p: Generic X error: 503"
        );
    }
}
