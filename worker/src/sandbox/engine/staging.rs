//! The engine's staging directory on the host: the empty mount points the zygote mounts its
//! root template on and the sandboxes their disks, each in its own mount namespace.

use std::path::{Path, PathBuf};

/// A staging directory that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("staging directory {path}: {source}")]
pub struct StagingError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Name prefix of staging directories, followed by the owning process's tag
/// ([`forkbox_queue::owner`]).
const STAGING_PREFIX: &str = "forkbox-";

/// Makes this engine's staging directory, named after this process so that the next engine
/// removes it if this process is killed outright (its `Drop` never runs then). Those left by
/// processes that are gone are removed first: they hold only the empty mount points `root` and
/// `layers` (the mounts on them lived in namespaces that died with their zygote), so only empty
/// directories are ever removed.
pub(super) fn make_staging(parent: &Path) -> Result<PathBuf, StagingError> {
    use std::os::unix::fs::PermissionsExt;
    remove_stale_staging(parent);
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| StagingError { path, source }
    };
    let dir = tempfile::Builder::new()
        .prefix(&format!("{STAGING_PREFIX}{}-", forkbox_queue::owner::tag()))
        .tempdir_in(parent)
        .map_err(err(parent))?
        .keep();
    // Only mount points live here; the sandbox's unprivileged root must be able to reach them.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).map_err(err(&dir))?;
    for sub in ["root", "layers"] {
        std::fs::create_dir(dir.join(sub)).map_err(err(&dir))?;
    }
    Ok(dir)
}

fn remove_stale_staging(parent: &Path) {
    for dir in forkbox_queue::owner::abandoned(parent, STAGING_PREFIX) {
        for sub in ["root", "layers"] {
            let _ = std::fs::remove_dir(dir.join(sub));
        }
        let _ = std::fs::remove_dir(&dir);
    }
}
