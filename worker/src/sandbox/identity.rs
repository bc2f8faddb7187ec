//! Identity: the user namespaces and their id maps, one step on each side of each boundary.
//!
//! Two levels. The zygote unshares a user namespace of its own, whose maps the engine writes
//! ([`write_zygote_maps`], parent side; [`enter_user_namespace`], zygote side): the zygote's
//! root is an unprivileged host id, never host uid 0. Each sandbox is cloned into a user
//! namespace of its own, whose maps the zygote writes ([`write_sandbox_maps`]; the init waits
//! for them in [`await_sandbox_maps`]): its root is the zygote's root, so RLIMIT_NPROC counts
//! each sandbox's processes alone.

use std::os::fd::{AsFd, OwnedFd};

use nix::sched::CloneFlags;
use nix::unistd::{Gid, Pid, Uid};

use super::wire::{self, FromZygote, SetupError, ToInit, ToZygote};

/// Why the engine could not give the zygote its identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("writing the zygote's id maps ({path}): {source}")]
    IdMap {
        path: String,
        source: std::io::Error,
    },
    #[error("refusing to map host uid 0 into the sandbox")]
    HostRootMapped,
}

/// Engine side: writes the zygote's maps; returns how identity is enforced. Host uid 0 is
/// never mapped: as root, the sandbox's root is an unprivileged id; as an ordinary user, it is
/// that user.
pub(super) fn write_zygote_maps(pid: u32, root_mapped_id: u32) -> Result<String, IdentityError> {
    let write = |file: &str, content: &str| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, content).map_err(|source| IdentityError::IdMap { path, source })
    };
    if Uid::current().is_root() {
        if root_mapped_id == 0 {
            return Err(IdentityError::HostRootMapped);
        }
        write("uid_map", &format!("0 {root_mapped_id} 1"))?;
        write("gid_map", &format!("0 {root_mapped_id} 1"))?;
        Ok(format!(
            "host root: sandbox root is host uid/gid {root_mapped_id}"
        ))
    } else {
        let (uid, gid) = (
            Uid::current().as_raw(),
            nix::unistd::Gid::current().as_raw(),
        );
        // An unprivileged writer may only map its own ids, and only after denying setgroups.
        write("setgroups", "deny")?;
        write("uid_map", &format!("0 {uid} 1"))?;
        write("gid_map", &format!("0 {gid} 1"))?;
        Ok(format!("rootless: sandbox root is host uid {uid}"))
    }
}

/// Zygote side: unshares its user namespace, has the engine write the maps, and becomes the
/// namespace's root. Host root's supplementary groups are dropped first.
pub(super) fn enter_user_namespace(control: &OwnedFd) -> Result<(), SetupError> {
    let host_root = Uid::current().is_root();
    nix::sched::unshare(CloneFlags::CLONE_NEWUSER)
        .map_err(|e| SetupError::errno("unshare user namespace", e))?;
    wire::send(control.as_fd(), &FromZygote::NeedMaps, &[])
        .map_err(|e| SetupError::errno("zygote: ask for the id maps", e))?;
    match wire::recv::<ToZygote>(control.as_fd()) {
        Ok(Some(wire::Received {
            message: ToZygote::MapsWritten,
            ..
        })) => {}
        _ => {
            return Err(SetupError::new(
                "user namespace: the engine did not write the id maps",
            ))
        }
    }
    if host_root {
        // Host root's supplementary groups would still grant group access to host files.
        nix::unistd::setgroups(&[])
            .map_err(|e| SetupError::errno("drop supplementary groups", e))?;
    }
    // Become the namespace's root, which the engine mapped to an unprivileged host id.
    nix::unistd::setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0))
        .map_err(|e| SetupError::errno("setresgid 0", e))?;
    nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0))
        .map_err(|e| SetupError::errno("setresuid 0", e))?;
    // Changing credentials cleared the dumpable flag, which would make /proc/<pid> of our own
    // sandboxes owned by host root and their id maps unwritable for us.
    nix::sys::prctl::set_dumpable(true).map_err(|e| SetupError::errno("set dumpable", e))
}

/// Zygote side, for each sandbox it cloned (`pid`, reached over `sock`): writes its maps and
/// lets it go on. Its root is the zygote's root, itself an unprivileged host id; a user
/// namespace per sandbox makes RLIMIT_NPROC count its processes alone.
pub(super) fn write_sandbox_maps(pid: Pid, sock: &OwnedFd) -> Result<(), SetupError> {
    // setgroups before gid_map: the kernel takes `deny` only while no gid map is written.
    let maps = [
        ("setgroups", "deny"),
        ("uid_map", "0 0 1"),
        ("gid_map", "0 0 1"),
    ];
    for (file, content) in maps {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, content).map_err(|e| SetupError::io("write", &e).at(path))?;
    }
    wire::send(sock.as_fd(), &ToInit::MapsWritten, &[])
        .map_err(|e| SetupError::errno("signal sandbox", e))
}

/// Init side: waits until the zygote has written the maps.
pub(super) fn await_sandbox_maps(sock: &OwnedFd) -> Result<(), SetupError> {
    match wire::recv::<ToInit>(sock.as_fd()) {
        Ok(Some(wire::Received {
            message: ToInit::MapsWritten,
            ..
        })) => Ok(()),
        _ => Err(SetupError::text(
            "user namespace",
            "the zygote did not write the id maps",
        )),
    }
}
