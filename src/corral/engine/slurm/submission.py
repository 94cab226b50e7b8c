"""How the Slurm engine hands an attempt to Slurm (engine.py `launch`): the checks that refuse it
(the job's Unix account, the state dir and storage root being passable by it, mounts), its
storage dirs, scripts and log links, and the `sbatch` of its batch job, idempotent by the record
saved first and the job's name; and `check_storage`, which asks every node whether it sees the
storage root. Following the job once submitted (poll, stop, logs) is engine.py's.

`Submission` is the engine's mixin: the fields and methods of `SlurmEngine` it uses are declared
on it.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from corral.engine.base import (
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    EngineUnavailable,
    FailureReason,
    NodeReport,
)
from corral.engine.log_links import link_attempt_logs
from corral.engine.slurm import scripts
from corral.engine.slurm.cli import SlurmCli, SlurmJob
from corral.engine.slurm.state import AttemptRecord, StateStore
from corral.engine.slurm.users import UnixAccount, UnmappedUser, UserMap, closed_group_dirs, unix_group_fix
from corral.scheduler.types import NodeState
from corral.storage.layout import MARKER, prepare_dirs, through_symlink

log = logging.getLogger("corral.engine.slurm.engine")  # the engine's, as before this module

REJECTED_REF = "rejected"  # launch() ref of an attempt Slurm refused (its status says why)


# How long a state dir or storage root found passable by the job accounts is taken to stay so
# (launch checks both, walking every parent with stat(), for each attempt); one found blocked is
# checked again at every launch, so an admin's fix shows at once.
PASSABLE_CACHE_S = 60.0


class Submission:
    """SlurmEngine's submission side; the engine's fields and methods it uses are declared here."""

    store: StateStore
    storage_root: Path | None
    user_map: UserMap
    sandbox: scripts.NodeSandbox
    cli: SlurmCli
    partition: str | None
    _passable_until: dict[str, float]
    _warned_groups: set[tuple[str, int | None]]

    if TYPE_CHECKING:  # SlurmEngine's

        def nodes(self) -> Sequence[NodeReport]: ...

        def _attempt_lock(self, attempt_id: str) -> threading.RLock: ...

        def _note_launched(self, aid: str, slurm_job_id: str) -> None: ...

        def _squeue(self, users: set[str] | None, *filters: str, comment: bool = False) -> list[SlurmJob]: ...

    # ---- storage ------------------------------------------------------------------------------
    def check_storage(self) -> list[str]:
        """Does every node see this storage root? One `srun` task per ready node reads the root's
        marker (a random id the server wrote); a node that reads another id, or none, does not
        share the root, and jobs there would write their homes and outputs to the wrong disk.
        Also: the root's parents must be passable by the job accounts (bwrap runs as them)."""
        root = self.storage_root
        if root is None:
            return []
        unreachable = self._storage_unreachable()
        problems = [unreachable] if unreachable else []
        expected = (root / MARKER).read_text().strip()
        ready = [n.name for n in self.nodes() if n.state is NodeState.READY]
        if not ready:
            return [*problems, "storage root: no ready Slurm node to check it on"]
        args = [f"--nodelist={','.join(ready)}", f"--nodes={len(ready)}", "--ntasks-per-node=1"]
        if self.partition:
            args.append(f"--partition={self.partition}")
        script = f'echo "$SLURMD_NODENAME $(cat {shlex.quote(str(root / MARKER))} 2>&1)"'
        result = self.cli.run("srun", "--immediate=10", "--time=1", *args, "/bin/sh", "-c", script)
        if result.returncode != 0:
            return [*problems, f"storage root: could not check it on the nodes: {result.message}"]
        seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
        for node in ready:
            if seen.get(node, "").strip() != expected:
                problems.append(
                    f"storage root {root} is not shared with node {node} "
                    f"(it reads {seen.get(node, 'nothing')!r} at {root / MARKER}): mount it there"
                )
        return problems

    def _passable_lately(self, what: str) -> bool:
        return time.monotonic() < self._passable_until.get(what, 0.0)

    def _found_passable(self, what: str) -> None:
        self._passable_until[what] = time.monotonic() + PASSABLE_CACHE_S

    def _storage_unreachable(self, cached: bool = False) -> str | None:
        """Why the job accounts cannot reach the storage root (bwrap binds it as them), or None.
        `cached`: a root found passable in the last PASSABLE_CACHE_S is not walked again."""
        root = self.storage_root
        if root is None or (cached and self._passable_lately("storage")):
            return None
        blocked = next((p for p in [root, *root.parents] if not os.stat(p).st_mode & 0o001), None)
        if blocked is None:
            self._found_passable("storage")
            return None
        return (
            f"cannot bind the job's storage: CORRAL_STORAGE_ROOT {root} lies below {blocked}, which "
            "job accounts cannot pass (no o+x); put the storage root on shared storage outside CORRAL_HOME"
        )

    def log_storage_check(self) -> None:
        """At start-up (in a thread: srun waits for the nodes): say clearly what is wrong."""
        try:
            problems = self.check_storage()
        except (OSError, EngineUnavailable) as exc:
            problems = [f"storage root: could not check it on the nodes: {exc}"]
        for problem in problems:
            log.error("slurm engine: %s", problem)
        if not problems:
            log.info("slurm engine: every ready node sees the storage root %s", self.storage_root)

    # ---- launch -------------------------------------------------------------------------------
    def launch(self, attempt: AttemptLaunch) -> str:
        instances = scripts.validate(attempt)
        aid = attempt.attempt_id
        with self._attempt_lock(aid):
            record = self.store.load(aid)
            if record is not None and (record.slurm_job_id or record.final is not None):
                return record.ref or REJECTED_REF
            if record is not None:  # submitted before, answer lost (crash or Slurm unreachable)
                found = self._find_job_by_name(aid, record.unix_user)
                if found:
                    record.slurm_job_id = found
                    self.store.save(record)
                    return found
            record = AttemptRecord(
                aid, submitted_at=time.time(), n_ranks=len(instances), max_runtime_s=attempt.max_runtime_s
            )
            try:
                account = self._account_for(attempt.user)
            except UnmappedUser as exc:  # refused before anything is written or submitted
                return self._reject(record, str(exc))
            record.unix_user, record.uid = account.name, account.uid
            if attempt.refused:
                return self._reject(record, attempt.refused)
            blocked = self._storage_unreachable(cached=True) if attempt.storage_dirs else None
            if blocked is not None:
                return self._reject(record, blocked)
            linked = next((m for m in attempt.mounts if through_symlink(m.source)), None)
            if linked is not None:
                return self._reject(
                    record, f"mount {linked.source} -> {linked.target} goes through a symlink"
                )
            try:  # home, group and outputs dirs on the shared storage root, owned by the account
                prepare_dirs(attempt.storage_dirs, account.uid, account.gid)
            except (OSError, ValueError) as exc:
                return self._reject(record, f"cannot prepare the job's storage: {exc}")
            dir_checks = self._group_dir_checks(account, attempt)
            attempt_dir = self.store.attempt_dir(aid)
            job_dir = self.store.job_dir(aid)
            # before the new scripts: a lost earlier sbatch of this attempt turning up from now on
            # runs nothing (scripts.SUBMISSION_FILE)
            token = self.store.new_submission(aid)
            scripts.write_scripts(attempt_dir, job_dir, attempt, instances, account, self.sandbox, dir_checks)
            if attempt.log_dir:  # the ranks' logs, for the account to write, also at /logs
                link_attempt_logs(
                    Path(attempt.log_dir),
                    attempt.attempt,
                    [i.rank for i in instances],
                    job_dir,
                    uid=account.uid,
                    gid=account.gid,
                    writer=account.uid,
                    attempt_id=aid,
                )
            self.store.save(record)  # before sbatch: a crash in between is found again by job name
            args = scripts.sbatch_args(attempt, instances, job_dir, self.partition, account, token)
            result = self.cli.run("sbatch", *args, env=self.cli.submit_env(scripts.DEFAULT_PATH))
            if result.returncode != 0:
                return self._reject(record, f"Slurm rejected the job: {result.message}")
            record.slurm_job_id = result.stdout.strip().split(";")[0]
            self.store.save(record)
            self._note_launched(aid, record.slurm_job_id)
            return record.slurm_job_id

    def _group_dir_checks(self, account: UnixAccount, attempt: AttemptLaunch) -> list[tuple[str, str]]:
        """(dir, line) for each group dir this job binds (root-owned, of a Corral group's gid):
        its rank scripts print the line to the job's log when the dir is closed to the account
        on its node, where the job otherwise met only "Permission denied". Slurm gives a job its
        account's own Unix groups, not the gids Corral gave its groups; a gid this host's
        groups lack is also said in the server log, once per account and gid."""
        targets = {m.source: m.target for m in attempt.mounts}  # where the job sees the dir
        closed = {d.gid for d in closed_group_dirs(account, attempt.storage_dirs)}
        checks: dict[str, str] = {}
        for d in attempt.storage_dirs:
            if d.owner != "root" or d.gid is None or d.path in checks:
                continue
            where = targets.get(d.path, d.path)
            if d.gid not in closed:  # open as this host sees it: the node differs, groups or storage
                checks[d.path] = (
                    f"corral: {where} is closed to this job on this node (Permission denied), though on "
                    f"the Corral server's host its account {account.name} is in gid {d.gid}, which owns "
                    "it: this node's Unix groups differ from the host's, or its storage shows the dir "
                    "with another owner, gid or mode (e.g. NFS root_squash or idmap)"
                )
                continue
            self._warn_closed_group(account, d.gid, d.path, where)
            missing, fix = unix_group_fix(Path(d.path).name, d.gid, [account.name])
            if fix is None:  # the host's own group: no command (`corral doctor` says what to do)
                why = f"{missing} (`corral doctor` lists all)"
            else:
                why = f"{missing}; an admin gives it on every node: {fix} (`corral doctor` lists all)"
            checks[d.path] = (
                f"corral: {where} is closed to this job (Permission denied): its account {account.name} is "
                f"not in gid {d.gid}, which owns it; {why}"
            )
        return list(checks.items())

    def _warn_closed_group(self, account: UnixAccount, gid: int, path: str, where: str) -> None:
        if (account.name, gid) in self._warned_groups:
            return
        self._warned_groups.add((account.name, gid))
        log.warning(
            "slurm engine: account %s is not in gid %s, which owns %s (%s in its jobs): its jobs "
            "get 'Permission denied' there; give gid %s to a Unix group of the group members' "
            "accounts on every node (docs/storage.md, Identities; `corral storage ids` lists the gids)",
            account.name, gid, path, where, gid,
        )  # fmt: skip

    def _account_for(self, corral_user: str) -> UnixAccount:
        """The job's Unix account, or UnmappedUser saying why the job may not run at all."""
        account = self.user_map.account(corral_user)
        if os.geteuid() != 0:
            raise UnmappedUser(
                f"cannot run the job of Corral user {corral_user!r} as Unix account {account.name!r}: the "
                "Slurm engine must run as root (sbatch --uid, and handing the job its own directory)"
            )
        if self._passable_lately("state"):
            return account
        blocked = self.store.unreachable_parent()
        if blocked is None:
            self._found_passable("state")
        else:
            raise UnmappedUser(
                f"cannot run the job of Corral user {corral_user!r} as {account.name!r}: its files live "
                f"under {self.store.root} (CORRAL_SLURM_STATE_DIR), but {blocked} is not passable by other "
                "accounts (no o+x); put the state dir on shared storage outside CORRAL_HOME"
            )
        return account

    def _reject(self, record: AttemptRecord, message: str) -> str:
        record.set_final(
            AttemptStatus(
                record.attempt_id,
                AttemptPhase.FAILED,
                reason=FailureReason.LAUNCH_FAILED,
                message=message,
                finished_at=time.time(),
            )
        )
        self.store.save(record)
        return REJECTED_REF

    def _find_job_by_name(self, attempt_id: str, unix_user: str) -> str:
        """The attempt's current submission in Slurm ("" if none): the job of its name whose
        comment carries the current token (an older submission is superseded and runs nothing)."""
        name = scripts.job_name(attempt_id)
        token = self.store.submission(attempt_id)
        jobs = self._squeue({unix_user} if unix_user else None, f"--name={name}", comment=bool(token))
        mine = f"submission={token}"
        ids = [int(j["job_id"]) for j in jobs if j.get("name") == name and mine in j.get("comment", mine)]
        return str(max(ids)) if ids else ""
