//! The `coorfs` Python package (python/): its unit tests (standard library `unittest`, no torch,
//! no mount; `coorfs run`'s hook runs its jobs on the stand-in torch of python/tests/faketorch)
//! and its version. tests/it/hints.rs drives it against a real mount;
//! scripts/check-frameworks.sh runs the same unit tests with torch installed, where the
//! sampler's own tests run too.

use std::path::Path;
use std::process::Command;

const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python");

#[test]
fn the_python_package_passes_its_unit_tests() {
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-v"])
        .current_dir(PACKAGE)
        .env("PYTHONPATH", PACKAGE)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 is needed to run the tests of python/");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}");
    // Discovery that finds nothing also succeeds: count what ran.
    let ran: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(ran >= 15, "only {ran} tests ran:\n{report}");
}

/// The package speaks the daemon's order file and statistics: it carries the crate's version.
#[test]
fn the_python_package_has_the_crate_s_version() {
    let pyproject = std::fs::read_to_string(Path::new(PACKAGE).join("pyproject.toml")).unwrap();
    let version = pyproject
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"'));
    assert_eq!(version, Some(env!("CARGO_PKG_VERSION")));
}
