//! The scripts under `ci/` never report success for a check that did not
//! run: in CI (`CI=true`) a tool that cannot be installed fails the script
//! with the reason; outside CI the script may skip, and says so.
//!
//! Each case runs a script with a stand-in `rustup` first on `PATH` that
//! answers every call the way rustup does when it cannot download.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A directory holding a `rustup` that lists nothing installed and fails
/// every install with a download error.
fn offline_rustup() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spyre-ci-offline-rustup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rustup = dir.join("rustup");
    std::fs::write(
        &rustup,
        "#!/bin/sh\n\
         case \"$*\" in\n\
         *list*) exit 0 ;;\n\
         *) echo \"error: could not download file from 'https://static.rust-lang.org/dist/channel-rust-nightly.toml.sha256'\" >&2; exit 1 ;;\n\
         esac\n",
    )
    .unwrap();
    let status = Command::new("chmod")
        .arg("+x")
        .arg(&rustup)
        .status()
        .unwrap();
    assert!(status.success());
    dir
}

fn run(script: &str, ci: Option<&str>, fake: &Path) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let path = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .arg(root.join("ci").join(script))
        .current_dir(root)
        .env("PATH", path)
        .env("MIRI_TOOLCHAIN", "nightly-offline-test")
        .env("TSAN_TOOLCHAIN", "nightly-offline-test");
    match ci {
        Some(value) => command.env("CI", value),
        None => command.env_remove("CI"),
    };
    command.output().expect("bash runs")
}

#[test]
fn a_check_that_cannot_install_its_tool_fails_in_ci_and_skips_loudly_outside() {
    let fake = offline_rustup();
    for script in ["miri.sh", "tsan.sh"] {
        for ci in ["true", "1"] {
            let output = run(script, Some(ci), &fake);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(1),
                "{script} with CI={ci}: {stderr}"
            );
            assert!(stderr.contains("did not run"), "{script}: {stderr}");
            assert!(
                stderr.contains("could not download"),
                "the reason is shown: {stderr}"
            );
            assert!(!stderr.contains("SKIPPED"), "{script}: {stderr}");
        }
        for ci in [None, Some(""), Some("false")] {
            let output = run(script, ci, &fake);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(0),
                "{script} with CI={ci:?}: {stderr}"
            );
            assert!(
                stderr.contains("SKIPPED (outside CI only)"),
                "{script} with CI={ci:?}: {stderr}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&fake);
}
