"""The per-attempt secrets dir of both engines: where the values of the secrets a job names
(corral.engine.base.SecretGrant) are written for the attempt's life, and removed after.

    <root>/files/<file>   the job's file secrets: dir 0500, files 0400, owned by the job's uid;
                          bound read-only at /run/secrets inside the sandbox
    <root>/env/<VAR>      one file per environment secret, 0400, owned by whoever puts it into
                          the instance's environment (local: root's supervisor; Slurm: the
                          job's own account in its rank script)

<root> itself is 0500 and lies inside a directory only root (local: the attempt dir under the
server's 0700 home) or only the job's account (Slurm: its 0700 job dir) may enter. The values are
never in a spec file, a script, a command line or an sbatch environment.

Import-free (only `os`): the local supervisor, which must start lean, removes the dir with it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported (see supervisor.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from corral.engine.base import SecretGrant

SANDBOX_SECRETS_DIR = "/run/secrets"
SECRETS_DIR_ENV = "CORRAL_SECRETS_DIR"  # where the job finds its file secrets


def _write(path: str, value: bytes, uid: int, gid: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
    try:
        os.fchmod(fd, 0o400)  # whatever the umask
        os.write(fd, value)
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def write_secrets(
    root: str,
    grants: Iterable[SecretGrant],
    files_owner: tuple[int, int],
    env_owner: tuple[int, int],
) -> tuple[str | None, dict[str, str]]:
    """Writes the grants under `root` (which must not exist); returns (the files dir or None
    when no grant is a file, {env var: the file holding its value})."""
    grants = list(grants)
    os.mkdir(root, 0o700)
    files_dir: str | None = None
    env_files: dict[str, str] = {}
    for grant in grants:
        if grant.file is not None:
            if files_dir is None:
                files_dir = os.path.join(root, "files")
                os.mkdir(files_dir, 0o700)
            _write(os.path.join(files_dir, grant.file), grant.value, *files_owner)
        if grant.env is not None:
            env_dir = os.path.join(root, "env")
            if not env_files:
                os.mkdir(env_dir, 0o700)
            env_files[grant.env] = os.path.join(env_dir, grant.env)
            _write(env_files[grant.env], grant.value, *env_owner)
    if files_dir is not None:
        os.chown(files_dir, *files_owner)
        os.chmod(files_dir, 0o500)
    if env_files:
        os.chown(os.path.join(root, "env"), *env_owner)
        os.chmod(os.path.join(root, "env"), 0o500)
    os.chmod(root, 0o500)
    return files_dir, env_files


def read_env_secrets(env_files: dict[str, str]) -> dict[str, str]:
    """{var: value} for an instance's environment (surrogateescape: execve gets the exact bytes)."""
    values: dict[str, str] = {}
    for var, path in env_files.items():
        with open(path, "rb") as f:
            values[var] = f.read().decode("utf-8", "surrogateescape")
    return values


def remove_secrets(root: str) -> None:
    """Deletes the dir written by write_secrets, if there (as root: the dirs are 0500). Never
    follows a symlink: on Slurm the job's account owns the dirs and could have replaced one to
    make the root server delete elsewhere."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError:
        _ignore(os.unlink, root)  # a symlink (or a file) in its place
        return
    try:
        for sub in ("files", "env"):
            try:
                sub_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                _ignore(os.unlink, sub, fd)
                continue
            try:
                for name in os.listdir(sub_fd):
                    _ignore(os.unlink, name, sub_fd)
            finally:
                os.close(sub_fd)
            _ignore(os.rmdir, sub, fd)
    finally:
        os.close(fd)
    _ignore(os.rmdir, root)


def _ignore(remove: Callable[..., None], path: str, dir_fd: int | None = None) -> None:
    try:
        remove(path, dir_fd=dir_fd)
    except OSError:
        pass
