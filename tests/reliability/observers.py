"""Observers of the writes a failure path causes; the reliability summary adds up what they saw.

A case names its observers (the gpusim node's write log, the API server's mutating requests, a
build-host runner's commands, the file trees below the roots it handed the code under test) and
gets back exactly what each saw; the count in the summary is that, not a number the case chose.
A case that observes nothing must say why (`@pytest.mark.no_failure_path(reason)`), or it fails.
"""

from __future__ import annotations

import hashlib
import os

from ansible_collections.accelops.vgpu.tests.fakes.driver_tools import changing_calls


def tree(path):
    """{relative path: what it is} of everything at and below `path` (a file, a directory or nothing):
    a directory, a symlink's target, or a file's size and content hash."""
    path = str(path)
    found = {}

    def describe(full):
        if os.path.islink(full):
            return "link -> " + os.readlink(full)
        if os.path.isdir(full):
            return "dir"
        with open(full, "rb") as handle:
            content = handle.read()
        return "file %d %s" % (len(content), hashlib.sha256(content).hexdigest()[:12])

    if not os.path.lexists(path):
        return found
    found["."] = describe(path)
    if os.path.isdir(path) and not os.path.islink(path):
        for directory, dirs, names in os.walk(path):
            for name in dirs + names:
                full = os.path.join(directory, name)
                found[os.path.relpath(full, path)] = describe(full)
    return found


class Tree:
    """The file tree at `path` when observed, and how it changed since."""

    def __init__(self, path):
        self.path = str(path)
        self.before = tree(path)

    def changes(self):
        """["created X" / "removed X" / "changed X"] since the snapshot."""
        after = tree(self.path)
        out = []
        for rel in sorted(set(self.before) | set(after)):
            where = os.path.normpath(os.path.join(self.path, rel))
            if rel not in self.before:
                out.append("created " + where)
            elif rel not in after:
                out.append("removed " + where)
            elif self.before[rel] != after[rel]:
                out.append("changed " + where)
        return out


class FailureWrites:
    """One case's observers (the `failure_writes` fixture); each call records what it saw."""

    def __init__(self, tally, nodeid):
        self.tally, self.nodeid = tally, nodeid
        self.observed = False
        self.trees = []

    def __call__(self, *args):
        raise TypeError("failure_writes(count, what) is gone: let an observer count (failure_writes.gpusim(node), "
                        ".api(server), .commands(runner), .node_calls(dir), .files(path)), see observers.py")

    def _record(self, seen, what):
        self.observed = True
        self.tally.record_writes(self.nodeid, len(seen), "%s: %s" % (what, seen[:4]))
        return seen

    def gpusim(self, node, keep=None, what="gpusim write log"):
        """The simulated kernel's write attempts (ok or refused) since its log was cleared; `keep`
        narrows them to what the failure path must not touch."""
        return self._record([e for e in node.log() if keep is None or keep(e)], what)

    def api(self, server):
        """The API server double's mutating requests since its log was cleared."""
        return self._record(server.writes(), "mutating API requests")

    def commands(self, runner):
        """The mutating commands a build-host runner recorded instead of running."""
        return self._record(list(runner.mutations), "commands")

    def node_calls(self, fake_node_dir):
        """The changing commands (modprobe, systemctl start/stop, installers) a fake node's tools
        logged (tests/fakes/driver_tools.py)."""
        return self._record(changing_calls(fake_node_dir), "node commands")

    def files(self, *paths):
        """Snapshot the trees at `paths` now; what changes below them is counted when the case ends
        (or at `changed()`)."""
        for path in paths:
            self.trees.append(Tree(path))
        self.observed = True

    def changed(self):
        """What changed below the observed trees so far (recorded once, here or at the end)."""
        seen = [change for watched in self.trees for change in watched.changes()]
        self.trees = []
        return self._record(seen, "files")

    def finish(self):
        if self.trees:
            self.changed()
