//! The documented load-generator runs write their reports where git ignores them: a run
//! copied from a README into the repository's root must not leave files to commit.

use std::path::Path;
use std::process::Command;

/// Every `--report DIR` in the documentation that has one.
fn documented_report_dirs(root: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for doc in ["README.md", "loadgen/README.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            while let Some(w) = words.next() {
                if w == "--report" {
                    if let Some(dir) = words.next() {
                        found.push((doc.to_owned(), dir.to_owned()));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn documented_reports_go_where_git_ignores_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dirs = documented_report_dirs(root);
    assert!(!dirs.is_empty(), "no --report in the READMEs");
    for (doc, dir) in dirs {
        if dir.starts_with('/') {
            continue;
        }
        let report = Path::new(&dir).join("report.md");
        let ignored = Command::new("git")
            .current_dir(root)
            .args(["check-ignore", "-q", "--no-index"])
            .arg(&report)
            .status()
            .expect("running git")
            .success();
        assert!(
            ignored,
            "{doc}: --report {dir} writes {report:?}, which git does not ignore"
        );
    }
    // A run started in the root with a bare `out/` is ignored too.
    let bare = Command::new("git")
        .current_dir(root)
        .args(["check-ignore", "-q", "--no-index", "out/report.md"])
        .status()
        .unwrap();
    assert!(bare.success(), "out/ is not ignored");
}
