//! Identity: the user namespaces and their id maps, one step on each side of each boundary.
//!
//! Two levels. The zygote unshares a user namespace of its own, whose maps the engine writes
//! ([`write_zygote_maps`], parent side; [`enter_user_namespace`], zygote side): the zygote's
//! root is an unprivileged host id, never host uid 0. Each sandbox is cloned into a user
//! namespace of its own, whose maps the zygote writes ([`write_sandbox_maps`]; the init waits
//! for them in [`await_sandbox_maps`] and becomes its root in [`become_sandbox_root`]), so
//! RLIMIT_NPROC counts each sandbox's processes alone. As host root, the sandboxes' root is
//! another host id than the zygote's ([`sandbox_id`]): the kernel keeps some counts per host
//! user for the whole machine (epoll watches, pipe buffers, descriptors in flight), and a job
//! that fills them must not stop the zygote from building and watching the next sandboxes.
//! Rootless, the invoking user is the only id there is, and both are it.

use std::os::fd::{AsFd, OwnedFd};

use nix::sched::CloneFlags;
use nix::unistd::{Gid, Pid, Uid};

use crate::sandbox::isolate::setup_error::SetupError;

use super::wire::{self, FromZygote, ToInit, ToZygote};

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
    #[error("host id {0} leaves no id above it for the sandboxes' root")]
    NoSandboxId(u32),
}

/// The id, in the zygote's user namespace, that each sandbox's root maps to: 1 (host id
/// `root_mapped_id + 1`) as host root, 0 (the invoking user) rootless.
pub(crate) fn sandbox_id() -> u32 {
    u32::from(Uid::current().is_root())
}

/// Engine side: writes the zygote's maps; returns how identity is enforced. Host uid 0 is
/// never mapped: as root, the zygote's root is the unprivileged `root_mapped_id` and the
/// sandboxes' root the id after it; as an ordinary user, both are that user.
pub(crate) fn write_zygote_maps(pid: u32, root_mapped_id: u32) -> Result<String, IdentityError> {
    let write = |file: &str, content: &str| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, content).map_err(|source| IdentityError::IdMap { path, source })
    };
    if Uid::current().is_root() {
        if root_mapped_id == 0 {
            return Err(IdentityError::HostRootMapped);
        }
        // uid 4294967295 is (uid_t)-1, which no map may name.
        let sandboxes = root_mapped_id
            .checked_add(1)
            .filter(|&id| id != u32::MAX)
            .ok_or(IdentityError::NoSandboxId(root_mapped_id))?;
        let map = format!("0 {root_mapped_id} 1\n{} {sandboxes} 1\n", sandbox_id());
        write("uid_map", &map)?;
        write("gid_map", &map)?;
        Ok(format!(
            "host root: sandbox root is host uid/gid {sandboxes} (the zygote {root_mapped_id})"
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
/// lets it go on. Its root is `sandbox_id` of the zygote's namespace ([`sandbox_id`]), an
/// unprivileged host id; a user namespace per sandbox makes RLIMIT_NPROC count its processes
/// alone.
pub(super) fn write_sandbox_maps(
    pid: Pid,
    sock: &OwnedFd,
    sandbox_id: u32,
) -> Result<(), SetupError> {
    let map = format!("0 {sandbox_id} 1");
    // setgroups before gid_map: the kernel takes `deny` only while no gid map is written.
    let maps = [
        ("setgroups", "deny"),
        ("uid_map", map.as_str()),
        ("gid_map", map.as_str()),
    ];
    for (file, content) in maps {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, content).map_err(|e| SetupError::io("write", &e).at(path))?;
    }
    wire::send(sock.as_fd(), &ToInit::MapsWritten, &[])
        .map_err(|e| SetupError::errno("signal sandbox", e))
}

/// Init side, once the maps are written: becomes the namespace's root. The init starts with
/// the zygote's ids, which are not mapped in its namespace when the sandboxes have an id of
/// their own; when they are (rootless), nothing changes. A change of ids clears the
/// parent-death signal and the dumpable flag: both are set again here.
pub(super) fn become_sandbox_root() -> Result<(), SetupError> {
    nix::unistd::setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0))
        .map_err(|e| SetupError::errno("setresgid 0 in the sandbox", e))?;
    nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0))
        .map_err(|e| SetupError::errno("setresuid 0 in the sandbox", e))?;
    // The zygote is our parent: if it dies, so do we (and with us the whole sandbox).
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| SetupError::errno("set pdeathsig", e))?;
    // Without the dumpable flag the zygote could not read the sandbox's `/proc` entries.
    nix::sys::prctl::set_dumpable(true).map_err(|e| SetupError::errno("set dumpable", e))
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
