"""A sandbox backend for an agent harness, over the agentfs command line.

One agentfs project per sandbox. Each method runs one or two agentfs commands with --json and
reads JSON back; a failure raises the AgentfsError subclass of its error code, so a harness
branches on exception types (or on .code and .detail), never on message text.

    backend = AgentfsBackend()
    backend.create("task-1", "/src/repo")
    backend.run_check("task-1", ["make", "test"])
    backend.list_changes("task-1")          # ["src/main.c", ...]
    backend.collect_diff("task-1")          # what `git diff --full-index --binary` prints
    backend.promote("task-1", ["src/main.c"])
    backend.discard("task-1")

Python 3.8 or newer, standard library only.
"""

import json
import subprocess


class AgentfsError(Exception):
    """A failed agentfs command: its error object and exit status."""

    def __init__(self, error, status):
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")
        self.detail = error.get("detail")
        self.message = error.get("message")
        self.path = error.get("path")
        self.status = status


class InvalidInput(AgentfsError):
    """Exit status 2: a wrong argument, a missing project, a bad config or policy."""


class NotFound(InvalidInput):
    """not_found: no such project, snapshot, path or mount."""


class Unsupported(AgentfsError):
    """Exit status 3: this system cannot do it (no FUSE, no user namespaces, ...)."""


class Conflict(AgentfsError):
    """Exit status 4: the request conflicts with the present state."""


class UnappliedChanges(Conflict):
    """unapplied_changes: discard refused; the sandbox has changes never promoted."""


class ApplyConflict(Conflict):
    """apply_conflict: the real tree changed under the sandbox since it saw it."""


class Busy(Conflict):
    """busy: a mount is held, or a sandbox did not stop."""


class CapacityExhausted(AgentfsError):
    """capacity_exhausted: out of space."""


class EscapeAttempt(AgentfsError):
    """escape_attempt: a write outside the sandbox's writable set."""


class SandboxRefused(AgentfsError):
    """Exit status 125: the sandbox did not start; nothing ran."""


BY_CODE = {
    "not_found": NotFound,
    "unapplied_changes": UnappliedChanges,
    "apply_conflict": ApplyConflict,
    "busy": Busy,
    "capacity_exhausted": CapacityExhausted,
    "escape_attempt": EscapeAttempt,
}
BY_STATUS = {2: InvalidInput, 3: Unsupported, 4: Conflict, 125: SandboxRefused}


class CheckResult:
    """What a command run in the sandbox did."""

    def __init__(self, status, stdout, stderr):
        self.status = status
        self.stdout = stdout
        self.stderr = stderr

    @property
    def ok(self):
        return self.status == 0


class AgentfsBackend:
    """The backend interface: create, path, status, collect_diff, list_changes, run_check,
    promote, discard. Sandbox ids are agentfs project names ([A-Za-z0-9][A-Za-z0-9._-]*)."""

    backend = "agentfs"

    def __init__(self, agentfs="agentfs", env=None):
        self.agentfs = agentfs
        self.env = env

    def _run(self, *args, text=True):
        # From /, so no file in the working directory can make a project name ambiguous.
        done = subprocess.run(
            [self.agentfs, "--json", *args],
            capture_output=True,
            text=text,
            cwd="/",
            env=self.env,
            check=False,
        )
        if done.returncode != 0:
            raise self._error(done)
        return done

    @staticmethod
    def _error(done):
        err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode("utf-8", "replace")
        lines = err.strip().splitlines()
        try:
            error = json.loads(lines[-1])["error"]
        except (IndexError, ValueError, KeyError, TypeError):
            error = {"code": "other", "message": err.strip()}
        cls = BY_CODE.get(error.get("code")) or BY_STATUS.get(done.returncode, AgentfsError)
        return cls(error, done.returncode)

    def _project(self, sandbox_id):
        out = self._run("status", sandbox_id, "--json").stdout
        return json.loads(out)["projects"][0]

    def create(self, sandbox_id, base_dir, options=None):
        """A new sandbox over the directory base_dir (its snapshot is the lower layer)."""
        self._run("init", sandbox_id, "--source", str(base_dir))
        return self.status(sandbox_id)

    def path(self, sandbox_id):
        """Where commands of the sandbox see its tree: the base directory's own path."""
        return self._project(sandbox_id)["source"]

    def status(self, sandbox_id):
        """{"id", "status", "changes", "live", "capacity_exhausted_since"}; status is running
        (a sandbox runs), dirty (changes not promoted, or a write was refused for space) or
        created. verified and promoted are the harness's to record."""
        p = self._project(sandbox_id)
        unapplied = p["position"].get("unapplied_changes")
        full = p.get("capacity_exhausted_since")
        if p["live"]:
            state = "running"
        elif unapplied or full is not None:
            state = "dirty"
        else:
            state = "created"
        return {
            "id": sandbox_id,
            "backend": self.backend,
            "status": state,
            "changes": self.list_changes(sandbox_id),
            "live": p["live"],
            "capacity_exhausted_since": full,
        }

    def changes(self, sandbox_id):
        """Every change as agentfs describes it (path, change, kind, modes, hashes)."""
        return json.loads(self._run("diff", sandbox_id, "--json").stdout)

    def list_changes(self, sandbox_id):
        """The changed paths, relative and forward-slashed."""
        return [c["path"].lstrip("/") for c in self.changes(sandbox_id)]

    def collect_diff(self, sandbox_id, out_path=None):
        """The changes as the patch `git diff --full-index --binary` prints; also written to
        out_path when given."""
        patch = self._run("diff", sandbox_id, "--patch", "--binary", text=False).stdout
        if out_path is not None:
            with open(out_path, "wb") as f:
                f.write(patch)
        return patch

    def run_check(self, sandbox_id, command, timeout=None):
        """Run command (a list) in the sandbox; its status and output. A sandbox that does
        not start raises SandboxRefused (or the error of its code)."""
        done = subprocess.run(
            [self.agentfs, "--json", "exec", sandbox_id, "--", *command],
            capture_output=True,
            text=True,
            cwd="/",
            env=self.env,
            timeout=timeout,
            check=False,
        )
        if done.returncode == 125:
            raise self._error(done)
        return CheckResult(done.returncode, done.stdout, done.stderr)

    def promote(self, sandbox_id, selected_changes=None):
        """Snapshot the sandbox, then write the selected paths (all with None) of that
        snapshot into the base directory; checks still running keep writing the live delta,
        which is not read. Returns the snapshot's commit."""
        snap = json.loads(self._run("snap", sandbox_id, "--json").stdout)
        args = ["apply", sandbox_id, "--from", snap["commit"]]
        for p in selected_changes or []:
            args += ["--path", p]
        self._run(*args)
        return snap["commit"]

    def discard(self, sandbox_id, force=False):
        """Stop the sandbox, unmount, remove it. Raises UnappliedChanges while it holds
        changes never promoted, unless force."""
        args = ["discard", sandbox_id] + (["--force"] if force else [])
        return json.loads(self._run(*args).stdout)
